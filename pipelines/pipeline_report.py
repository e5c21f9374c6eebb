#!/usr/bin/env python3
"""The paper-style table of `make pipeline` (stdlib only): per suite, the teacher multi-agent
system vs the distilled model (SFT) vs SFT+RL on the held-out test tasks, in success and tokens
per solved task; also writes EVAL_DIR/pipeline.json for `coa-train-step plot --bars`.

Tokens: the teacher's are every agent's tokens in + out (each agent re-reads its context; an
estimate, see coa-agents), the students' are prompt + response tokens of their own BPE vocabulary
(with a KV cache nothing is read twice). Both are "what the system processed to get an answer".

usage: pipeline_report.py EVAL_DIR
"""
import json, os, sys


def load(path):
    with open(path) as f:
        return json.load(f)


def fmt(v, pct=False):
    if v is None:
        return "-"
    return f"{100 * v:.1f}%" if pct else f"{v:,.0f}"


def main():
    root = sys.argv[1]
    teacher = load(os.path.join(root, "teacher", "mas.json"))["suites"]
    students = {name: {l["suite"]: l for l in load(os.path.join(root, name, "report.json"))} for name in ("sft", "rl")}
    head = ("suite", "system", "tasks", "success", "tokens / task", "tokens / solved", "tokens / solved vs teacher", "format errors")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    suites = sorted(teacher)
    systems = (("teacher", "teacher MAS"), ("sft", "SFT"), ("rl", "SFT+RL"))
    success = {name: [] for name, _ in systems}
    tokens = {name: [] for name, _ in systems}
    for suite in suites:
        t = teacher[suite]
        t_solved = t.get("tokens_per_solved")
        rows = [(suite, "teacher MAS", t["runs"], fmt(t["success_rate"], True), fmt(t["tokens_per_task"]), fmt(t_solved), "100%", "-")]
        success["teacher"].append(100 * t["success_rate"])
        tokens["teacher"].append(t_solved)
        for name, label in systems[1:]:
            l = students[name].get(suite)
            if l is None:
                success[name].append(None)
                tokens[name].append(None)
                continue
            solved = l["tokens_per_solved"]
            ratio = f"{100 * solved / t_solved:.1f}%" if solved is not None and t_solved else "-"
            rows.append((suite, label, l["tasks"], fmt(l["pass_at_1"], True), fmt(l["tokens_per_task"]), fmt(solved), ratio,
                         fmt(l["format_error_rate"], True)))
            success[name].append(100 * l["pass_at_1"])
            tokens[name].append(solved)
        for r in rows:
            print("| " + " | ".join(str(x) for x in r) + " |")
    # Success by hop count, for the suites whose tasks have one (multihop).
    hop_panels = []
    for suite in suites:
        t_hops = teacher[suite].get("by_hops")
        if not t_hops:
            continue
        hops = sorted(t_hops, key=int)
        by = {"teacher": {h: t_hops[h]["success_rate"] for h in hops}}
        for name, _ in systems[1:]:
            l = students[name].get(suite) or {}
            by[name] = {h: l.get("by_hops", {}).get(h, {}).get("pass_at_1") for h in hops}
        print()
        print(f"{suite}: success by hop count (tasks per count: " + ", ".join(f"{h} hops {t_hops[h]['runs']}" for h in hops) + ")")
        print()
        print("| system | " + " | ".join(f"{h} hops" for h in hops) + " |")
        print("|---|" + "---|" * len(hops))
        for name, label in systems:
            print(f"| {label} | " + " | ".join(fmt(by[name][h], True) for h in hops) + " |")
        # Whole percents on the plot: 18-34 tasks a count, and three labels of "60.9%" side by side overlap.
        series = [{"label": label, "values": [None if by[name][h] is None else round(100 * by[name][h]) for h in hops]} for name, label in systems]
        hop_panels.append({"title": f"{suite.capitalize()} success by hop count", "ylabel": "tasks solved (%)", "xlabel": "hops",
                           "groups": [f"{h} hops" for h in hops], "series": series, "unit": "%"})
    print()
    print("success = pass@1 (students: greedy, one sample per task; the teacher: one run per task).")
    print(f"Students' per-suite reports: {root}/<sft|rl>/report.json; scored answers: {root}/<sft|rl>/scores.parquet")
    def panel(title, ylabel, values, **extra):
        series = [{"label": label, "values": values[name]} for name, label in systems]
        return {"title": title, "ylabel": ylabel, "xlabel": "suite", "groups": suites, "series": series, **extra}

    panels = [panel("Success (pass@1)", "tasks solved (%)", success, unit="%"),
              panel("Tokens per solved task", "tokens per solved task", tokens, missing="none solved")] + hop_panels
    with open(os.path.join(root, "pipeline.json"), "w") as f:
        json.dump({"title": "Teacher MAS vs SFT vs SFT+RL on the held-out test tasks", "panels": panels}, f, allow_nan=False, indent=1)


if __name__ == "__main__":
    main()
