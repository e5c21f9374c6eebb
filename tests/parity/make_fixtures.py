#!/usr/bin/env python3
"""Parity fixtures for the Rust model (stages/coa-model), made with HF transformers on PyTorch CPU.

Runs on demand, not in CI; its outputs under tests/parity/fixtures/ are committed.

    python3 tests/parity/make_fixtures.py                 # (re)write every fixture
    python3 tests/parity/make_fixtures.py --check-load D  # load a checkpoint WE wrote in HF

Each fixture directory <case>/ holds:
  config.json, model.safetensors   the random model, saved by HF save_pretrained (f32)
  inputs.json                      input_ids, loss_mask, segment_ids (or null), loss,
                                   and the library versions used
  expected.safetensors             "logits" [T,V] and "grad.<param name>" for every parameter

The loss is HF's causal-LM loss: labels = input_ids with -100 where loss_mask is 0 (HF shifts
them: token t is predicted from position t-1), mean over the unmasked targets.
Sliding-window cases (qwen3_sliding, mistral_window, qwen2_sliding) use windows shorter than
the sequence, so HF's own sliding-window mask decides which keys each query sees.
A packed case ("llama_packed") expresses packing in HF with a 4D block-diagonal causal mask and
position ids that restart at each segment; the first token of each segment gets label -100.

Needs: torch, transformers, safetensors (a scratch venv outside the repo is fine).
"""
import argparse
import json
import os
import sys

import torch
from safetensors.torch import load_file, save_file

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "fixtures")

CASES = {
    # llama, GQA (4 query heads over 2 kv heads), untied head
    "llama_gqa_untied": dict(
        model_type="llama", vocab_size=61, hidden_size=32, intermediate_size=48,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        tie_word_embeddings=False, rope_theta=10000.0, rms_norm_eps=1e-5, T=20, seed=1,
    ),
    # llama, plain multi-head attention, tied head, a large rope_theta
    "llama_tied": dict(
        model_type="llama", vocab_size=50, hidden_size=32, intermediate_size=40,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
        tie_word_embeddings=True, rope_theta=500000.0, rms_norm_eps=1e-6, T=17, seed=2,
    ),
    # qwen2: q/k/v bias, GQA 4 -> 1 kv head, untied
    "qwen2_bias_gqa": dict(
        model_type="qwen2", vocab_size=64, hidden_size=32, intermediate_size=56,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
        tie_word_embeddings=False, rope_theta=1000000.0, rms_norm_eps=1e-6, T=18, seed=3,
    ),
    # llama with attention_bias (q/k/v/o) and mlp_bias, explicit head_dim != hidden/heads, tied
    "llama_bias_headdim": dict(
        model_type="llama", vocab_size=40, hidden_size=24, intermediate_size=32,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
        attention_bias=True, mlp_bias=True,
        tie_word_embeddings=True, rope_theta=10000.0, rms_norm_eps=1e-5, T=16, seed=4,
    ),
    # Llama 3.x RoPE scaling (rope_type llama3): with head_dim 8 and original_max_position_embeddings
    # 64 the four frequencies fall in all three bands (kept, smoothed, divided by factor)
    "llama3_rope": dict(
        model_type="llama", vocab_size=53, hidden_size=32, intermediate_size=48,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        tie_word_embeddings=True, rms_norm_eps=1e-5, T=40, seed=6,
        rope_parameters=dict(rope_type="llama3", rope_theta=10000.0, factor=8.0, low_freq_factor=1.0,
                             high_freq_factor=4.0, original_max_position_embeddings=64),
    ),
    # packed row of three segments, llama GQA untied
    "llama_packed": dict(
        model_type="llama", vocab_size=61, hidden_size=32, intermediate_size=48,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        tie_word_embeddings=False, rope_theta=10000.0, rms_norm_eps=1e-5, T=22, seed=5,
        segments=[7, 9, 6],
    ),
    # qwen3: per-head q/k RMSNorm, GQA 4 -> 2, head_dim 12 != 32/4, untied, attention_bias (q/k/v/o)
    "qwen3_qknorm": dict(
        model_type="qwen3", vocab_size=59, hidden_size=32, intermediate_size=48,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=12,
        attention_bias=True, tie_word_embeddings=False, rope_theta=1000000.0, rms_norm_eps=1e-6,
        T=21, seed=7,
    ),
    # qwen3 with a sliding window of 5 < T on the layers from max_window_layers = 1 (layers 1, 2)
    "qwen3_sliding": dict(
        model_type="qwen3", vocab_size=47, hidden_size=32, intermediate_size=40,
        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
        use_sliding_window=True, sliding_window=5, max_window_layers=1,
        tie_word_embeddings=True, rope_theta=10000.0, rms_norm_eps=1e-5, T=20, seed=8,
    ),
    # mistral: a sliding window of 6 < T on every layer, GQA, untied
    "mistral_window": dict(
        model_type="mistral", vocab_size=57, hidden_size=32, intermediate_size=48,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        sliding_window=6, tie_word_embeddings=False, rope_theta=10000.0, rms_norm_eps=1e-5,
        T=19, seed=9,
    ),
    # qwen2 with use_sliding_window, a window of 4 < T on the layers layer_types marks
    "qwen2_sliding": dict(
        model_type="qwen2", vocab_size=52, hidden_size=32, intermediate_size=40,
        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=1,
        use_sliding_window=True, sliding_window=4, max_window_layers=3,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        tie_word_embeddings=False, rope_theta=1000000.0, rms_norm_eps=1e-6, T=17, seed=10,
    ),
}


