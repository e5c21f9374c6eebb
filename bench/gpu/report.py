#!/usr/bin/env python3
"""One phase's section of the GPU run's report (bench/gpu/run.sh appends it as the phase ends).

    report.py PHASE LOGS_DIR      PHASE: tests | kernels | trainstep | pipeline

Reads what the phase left in LOGS_DIR (test output, the JSON lines of gpu_bench /
gpu_trainstep_bench and torch_ref.py, the stages' --stats files) and prints markdown: ours next to
what a user would otherwise run, as a ratio, with the command behind each figure. A phase whose
files are missing (cut at its budget) prints what there is."""
import json
import os
import re
import sys


def jsonl(path):
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


def load_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def ratio(a, b):
    return f"{a / b:.2f}x" if a and b else "-"


def tests(logs):
    log = open(os.path.join(logs, "tests.log"), errors="replace").read()
    device = os.environ.get("COA_TEST_DEVICE", "cuda")
    print("Command: the test binaries `device_select nvrtc_compile gpu_kernels gpu_model gpu_train` "
          f"with `COA_TEST_DEVICE={device}` (every kernel against the CPU reference; GpuModel / GpuDecoder "
          "against the CPU model; `coa-train-step --device cuda` against the CPU trainer).\n")
    nvrtc = re.search(r"NVRTC (\d+\.\d+) from (\S+)", log)
    if nvrtc:
        print(f"NVRTC {nvrtc.group(1)} ({nvrtc.group(2)})\n")
    print("| test binary | result |")
    print("|---|---|")
    for part in re.split(r"^== test binary ", log, flags=re.M)[1:]:
        name = part.split("\n", 1)[0].strip()
        if name.endswith("FAILED"):
            continue
        results = re.findall(r"^test result: .*$", part, flags=re.M)
        failed = re.findall(r"^test (\S+) \.\.\. FAILED", part, flags=re.M)
        cell = "; ".join(r.replace("test result: ", "").split("; finished")[0] for r in results) or "no result (cut or crashed)"
        if failed:
            cell += " -- failed: " + ", ".join(failed)
        print(f"| {name} | {cell} |")
    regs = re.findall(r"^(\S+): (\d+) registers.*$", log, flags=re.M)
    if regs:
        print("\nptxas: " + ", ".join(f"{k} {r} regs" for k, r in regs[:12]))


