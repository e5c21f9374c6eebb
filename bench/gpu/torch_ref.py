#!/usr/bin/env python3
"""PyTorch side of the GPU benchmark (runs on the GPU machine, whose python3 has torch).

One JSON object per line on stdout, the same shapes as kernels/examples/gpu_bench.rs:
  attention: torch.nn.functional.scaled_dot_product_attention, flash backend, causal, bf16,
             fwd and fwd+bwd, T 1024..8192, head dims 64 and 128, 16k tokens per call;
  xent:      torch.nn.functional.cross_entropy on bf16 logits, fwd+bwd;
  copy:      device-to-device copy of 1 GiB;
  trainstep: PyTorch bf16 training step of a ~125M-parameter Llama (HF transformers), eager and
             torch.compile, tokens/s and MFU -- the baselines for `coa-train-step --device cuda`.
Medians of CUDA-event-timed runs after warm-up; random inputs.
"""
import json
import os
import sys

import torch
import torch.nn.functional as F

ITERS = int(os.environ.get("COA_BENCH_ITERS", "20"))
dev = "cuda"


def timed(fn, iters=ITERS):
    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(iters):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b))
    out.sort()
    return out[len(out) // 2]


def emit(**kw):
    print(json.dumps(kw), flush=True)


def attention():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    for hd in (64, 128):
        for t in (1024, 2048, 4096, 8192):
            h = 2048 // hd
            b = 16384 // t
            q, k, v = (torch.randn(b, h, t, hd, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
            do = torch.randn(b, h, t, hd, device=dev, dtype=torch.bfloat16)
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                fwd = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True)

                def fb():
                    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                    torch.autograd.grad(o, (q, k, v), do)

                total_ms = timed(fb)
            fwd_flops = 4.0 * b * h * t * t * hd / 2
            emit(kind="attention", impl="torch_sdpa_flash", hd=hd, T=t, B=b, H=h, fwd_ms=fwd,
                 bwd_ms=total_ms - fwd, fwd_tflops=fwd_flops / fwd / 1e9,
                 fwdbwd_tflops=3.5 * fwd_flops / total_ms / 1e9)
            del q, k, v, do, o
            torch.cuda.empty_cache()


def xent():
    for n, v in ((8192, 32000), (4096, 151936)):
        x = (torch.randn(n, v, device=dev) * 2).to(torch.bfloat16).requires_grad_(True)
        tgt = torch.randint(0, v, (n,), device=dev)

        def fb():
            loss = F.cross_entropy(x, tgt)
            torch.autograd.grad(loss, (x,))

        ms = timed(fb)
        emit(kind="xent", impl="torch_cross_entropy", N=n, V=v, ms=ms, gbps=2.0 * n * v * 2 / ms / 1e6)
        del x
        torch.cuda.empty_cache()


def copy():
    n = 1 << 29
    src = torch.randn(n, device=dev).to(torch.bfloat16)
    dst = torch.empty_like(src)
    ms = timed(lambda: dst.copy_(src))
    emit(kind="copy", impl="torch", bytes=4 * n, ms=ms, gbps=4.0 * n / ms / 1e6)


def trainstep():
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except Exception as e:  # noqa: BLE001
        emit(kind="trainstep", impl="torch_eager", error=f"transformers unavailable: {e}")
        return
    # ~125M parameters: GPT-2-small-sized Llama (untied head, 32k vocab).
    cfg = LlamaConfig(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                      num_attention_heads=12, num_key_value_heads=12, max_position_embeddings=2048,
                      tie_word_embeddings=False)
    cfg._attn_implementation = "sdpa"
    model = LlamaForCausalLM(cfg).to(dev, dtype=torch.bfloat16)
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    b, t = 8, 1024
    ids = torch.randint(0, cfg.vocab_size, (b, t), device=dev)

    # MFU with 6*N*tokens + attention (12 * layers * T * d per token, causal halves it).
    flops_per_tok = 6 * params + 6 * cfg.num_hidden_layers * t * cfg.hidden_size

    def measure(impl, fwd):
        def step():
            out = fwd(input_ids=ids, labels=ids)
            out.loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        step()  # compiles, for torch.compile: kept out of the timing
        ms = timed(step, iters=max(5, ITERS // 2))
        tok_s = b * t / (ms / 1e3)
        emit(kind="trainstep", impl=impl, params=params, B=b, T=t, ms=ms, tokens_per_s=tok_s,
             tflops=flops_per_tok * tok_s / 1e12)

    measure("torch_eager", model)
    try:
        measure("torch_compile", torch.compile(model))
    except Exception as e:  # noqa: BLE001 -- a compiler failure is a result to report, not a crash
        emit(kind="trainstep", impl="torch_compile", error=f"{type(e).__name__}: {str(e)[:200]}")


if __name__ == "__main__":
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}", file=sys.stderr)
    for part in sys.argv[1:] or ["attention", "xent", "copy", "trainstep"]:
        globals()[part]()
