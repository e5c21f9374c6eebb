#!/usr/bin/env python3
"""CPU train-step throughput: `coa-train-step` against PyTorch (HF transformers
LlamaForCausalLM), side by side in one run.

Both sides train the same model (the same weights: our checkpoint is loaded by
`LlamaForCausalLM.from_pretrained`), fp32, on the same batch (B random sequences of T tokens;
the last `--target-frac` of each row's tokens are targets, the rest a prompt, as in an SFT row),
with AdamW (same betas, eps, weight decay), clipping to
norm 1.0, and the same number of threads (`--threads` for ours, `torch.set_num_threads` for
torch). The first step of each side is a warm-up and is not timed; a side's throughput is the
input tokens of one step divided by its median step time (whole optimizer steps: forward,
backward, clip, AdamW). Run it on an otherwise idle machine: OpenMP (torch) suffers much more
than rayon from other processes competing for the cores.

As a check that both sides do the same work, the loss of the first step (same weights, same
batch) is printed for both.

With `--bf16` each model also runs with bf16 products on both sides: ours with `--matmul bf16`
(both inputs of every linear layer's and the head's product rounded to bf16, f32 sums, on AMX tiles
where the CPU has them), PyTorch under `torch.autocast("cpu", dtype=torch.bfloat16)` (its CPU
autocast: the same products in bf16); the weights, gradients and optimizer stay f32 on both.

The machine's f32 matmul peak is measured in the same run: `torch.mm` and our `ops::gemm`
(`examples/gemm_bench`) on a large square product with the same threads; each side's share of
it is reported at the usual 6·N FLOP per input token (N = parameters).

usage: python bench/train_bench.py --bin target/release/coa-train-step \
           --gemm-bench target/release/examples/gemm_bench --threads 2 --out bench/results/train.md
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
import transformers
from transformers import LlamaForCausalLM


def tokens_table(path, batch, seq_len, vocab, seed, target_frac):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocab, size=(batch, seq_len), dtype=np.int32)
    mask = np.ones((batch, seq_len), dtype=np.uint8)
    # the row's prompt: no targets (the first token never is one)
    mask[:, :max(1, seq_len - round(target_frac * seq_len))] = 0
    table = pa.table({
        "task_id": pa.array([f"bench{i}" for i in range(batch)], pa.string()),
        "input_ids": pa.array([list(r) for r in ids], pa.list_(pa.int32())),
        "loss_mask": pa.array([list(r) for r in mask], pa.list_(pa.uint8())),
        "segment_ids": pa.array([None] * batch, pa.list_(pa.int32())),
        "n_tokens": pa.array([seq_len] * batch, pa.int32()),
        "n_targets": pa.array([int(m.sum()) for m in mask], pa.int32()),
    })
    pq.write_table(table, path)
    return ids, mask


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{p.stderr}")
    return p


def ours(args, work, tokens, init_dir, n_tokens, matmul="f32"):
    metrics = os.path.join(work, "metrics.parquet")
    cmd = [args.bin, "-i", tokens, "--init", init_dir, "--steps", str(args.steps + 1),
           "--batch-tokens", str(n_tokens), "--lr", str(args.lr), "--min-lr", str(args.lr),
           "--weight-decay", "0.01", "--grad-clip", "1.0", "--threads", str(args.threads),
           "--seed", "0", "-o", metrics] + (["--matmul", matmul] if matmul != "f32" else [])
    t0 = time.perf_counter()
    run(cmd)
    wall = time.perf_counter() - t0
    m = pq.read_table(metrics).to_pydict()
    # Timed steps: all but the first. Step time = input tokens / tokens_per_s of the step.
    secs = [n_tokens / tps for tps in m["tokens_per_s"][1:]]
    step_s = statistics.median(secs)
    return {"tokens_per_s": n_tokens / step_s, "first_loss": m["loss"][0], "step_s": step_s,
            "wall": wall, "cmd": " ".join(cmd)}


def reference(args, init_dir, ids, mask, autocast=False):
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = LlamaForCausalLM.from_pretrained(init_dir, torch_dtype=torch.float32, attn_implementation=args.attn)
    model.train()
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.999), eps=1e-8)
    x = torch.tensor(ids, dtype=torch.long)
    labels = x.clone()
    labels[torch.tensor(mask) == 0] = -100
    times, first_loss = [], None
    for step in range(args.steps + 1):
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = model(input_ids=x, labels=labels)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        dt = time.perf_counter() - t0
        if step == 0:
            first_loss = out.loss.item()
        else:
            times.append(dt)
    step_s = statistics.median(times)
    return {"tokens_per_s": ids.size / step_s, "first_loss": first_loss, "step_s": step_s}


def bench_model(args, model):
    """Both sides on one model; returns the result row and the model's description."""
    with tempfile.TemporaryDirectory() as work:
        tokens = os.path.join(work, "tokens.parquet")
        ids, mask = tokens_table(tokens, args.batch, args.seq_len, args.vocab if model in ("tiny", "small") else model_vocab(model),
                                 seed=0, target_frac=args.target_frac)
        n_tokens = args.batch * args.seq_len
        # The initial weights: a fresh model saved by coa-train-step (a 1-step run with lr ~ 0 on
        # the same data); both sides load this checkpoint.
        init_dir = os.path.join(work, "init")
        init_cmd = [args.bin, "-i", tokens, "--init-config", model, "--steps", "1", "--lr", "1e-30", "--min-lr", "0",
                    "--batch-tokens", str(n_tokens), "--save", init_dir, "-o", os.path.join(work, "m0.parquet")]
        if model in ("tiny", "small"):
            init_cmd += ["--vocab-size", str(args.vocab)]
        run(init_cmd)
        config = json.load(open(os.path.join(init_dir, "config.json")))
        r_ours = ours(args, work, tokens, init_dir, n_tokens)
        r_ref = reference(args, init_dir, ids, mask)
        bf16 = None
        if args.bf16:
            b_ours = ours(args, work, tokens, init_dir, n_tokens, matmul="bf16")
            b_ours["cmd"] = b_ours["cmd"].replace(work, "$TMP")
            bf16 = (b_ours, reference(args, init_dir, ids, mask, autocast=True))
        params = sum(p.numel() for p in LlamaForCausalLM.from_pretrained(init_dir).parameters())
        r_ours["cmd"] = r_ours["cmd"].replace(work, "$TMP")
    r_ours["params"] = r_ref["params"] = params
    shape = (f"hidden {config['hidden_size']}, {config['num_hidden_layers']} layers, "
             f"{config['num_attention_heads']} heads / {config['num_key_value_heads']} kv, "
             f"intermediate {config['intermediate_size']}, vocab {config['vocab_size']}, "
             f"{'tied' if config.get('tie_word_embeddings') else 'untied'} head, {params / 1e6:.1f}M parameters")
    return r_ours, r_ref, shape, bf16


