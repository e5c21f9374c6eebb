#!/usr/bin/env python3
"""Multihop answers by hop count: solved, the relation count the answer's plan states ("That is N
relations" after the unnested chain, or before 2026-11-29 "The question chains N relations"; the
scripted teacher writes N = the question's hops) and
the number of web searches, from a `coa-score` output and its tasks file. Needs pyarrow (the
benchmarks' virtualenvs .venv and .venv-torch have it). Works as well on a `coa-convert` CoA text file (column `text`; no `correct`).

usage: multihop_hops.py SCORES.parquet TASKS.parquet
"""
import collections, re, sys

import pyarrow.parquet as pq


def main():
    scores, tasks = sys.argv[1], sys.argv[2]
    hops = {r["task_id"]: int(r["hops"]) for r in pq.read_table(tasks, columns=["task_id", "hops"]).to_pylist()}
    table = pq.read_table(scores)
    text = "response_text" if "response_text" in table.column_names else "text"
    scored = "correct" in table.column_names
    solved, total = collections.Counter(), collections.Counter()
    stated, searches = collections.defaultdict(collections.Counter), collections.defaultdict(collections.Counter)
    for r in table.to_pylist():
        h = hops[r["task_id"]]
        total[h] += 1
        solved[h] += bool(r.get("correct"))
        m = re.search(r"(?:chains|That is) (\d+) relations", r[text])
        stated[h][m.group(1) if m else "none"] += 1
        searches[h][r[text].count("<web_search>")] += 1
    print("| hops | answers | solved | relations stated: count | web searches: count |")
    print("|---|---|---|---|---|")
    for h in sorted(total):
        fmt = lambda c: ", ".join(f"{k}: {v}" for k, v in sorted(c.items(), key=lambda kv: str(kv[0])))
        print(f"| {h} | {total[h]} | {solved[h] if scored else '-'} | {fmt(stated[h])} | {fmt(searches[h])} |")


if __name__ == "__main__":
    main()
