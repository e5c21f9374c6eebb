#!/usr/bin/env python3
"""Prints the `make distill` summary table from the stages' --stats files (stdlib only).

usage: distill_report.py DISTILL_DIR SUITE [SUITE ...]
"""
import json, os, sys


def stats(path):
    with open(path) as f:
        return json.loads(f.read())


def main():
    root, suites = sys.argv[1], sys.argv[2:]
    rows = []
    for s in suites:
        mas = stats(os.path.join(root, s, "mas.json"))
        flt = stats(os.path.join(root, s, "filter.json"))
        tasks = mas["rows_out"]
        kept = flt["rows_out"]
        rows.append((s, tasks, f"{100 * mas['success_rate']:.1f}%", kept, f"{100 * kept / max(flt['rows_in'], 1):.1f}%",
                     f"{flt['kept_mean_hops']:.1f}", f"{flt['kept_mean_reflections']:.2f}", f"{mas['tokens_per_task']:,.0f}"))
    head = ("suite", "tasks", "teacher success", "trajectories kept", "kept share", "mean hops", "reflections / traj", "teacher tokens / task")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        print("| " + " | ".join(str(x) for x in r) + " |")
    print()
    print(f"Per-rule drop counts: {root}/<suite>/filter.json; dropped rows with reasons: {root}/<suite>/dropped.parquet")


if __name__ == "__main__":
    main()
