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

print("\n### Train step (~125M Llama, bf16, batch 8 x 1024, AdamW)\n")
ts = next((x for x in torch_ if x["kind"] == "trainstep"), None)
us = next((x for x in ours if x["kind"] == "trainstep"), None)
peak = us.get("peak_tflops") if us else None
print("| implementation | ms / step | tokens/s | model TFLOP/s | MFU |")
print("|---|---:|---:|---:|---:|")
if us:
    mfu = f"{100 * us['mfu']:.1f}%" if us.get("mfu") is not None else "-"
    print(f"| coa-train-step --device cuda | {us['ms']:.1f} | {us['tokens_per_s']:.0f} | {us['tflops']:.0f} | {mfu} |")
else:
    print("| coa-train-step --device cuda | not measured (see trainstep.err) | | | |")
if ts and "error" not in ts:
    mfu = f"{100 * ts['tflops'] / peak:.1f}%" if peak else "-"
    print(f"| PyTorch eager (HF transformers, SDPA, fused AdamW) | {ts['ms']:.1f} | {ts['tokens_per_s']:.0f} | {ts['tflops']:.0f} | {mfu} |")
elif ts:
    print(f"| PyTorch eager | not measured ({ts['error']}) | | | |")
if us:
    print(f"\n{us['params'] / 1e6:.0f}M parameters; model FLOPs = 6 N + 6 L T d per token (torch_ref.py's formula)"
          + (f", MFU against {peak:.0f} TFLOP/s dense bf16" if peak else "")
          + f". Ours: SFT loss {us['loss_first']:.3f} -> {us['loss_last']:.3f} over the timed steps"
          + (f"; ours / PyTorch: {us['tokens_per_s'] / ts['tokens_per_s']:.2f}x tokens/s." if ts and "error" not in ts else "."))
