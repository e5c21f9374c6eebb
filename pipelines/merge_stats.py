#!/usr/bin/env python3
"""Merges the --stats summaries of a sharded stage's shards into one summary (stdlib only).

usage: merge_stats.py PART.json [PART.json ...] > merged.json

Whole numbers are summed, lists concatenated, strings kept when every shard agrees; `seconds` is
the sum over shards (CPU-side work, not wall time). A teacher summary (`coa-generate mas`) carries
its unrounded `counts`: the rates are recomputed from their sums exactly as the stage computes
them, so the merged summary equals the unsharded run's (the `make distill` table is the same).
Other fractional fields cannot be merged from the shards' values and are left out.
"""
import json, math, sys


def r4(x):
    # The stage's rounding: half away from zero, 4 digits.
    return math.floor(x * 10_000.0 + 0.5) / 10_000.0


def mas_fields(c):
    """The fields of the teacher summary, from its counts (coa_agents::RunStats::to_json)."""
    n = max(c["runs"], 1)
    per_solved = lambda tokens, ok: None if ok == 0 else r4(tokens / ok)
    suites = {}
    for name in sorted(c["per_suite"]):
        runs, ok, tokens = c["per_suite"][name]
        m = max(runs, 1)
        suites[name] = {"runs": runs, "success_rate": r4(ok / m), "tokens_per_task": r4(tokens / m),
                        "tokens_per_solved": per_solved(tokens, ok)}
        hops = c.get("per_suite_hops", {}).get(name)
        if hops:
            suites[name]["by_hops"] = {h: {"runs": hr, "success_rate": r4(hok / max(hr, 1))}
                                       for h, (hr, hok) in sorted(hops.items(), key=lambda kv: int(kv[0]))}
    return {
        "success_rate": r4(c["successes"] / n),
        "mean_events": r4(c["events"] / n),
        "mean_actions": r4(c["action_events"] / n),
        "min_actions": c["min_actions"] or 0,
        "max_actions": c["max_actions"],
        "tokens_per_task": r4(c["tokens"] / n),
        "tokens_per_solved": per_solved(c["tokens"], c["successes"]),
        "reflection_rate": r4(c["runs_with_reflection"] / n),
        "poor_reflection_rate": r4(c["runs_with_poor_reflection"] / n),
        "recovery_rate": r4(c["recoveries"] / n),
        "doubted_answer_rate": r4(c["runs_with_doubted_answer"] / n),
        "no_answer": c["no_answer"],
        "rejected_outputs": c["rejected"],
        "suites": suites,
    }


def merge_counts(parts):
    out = {}
    for c in parts:
        for k, v in c.items():
            if k == "per_suite":
                acc = out.setdefault(k, {})
                for s, triple in v.items():
                    acc[s] = [a + b for a, b in zip(acc.get(s, [0, 0, 0]), triple)]
            elif k == "per_suite_hops":
                acc = out.setdefault(k, {})
                for s, hops in v.items():
                    into = acc.setdefault(s, {})
                    for h, pair in hops.items():
                        into[h] = [a + b for a, b in zip(into.get(h, [0, 0]), pair)]
            elif k == "min_actions":
                # An empty shard has no minimum.
                out[k] = v if out.get(k) is None else (out[k] if v is None else min(out[k], v))
            elif k == "max_actions":
                out[k] = max(out.get(k, 0), v)
            else:
                out[k] = out.get(k, 0) + v
    return out


def main():
    parts = []
    for path in sys.argv[1:]:
        with open(path) as f:
            parts.append(json.loads(f.read()))
    if not parts:
        sys.exit("merge_stats.py: no shard summaries given")
    merged = {"shards": len(parts)}
    for key in parts[0]:
        values = [p.get(key) for p in parts]
        if key in ("shard", "counts", "suites"):
            continue
        if key == "seconds":
            merged[key] = round(sum(values), 3)
        elif all(isinstance(v, bool) for v in values) or all(isinstance(v, str) for v in values):
            if len(set(values)) == 1:
                merged[key] = values[0]
        elif all(isinstance(v, int) for v in values):
            merged[key] = sum(values)
        elif all(isinstance(v, list) for v in values):
            merged[key] = [x for v in values for x in v]
    if all("counts" in p for p in parts):
        counts = merge_counts([p["counts"] for p in parts])
        merged.update(mas_fields(counts))
        merged["counts"] = counts
    print(json.dumps(merged))


if __name__ == "__main__":
    main()
