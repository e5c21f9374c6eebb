#!/usr/bin/env python3
"""The table of `make eval-benchmarks` (stdlib only), as AFM's tables report the benchmarks: per
benchmark file and model, pass@1 of a greedy answer, avg@k (the mean success of k sampled answers)
with pass@k where the file was sampled, tokens per task, tool calls and format errors; plus the
seconds each cell took. Also writes BENCH_DIR/benchmarks.json for `coa-train-step plot --bars`.

usage: benchmarks_report.py BENCH_DIR K TEMPERATURE MODEL...   (the models in BENCH_MODELS's order,
       then BENCH_PLAIN_MODELS's as NAME:plain: they answer without tools)
"""
import json
import os
import sys


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def one(report):
    """coa-score's report lists suites; a benchmark file holds one (math or code)."""
    if not report:
        return None
    tasks = sum(l["tasks"] for l in report)
    samples = sum(l["samples"] for l in report)
    mean = lambda key: sum(l[key] * l["samples"] for l in report if l.get(key) is not None) / max(samples, 1)
    return {
        "tasks": tasks,
        "k": report[0]["k"],
        "pass_at_1": mean("pass_at_1"),
        "pass_at_k": sum(l["pass_at_k"] * l["tasks"] for l in report) / max(tasks, 1),
        "tokens_per_task": mean("tokens_per_task"),
        "tool_calls": mean("tool_calls"),
        "format_error_rate": mean("format_error_rate"),
    }


def pct(x):
    return "-" if x is None else f"{100 * x:.1f}%"


def main():
    root, k, temperature = sys.argv[1], sys.argv[2], sys.argv[3]
    plain = [m[: -len(":plain")] for m in sys.argv[4:] if m.endswith(":plain")]
    models = [m[: -len(":plain")] if m.endswith(":plain") else m for m in sys.argv[4:]]
    shown = lambda m: f"{m} (no tools)" if m in plain else m
    benches = sorted(f[: -len(".parquet")] for f in os.listdir(os.path.join(root, "tasks")) if f.endswith(".parquet"))
    seconds = {}
    if os.path.exists(os.path.join(root, "times.tsv")):
        for line in open(os.path.join(root, "times.tsv")):
            name, bench, run, secs = line.split("\t")
            seconds[(name, bench, run)] = int(secs)
    head = ("benchmark", "model", "tasks", "pass@1 (greedy)", f"avg@{k} (T={temperature})", f"pass@{k}",
            "tokens / task (greedy)", "tool calls", "format errors", "seconds")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    greedy_series = {m: [] for m in models}
    for b in benches:
        for m in models:
            g = one(load(os.path.join(root, m, b, "greedy.json")))
            a = one(load(os.path.join(root, m, b, "avg.json")))
            greedy_series[m].append(None if g is None else round(100 * g["pass_at_1"], 1))
            if g is None:
                print(f"| {b} | {shown(m)} | - | not run | | | | | | |")
                continue
            secs = seconds.get((m, b, "greedy"), 0) + seconds.get((m, b, "avg"), 0)
            print(f"| {b} | {shown(m)} | {g['tasks']} | {pct(g['pass_at_1'])} | {pct(a and a['pass_at_1'])} | "
                  f"{pct(a and a['pass_at_k'])} | {g['tokens_per_task']:,.0f} | {g['tool_calls']:.1f} | "
                  f"{pct(g['format_error_rate'])} | {secs or '-'} |")
    print()
    print("pass@1: one greedy answer a task; avg@k: the mean success of k answers sampled a task; "
          "pass@k: a task solved by any of them. Answers with the CoA tools (code), graded by coa-score; "
          "a model marked (no tools) answers in plain text (coa-generate policy --plain: the last \\boxed{} or code block). "
          f"Per-cell reports: {root}/<model>/<benchmark>/{{greedy,avg}}.json.")
    panel = {"title": "pass@1 (greedy) on the benchmark files", "ylabel": "tasks solved (%)", "xlabel": "benchmark",
             "groups": benches, "series": [{"label": shown(m), "values": greedy_series[m]} for m in models], "unit": "%"}
    with open(os.path.join(root, "benchmarks.json"), "w") as f:
        json.dump({"title": "Students and base model, benchmark files" if plain else "The students on the benchmark files", "panels": [panel]}, f, allow_nan=False, indent=1)


if __name__ == "__main__":
    main()