def model_vocab(model):
    """The vocabulary size of a config.json model."""
    with open(model) as f:
        return json.load(f)["vocab_size"]


def model_name(model):
    return os.path.splitext(os.path.basename(model))[0] if model.endswith(".json") else model


def gemm_peak(args):
    """f32 matmul GFLOP/s of torch.mm and of our ops::gemm on an n×n×n product, same threads."""
    n = args.gemm_size
    torch.set_num_threads(args.threads)
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    best = min(timed(lambda: torch.mm(a, b)) for _ in range(5))
    out = run([args.gemm_bench, "--threads", str(args.threads), "--reps", "5", f"{n}x{n}x{n}"]).stdout
    return {"torch": 2 * n**3 / best / 1e9, "ours": json.loads(out.splitlines()[-1])["gflops"], "n": n}


def timed(f):
    t0 = time.perf_counter()
    f()
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True, help="the coa-train-step binary")
    ap.add_argument("--gemm-bench", help="the gemm_bench example (default: examples/gemm_bench beside --bin)")
    ap.add_argument("--gemm-size", type=int, default=2048, help="side of the square product of the peak measurement")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--models", default="tiny,small,bench/configs/smollm2-135m.json",
                    help="comma-separated --init-config presets or config.json files")
    ap.add_argument("--target-frac", type=float, default=0.55,
                    help="share of each row's tokens that are targets (a CoA math row: about 0.55)")
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=8, help="sequences per step")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--steps", type=int, default=5, help="timed steps (after one warm-up step)")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--attn", default="sdpa", help="transformers attn_implementation (sdpa or eager)")
    ap.add_argument("--bf16", action="store_true", help="also run each model with bf16 products (ours --matmul bf16, PyTorch CPU autocast bf16)")
    ap.add_argument("--out", help="write the markdown result here")
    args = ap.parse_args()
    args.gemm_bench = args.gemm_bench or os.path.join(os.path.dirname(args.bin), "examples", "gemm_bench")

    load_before = os.getloadavg()[0]
    peak = gemm_peak(args)
    peak_flops = max(peak["torch"], peak["ours"]) * 1e9
    print(f"f32 GEMM {peak['n']}^3, {args.threads} threads: torch.mm {peak['torch']:.1f} GFLOP/s, "
          f"ops::gemm {peak['ours']:.1f} GFLOP/s", flush=True)
    rows, cmds, bf16_rows = [], [], []
    for model in args.models.split(","):
        r_ours, r_ref, shape, bf16 = bench_model(args, model)
        if bf16:
            b_ours, b_ref = bf16
            bf16_rows.append(f"| {model_name(model)} | {b_ours['tokens_per_s']:.0f} | {b_ref['tokens_per_s']:.0f} "
                             f"| **{b_ours['tokens_per_s'] / b_ref['tokens_per_s']:.2f}x** "
                             f"| {b_ours['tokens_per_s'] / r_ours['tokens_per_s']:.2f}x / {b_ref['tokens_per_s'] / r_ref['tokens_per_s']:.2f}x "
                             f"| {b_ours['first_loss']:.5f} / {b_ref['first_loss']:.5f} |")
            print(bf16_rows[-1], flush=True)
        ratio = r_ours["tokens_per_s"] / r_ref["tokens_per_s"]
        share = lambda r: r["tokens_per_s"] * 6 * r["params"] / peak_flops
        rows.append(f"| {model_name(model)} ({shape}) | {r_ours['tokens_per_s']:.0f} | {r_ref['tokens_per_s']:.0f} "
                    f"| **{ratio:.2f}x** | {share(r_ours):.0%} / {share(r_ref):.0%} "
                    f"| {r_ours['first_loss']:.5f} / {r_ref['first_loss']:.5f} |")
        cmds.append(r_ours["cmd"])
        if bf16:
            cmds.append(bf16[0]["cmd"])
        print(rows[-1], flush=True)

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), cpu)
    except OSError:
        pass
    lines = [
        "# CPU train step: coa-train-step vs PyTorch",
        "",
        f"Batch {args.batch} x {args.seq_len} tokens per optimizer step, the last {args.target_frac:.0%} of each row's "
        f"tokens targets (the rest a prompt, as in a CoA SFT row), fp32, the same weights and batch on both "
        f"sides, AdamW (betas 0.9/0.999, eps 1e-8, weight decay 0.01 on matrices), clip 1.0, {args.threads} threads "
        f"each, {args.steps} timed steps after one warm-up step (median step time). PyTorch {torch.__version__}, "
        f"transformers {transformers.__version__} (`LlamaForCausalLM`, attn_implementation={args.attn}); "
        f"CPU: {cpu}, {os.cpu_count()} cores. The loss of step 1 (same weights, same batch) shows both sides "
        "compute the same thing. Tokens/s count every input token (targets and prompt).",
        "",
        f"The machine's f32 matmul peak, measured in the same run ({peak['n']}x{peak['n']}x{peak['n']}, "
        f"{args.threads} threads): torch.mm (MKL) {peak['torch']:.1f} GFLOP/s, our ops::gemm {peak['ours']:.1f} GFLOP/s. "
        "Share of peak = tokens/s x 6·N FLOP (N = parameters) / the higher of the two. (Our step runs the head "
        "on target rows only, so it does fewer FLOPs than 6·N per token; PyTorch computes logits at every position.)",
        "",
        "| model | coa-train-step tokens/s | PyTorch tokens/s | ratio | share of f32 peak at 6·N (ours / PyTorch) | loss of step 1 (ours / PyTorch) |",
        "|---|---:|---:|---:|---:|---:|",
        *rows,
        "",
        f"Target: ratio >= 1.5x on SmolLM2-135M. 1-minute load average {load_before:.2f} before the run and "
        f"{os.getloadavg()[0]:.2f} after it: measure on an otherwise idle machine (with other processes "
        "competing for the cores, PyTorch's OpenMP threads slow down far more than our rayon threads).",
        "",
        *([
            "bf16 products, same models, batches and weights: ours with `--matmul bf16` (AMX tiles where the CPU has "
            "them), PyTorch under CPU autocast to bf16; weights, gradients and AdamW stay f32 on both sides.",
            "",
            "| model | coa-train-step --matmul bf16 tokens/s | PyTorch autocast bf16 tokens/s | ratio | speed-up over f32 (ours / PyTorch) | loss of step 1 (ours / PyTorch) |",
            "|---|---:|---:|---:|---:|---:|",
            *bf16_rows,
            "",
        ] if bf16_rows else []),
        "Command (`make bench-train`):",
        "",
        "```",
        "python bench/train_bench.py " + " ".join(a for a in sys.argv[1:]),
        "```",
        "",
        "Our side ran, per model:",
        "",
        *[f"    {c}" for c in cmds],
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
