#!/usr/bin/env python3
"""Prints the `make sft` summary: the loss curve as a table and the run's numbers, from the
stages' --stats files and the checkpoint's trainer_state.json (stdlib only).

usage: sft_report.py SFT_DIR SUITE [SUITE ...]
"""
import json, os, sys


def load(path):
    with open(path) as f:
        return json.loads(f.read())


def main():
    root, suites = sys.argv[1], sys.argv[2:]
    state = load(os.path.join(root, "checkpoint", "trainer_state.json"))
    train = load(os.path.join(root, "train.json"))
    hist = state["history"]
    if not hist:
        sys.exit(f"sft_report: {root}/checkpoint/trainer_state.json has no steps")

    print("## SFT data\n")
    print("| suite | rows in | rows out | tokens | targets | dropped overlong | truncated |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for s in suites:
        t = load(os.path.join(root, s, "tokenize.json"))
        print(f"| {s} | {t['rows_in']} | {t['rows_out']} | {t.get('tokens', '')} | {t.get('targets', '')} "
              f"| {t.get('dropped_overlong', '')} | {t.get('truncated', '')} |")

    print("\n## Loss curve (token-mean cross-entropy per optimizer step)\n")
    print("| step | loss | lr | grad norm |")
    print("|---:|---:|---:|---:|")
    k = max(1, len(hist) // 15)
    shown = [h for i, h in enumerate(hist) if i % k == 0 or i == len(hist) - 1]
    for h in shown:
        print(f"| {h['step']} | {h['loss']:.4f} | {h['lr']:.2e} | {h['grad_norm']:.3f} |")

    first, last = hist[0]["loss"], hist[-1]["loss"]
    tail = hist[-10:]
    print(f"\nsteps {state['step']} of {state['schedule']['total_steps']}, "
          f"epoch {state['cursor']['epoch'] + 1}, {state['tokens_seen']} tokens seen; "
          f"loss {first:.3f} -> {last:.3f} (mean of the last {len(tail)} steps "
          f"{sum(h['loss'] for h in tail) / len(tail):.3f})")
    print(f"model: {train.get('params')} parameters; {train.get('tokens_per_s')} tokens/s on "
          f"{train.get('threads')} threads; training {train.get('train_seconds')} s")
    print(f"checkpoint: {root}/checkpoint (HF layout + optimizer and trainer state); "
          f"plot: {root}/loss.png; metrics: {root}/metrics.parquet")


if __name__ == "__main__":
    main()