def versions():
    import transformers
    import safetensors
    return {"torch": torch.__version__, "transformers": transformers.__version__,
            "safetensors": safetensors.__version__, "python": sys.version.split()[0]}


def randomize_parameters(model):
    """Random values everywhere (HF init puts biases at 0 and norms at 1, which would leave those
    code paths untested): weights ~ N(0, 0.15), embeddings ~ N(0, 0.5), norms ~ 1 + N(0, 0.1),
    biases ~ N(0, 0.1). Draws from torch's global generator (seed it first)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif "embed_tokens" in name:
                p.copy_(0.5 * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn_like(p))
            else:
                p.copy_(0.15 * torch.randn_like(p))


def build(case):
    import transformers as tf
    c = dict(case)
    T = c.pop("T")
    seed = c.pop("seed")
    segments = c.pop("segments", None)
    mt = c.pop("model_type")
    common = dict(max_position_embeddings=128, initializer_range=0.02, bos_token_id=1, eos_token_id=2,
                  attn_implementation="eager")
    prefix = {"llama": "Llama", "qwen2": "Qwen2", "qwen3": "Qwen3", "mistral": "Mistral"}[mt]
    cfg = getattr(tf, prefix + "Config")(**c, **common)
    cls = getattr(tf, prefix + "ForCausalLM")
    torch.manual_seed(seed)
    model = cls(cfg).float().eval()
    randomize_parameters(model)
    V = cfg.vocab_size
    g = torch.Generator().manual_seed(seed + 100)
    ids = torch.randint(0, V, (T,), generator=g)
    mask = (torch.rand(T, generator=g) > 0.3).to(torch.int64)
    mask[0] = 0  # position 0 is never a target
    mask[T - 1] = 1
    return model, cfg, ids, mask, segments


def run_case(name, case, out_root):
    model, cfg, ids, mask, segments = build(case)
    T = ids.shape[0]
    labels = ids.clone()
    labels[mask == 0] = -100
    kwargs = {}
    seg_ids = None
    if segments is not None:
        assert sum(segments) == T
        seg_ids = []
        pos = []
        for s, n in enumerate(segments):
            seg_ids += [s] * n
            pos += list(range(n))
        seg = torch.tensor(seg_ids)
        allowed = (seg[:, None] == seg[None, :]) & (torch.arange(T)[:, None] >= torch.arange(T)[None, :])
        # 4D additive float mask [B, 1, T, T]: 0 where allowed, dtype-min elsewhere
        m4 = torch.zeros(1, 1, T, T)
        m4[0, 0][~allowed] = torch.finfo(torch.float32).min
        kwargs["attention_mask"] = m4
        kwargs["position_ids"] = torch.tensor([pos])
        start = 0
        for n in segments:  # a segment's first token is not predicted from the previous segment
            labels[start] = -100
            mask[start] = 0
            start += n
    model.zero_grad()
    out = model(input_ids=ids[None], labels=labels[None], **kwargs)
    out.loss.backward()
    d = os.path.join(out_root, name)
    os.makedirs(d, exist_ok=True)
    model.save_pretrained(d, safe_serialization=True)
    for extra in ("generation_config.json",):
        p = os.path.join(d, extra)
        if os.path.exists(p):
            os.remove(p)
    tensors = {"logits": out.logits[0].detach().contiguous().float()}
    for pname, p in model.named_parameters():
        tensors["grad." + pname] = p.grad.detach().contiguous().float()
    save_file(tensors, os.path.join(d, "expected.safetensors"))
    info = {
        "input_ids": ids.tolist(),
        "loss_mask": mask.tolist(),
        "segment_ids": seg_ids,
        "loss": float(out.loss.item()),
        "versions": versions(),
        "note": "loss = HF causal-LM loss with labels = input_ids, -100 where loss_mask == 0",
    }
    with open(os.path.join(d, "inputs.json"), "w") as f:
        json.dump(info, f, indent=1)
    size = sum(os.path.getsize(os.path.join(d, x)) for x in os.listdir(d))
    print(f"{name}: T={T} V={cfg.vocab_size} loss={out.loss.item():.6f} ({size} bytes)")


def check_load(d):
    """Load a checkpoint written by the Rust model in HF transformers, unchanged. If the directory
    holds parity_logits.safetensors ("input_ids" [T] stored as f32, "logits" [T,V]) written by the
    Rust side, compare our f32 logits with HF's logits computed in float64 from the same weights
    (the exact answer: HF's own f32 forward is itself ~5e-6 away from it on these models)."""
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(d).eval()  # as a user would, default dtype
    print(f"loaded {type(model).__name__} from {d}: "
          f"{sum(p.numel() for p in model.parameters())} parameters, dtype {model.dtype}")
    ref = os.path.join(d, "parity_logits.safetensors")
    if os.path.exists(ref):
        t = load_file(ref)
        ids = t["input_ids"].round().long()[None]
        m64 = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float64).eval()
        with torch.no_grad():
            logits = m64(input_ids=ids).logits[0]
            l32 = model.float()(input_ids=ids).logits[0].double()
        want = t["logits"].double()
        err = ((want - logits).abs().max() / logits.abs().max()).item()
        err32 = ((l32 - logits).abs().max() / logits.abs().max()).item()
        print(f"logits rel err vs HF float64 (max|ours - hf| / max|hf|) = {err:.3e} "
              f"(HF's own float32 forward: {err32:.3e})")
        tol = float(os.environ.get("PARITY_TOL", "1e-5"))
        if not err < tol:
            print(f"FAIL: above {tol}")
            sys.exit(1)
    print("OK")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check-load", metavar="DIR", nargs="+", help="load checkpoint dir(s) in HF transformers")
    ap.add_argument("--out", default=FIXTURES, help="fixture root (default: tests/parity/fixtures)")
    ap.add_argument("--case", action="append", help="only these cases")
    a = ap.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    if a.check_load:
        for d in a.check_load:
            check_load(d)
        return
    for name, case in CASES.items():
        if a.case and name not in a.case:
            continue
        run_case(name, case, a.out)


if __name__ == "__main__":
    main()