def kernels(logs):
    ours = jsonl(os.path.join(logs, "kernels_ours.jsonl"))
    torch_ = jsonl(os.path.join(logs, "kernels_torch.jsonl"))
    dev = next((r["info"] for r in ours if r["kind"] == "device"), "unknown device")
    print(f"Device: {dev}. Commands: `gpu_bench` (kernels/examples) and "
          "`python3 bench/gpu/torch_ref.py attention xent copy`, the same shapes, medians of event-timed runs.\n")
    print("Attention (causal, bf16, no GQA), TFLOP/s:\n")
    print("| hd | T | ours fwd | SDPA flash fwd | ours fwd+bwd | SDPA flash fwd+bwd | ours / SDPA (fwd+bwd) |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in (x for x in ours if x["kind"] == "attention"):
        t = next((x for x in torch_ if x["kind"] == "attention" and x["hd"] == r["hd"] and x["T"] == r["T"]), None)
        tf = f"{t['fwd_tflops']:.0f}" if t else "-"
        tb = f"{t['fwdbwd_tflops']:.0f}" if t else "-"
        print(f"| {r['hd']} | {r['T']} | {r['fwd_tflops']:.0f} | {tf} | {r['fwdbwd_tflops']:.0f} | {tb} | "
              f"{ratio(r['fwdbwd_tflops'], t and t['fwdbwd_tflops'])} |")
    copy = next((x for x in ours if x["kind"] == "copy"), None)
    tcopy = next((x for x in torch_ if x["kind"] == "copy"), None)
    print("\nMasked cross-entropy, fused fwd+bwd (GB/s over one read and one write of the bf16 logits):\n")
    if copy:
        print(f"Device-to-device copy: {copy['gbps']:.0f} GB/s (ours)"
              + (f", {tcopy['gbps']:.0f} GB/s (torch)" if tcopy else "") + "\n")
    print("| N | V | ours ms | ours GB/s | % of copy | F.cross_entropy ms | ours / torch (time) |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in (x for x in ours if x["kind"] == "xent"):
        t = next((x for x in torch_ if x["kind"] == "xent" and x["N"] == r["N"] and x["V"] == r["V"]), None)
        pct = f"{100 * r['gbps'] / copy['gbps']:.0f}%" if copy and copy["gbps"] else "-"
        print(f"| {r['N']} | {r['V']} | {r['ms']:.3f} | {r['gbps']:.0f} | {pct} | "
              + (f"{t['ms']:.3f} | {ratio(t['ms'], r['ms'])} faster |" if t else "- | - |"))


def trainstep(logs):
    ours = jsonl(os.path.join(logs, "trainstep_ours.jsonl"))
    torch_ = jsonl(os.path.join(logs, "trainstep_torch.jsonl"))
    us = next((x for x in ours if x["kind"] == "trainstep"), None)
    print("Commands: `gpu_trainstep_bench` (stages/coa-train-step/examples: `Trainer::step` as "
          "`coa-train-step --device cuda` runs it) and `python3 bench/gpu/torch_ref.py trainstep` "
          "(HF transformers Llama, SDPA, fused AdamW; eager, then torch.compile).\n")
    peak = us.get("peak_tflops") if us else None
    print("| implementation | ms / step | tokens/s | model TFLOP/s | MFU | ours / this (tokens/s) |")
    print("|---|---:|---:|---:|---:|---:|")
    if us:
        mfu = f"{100 * us['mfu']:.1f}%" if us.get("mfu") is not None else "-"
        print(f"| coa-train-step --device cuda | {us['ms']:.1f} | {us['tokens_per_s']:.0f} | {us['tflops']:.1f} | {mfu} | 1.00x |")
    else:
        print("| coa-train-step --device cuda | not measured | | | | |")
    names = {"torch_eager": "PyTorch eager", "torch_compile": "PyTorch torch.compile"}
    for impl, label in names.items():
        t = next((x for x in torch_ if x["kind"] == "trainstep" and x["impl"] == impl), None)
        if t is None:
            continue
        if "error" in t:
            print(f"| {label} | not measured ({t['error']}) | | | | |")
            continue
        mfu = f"{100 * t['tflops'] / peak:.1f}%" if peak else "-"
        print(f"| {label} | {t['ms']:.1f} | {t['tokens_per_s']:.0f} | {t['tflops']:.1f} | {mfu} | "
              f"{ratio(us and us['tokens_per_s'], t['tokens_per_s'])} |")
    if us:
        print(f"\n{us['params'] / 1e6:.1f}M parameters, {us['B']} x {us['T']} tokens a step; model FLOPs = "
              "6 N + 6 L T d per token" + (f", MFU against {peak:.0f} TFLOP/s dense bf16" if peak else "")
              + f". Our SFT loss over the timed steps: {us['loss_first']:.3f} -> {us['loss_last']:.3f}.")


def pipeline(logs):
    print("Command: `coa-train-step --device cuda` from a fresh model on multihop teacher runs distilled "
          "and tokenized at pack time (teacher -> extract -> convert -> tokenize), then `coa-generate policy` "
          "with its tools from the same checkpoint on the GPU and on the CPU (tokens/s in policy_{gpu,cpu}.json).\n")
    train = load_json(os.path.join(logs, "train.json"))
    if train:
        keys = ("steps", "tokens_per_s", "first_loss", "final_loss", "train_seconds")
        found = {k: train[k] for k in keys if k in train}
        print("SFT on the GPU: " + (", ".join(f"{k} {v}" for k, v in found.items()) or json.dumps(train)[:300]) + "\n")
    pol = {d: load_json(os.path.join(logs, f"policy_{d}.json")) for d in ("gpu", "cpu")}
    rate = {d: (p or {}).get("sampled_tokens_per_s") for d, p in pol.items()}
    print("| decoding (coa-generate policy) | sampled tokens/s |")
    print("|---|---:|")
    for d in ("gpu", "cpu"):
        print(f"| {d} | {rate[d] if rate[d] is not None else 'not measured'} |")
    if rate["gpu"] and rate["cpu"]:
        print(f"\nGPU / CPU: {ratio(rate['gpu'], rate['cpu'])} (the CPU is the GPU machine's).")


if __name__ == "__main__":
    phase, logs = sys.argv[1], sys.argv[2]
    fn = {"tests": tests, "kernels": kernels, "trainstep": trainstep, "pipeline": pipeline}.get(phase)
    if fn is not None:
        fn(logs)
