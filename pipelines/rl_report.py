#!/usr/bin/env python3
"""Prints the `make rl` table per iteration from the stages' --stats files (stdlib only), and
writes RL_DIR/curves.json (reward, success, response length and entropy per iteration) for
`coa-train-step plot --lines`.

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
    curves = {"reward": [], "success": [], "length": [], "entropy": []}
    for k in range(1, iters + 1):
        d = os.path.join(root, f"iter{k}")
        pol, flt, tr = stats(os.path.join(d, "policy.json")), stats(os.path.join(d, "filter.json")), stats(os.path.join(d, "train.json"))
        row = (k, pol["rows_out"], f"{pol.get('informative_groups', '-')} of {pol.get('groups', '-')}", flt["rows_out"],
               f"{tr['reward_mean']:.3f}", f"{tr['response_len']:.0f}", f"{tr['clip_frac']:.3f}", f"{tr['entropy']:.3f}",
               f"{tr['logprob_mismatch']:.4f}", f"{tr['mean_loss']:.4f}", tr["steps"])
        print("| " + " | ".join(str(x) for x in row) + " |")
        sc = stats(os.path.join(d, "score.json"))
        curves["reward"].append(tr["reward_mean"])
        curves["success"].append(100.0 * sc["correct"] / sc["rows_out"] if sc["rows_out"] else None)
        curves["length"].append(tr["response_len"])
        curves["entropy"].append(tr["entropy"])
    print()
    print(f"Per-iteration rollouts with rewards: {root}/iter<k>/scores.arrows (an Arrow IPC stream); DAPO steps: {root}/iter<k>/metrics.parquet; plot: {root}/curves.png")
    groups = [str(k) for k in range(1, iters + 1)]

    def panel(title, ylabel, values, unit=""):
        return {"title": title, "ylabel": ylabel, "xlabel": "RL iteration", "unit": unit, "groups": groups,
                "series": [{"label": "", "values": values}]}

    panels = [panel("Reward", "mean reward of the trained rollouts", curves["reward"]),
              panel("Success", "rollouts correct (%)", curves["success"], "%"),
              panel("Response length", "tokens per response", curves["length"]),
              panel("Entropy", "mean token entropy (nats)", curves["entropy"])]
    with open(os.path.join(root, "curves.json"), "w") as f:
        json.dump({"title": "DAPO, per RL iteration", "panels": panels}, f, allow_nan=False, indent=1)


if __name__ == "__main__":
    main()
