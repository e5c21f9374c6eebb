#!/usr/bin/env python3
"""Prints the `make rl` table per iteration from the stages' --stats files (stdlib only), and
writes RL_DIR/curves.json (reward, response length and loss per iteration) for
`coa-train-step plot --bars`.

usage: rl_report.py RL_DIR ITERS
"""
import json, os, sys


def stats(path):
    with open(path) as f:
        return json.load(f)


def main():
    root, iters = sys.argv[1], int(sys.argv[2])
    head = ("iter", "rollouts", "informative groups", "kept after dynamic sampling", "reward mean", "response len",
            "clip frac", "entropy", "log-prob mismatch", "DAPO loss", "steps")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    curves = {"reward": [], "length": [], "loss": []}
    for k in range(1, iters + 1):
        d = os.path.join(root, f"iter{k}")
        pol, flt, tr = stats(os.path.join(d, "policy.json")), stats(os.path.join(d, "filter.json")), stats(os.path.join(d, "train.json"))
        row = (k, pol["rows_out"], f"{pol.get('informative_groups', '-')} of {pol.get('groups', '-')}", flt["rows_out"],
               f"{tr['reward_mean']:.3f}", f"{tr['response_len']:.0f}", f"{tr['clip_frac']:.3f}", f"{tr['entropy']:.3f}",
               f"{tr['logprob_mismatch']:.4f}", f"{tr['mean_loss']:.4f}", tr["steps"])
        print("| " + " | ".join(str(x) for x in row) + " |")
        curves["reward"].append([f"it{k}", tr["reward_mean"]])
        curves["length"].append([f"it{k}", tr["response_len"]])
        curves["loss"].append([f"it{k}", tr["mean_loss"]])
    print()
    print(f"Per-iteration rollouts with rewards: {root}/iter<k>/scores.arrow; DAPO steps: {root}/iter<k>/metrics.parquet; plot: {root}/curves.png")
    panels = [{"title": "reward mean", "bars": curves["reward"]}, {"title": "response tokens", "bars": curves["length"]},
              {"title": "DAPO loss", "bars": curves["loss"]}]
    with open(os.path.join(root, "curves.json"), "w") as f:
        json.dump({"title": "RL per iteration", "panels": panels}, f)


if __name__ == "__main__":
    main()
