#!/usr/bin/env python3
"""Merges ours.jsonl (kernels/examples/gpu_bench.rs) and torch.jsonl (torch_ref.py) into the
markdown tables for BENCHMARKS.md. Usage: report.py OURS TORCH TESTS_LOG > gpu_bench.md"""
import json
import sys


def load(path):
    out = []
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line.startswith("{"):
                    out.append(json.loads(line))
    except FileNotFoundError:
        pass
    return out


ours, torch_, tests_log = load(sys.argv[1]), load(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else None
dev = next((r["info"] for r in ours if r["kind"] == "device"), "unknown device")
print(f"## GPU kernels ({dev})\n")
print("Command: `bash bench/gpu/run.sh build` here, then one device-tool call "
      "`bash bench/gpu/run.sh device` with carry `.gpubin` (see bench/gpu/README.md).\n")
if tests_log:
    with open(tests_log) as f:
        summary = [l.strip() for l in f if l.startswith("test result:") or "FAILED" in l or "panicked" in l]
    print("Correctness (kernels/tests on the GPU): " + ("; ".join(summary) or "no test output") + "\n")

print("### Attention (causal, bf16, 16k tokens per call, no GQA), TFLOP/s\n")
print("| hd | T | ours fwd | SDPA flash fwd | ours fwd+bwd | SDPA flash fwd+bwd | ours / SDPA (fwd+bwd) |")
print("|---:|---:|---:|---:|---:|---:|---:|")
for r in (x for x in ours if x["kind"] == "attention"):
    t = next((x for x in torch_ if x["kind"] == "attention" and x["hd"] == r["hd"] and x["T"] == r["T"]), None)
    tf = f"{t['fwd_tflops']:.0f}" if t else "-"
    tb = f"{t['fwdbwd_tflops']:.0f}" if t else "-"
    ratio = f"{r['fwdbwd_tflops'] / t['fwdbwd_tflops']:.2f}" if t else "-"
    print(f"| {r['hd']} | {r['T']} | {r['fwd_tflops']:.0f} | {tf} | {r['fwdbwd_tflops']:.0f} | {tb} | {ratio} |")

copy = next((x for x in ours if x["kind"] == "copy"), None)
tcopy = next((x for x in torch_ if x["kind"] == "copy"), None)
print("\n### Masked cross-entropy, fused fwd+bwd (GB/s over read + write of the bf16 logits)\n")
if copy:
    print(f"Device-to-device copy: {copy['gbps']:.0f} GB/s (ours), "
          f"{tcopy['gbps']:.0f} GB/s (torch)\n" if tcopy else f"Device-to-device copy: {copy['gbps']:.0f} GB/s\n")
print("| N | V | ours ms | ours GB/s | % of copy | torch F.cross_entropy ms | torch GB/s | ours / torch |")
print("|---:|---:|---:|---:|---:|---:|---:|---:|")
for r in (x for x in ours if x["kind"] == "xent"):
    t = next((x for x in torch_ if x["kind"] == "xent" and x["N"] == r["N"] and x["V"] == r["V"]), None)
    pct = f"{100 * r['gbps'] / copy['gbps']:.0f}%" if copy else "-"
    print(f"| {r['N']} | {r['V']} | {r['ms']:.3f} | {r['gbps']:.0f} | {pct} | "
          + (f"{t['ms']:.3f} | {t['gbps']:.0f} | {t['ms'] / r['ms']:.2f}x |" if t else "- | - | - |"))

print("\n### Train step (~125M Llama, bf16)\n")
ts = next((x for x in torch_ if x["kind"] == "trainstep"), None)
if ts and "error" not in ts:
    print(f"PyTorch eager: {ts['tokens_per_s']:.0f} tokens/s ({ts['tflops']:.0f} TFLOP/s model FLOPs), "
          f"{ts['params'] / 1e6:.0f}M params, batch {ts['B']}x{ts['T']}.")
elif ts:
    print(f"PyTorch eager: not measured ({ts['error']}).")
print("\n**coa-train-step --device cuda: NOT MEASURED YET** -- the GPU train step is not wired into "
      "coa-train-step; this row awaits it (bench/gpu/run.sh has the marked section).")
