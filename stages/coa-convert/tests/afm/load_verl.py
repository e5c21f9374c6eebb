#!/usr/bin/env python3
"""Loads a verl Parquet the way AFM's RL training reads one, and checks that every row would be
scored.

    python load_verl.py RL.parquet

verl's RLHFDataset turns the Parquet into one dict per row (nested structs as dicts, lists as
lists) and takes from it the chat `prompt`, `extra_info.index` (a string in AFM's own files),
`extra_info.tools_kwargs` and `extra_info.need_tools_kwargs`. AFM's reward manager then picks a
scorer by `data_source` (anything else raises NotImplementedError) and hands it
`reward_model.ground_truth`: the math scorer boxes the string for math-verify, the LiveCodeBench
scorer `json.loads` it for `functional` or `stdin`/`expected_output` (with `question_id` beside
them), the QA scorers read `target` from its JSON. Written from reading that code, not copied:
the name lists below are the ones AFM's `_select_rm_score_fn` dispatches on to a scorer it imports.

Prints one line per data source; exits 1 naming the first row AFM's code would refuse.
"""
import json
import sys

import pyarrow.parquet as pq

MATH = {"math_dapo", "aime24", "aime25", "MATH", "MATH500", "gms8k", "amc23", "OlympiadBench"}
CODE = {
    "skywork", "skywork_livecodebench_v4", "skywork_livecodebench_v5", "skywork_livecodebench_v6",
    "skywork_livecodebench_v1_to_v3", "skywork_math", "codeforces_areal_test", "codecontests_hf_test",
    "codecontests_hf_train", "codecontests_areal_test",
}
QA = {"nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle", "mercury"}


def scorer(data_source):
    for name, names in (("math", MATH), ("code", CODE), ("qa", QA)):
        if data_source in names:
            return name
    raise NotImplementedError(f"AFM's reward manager has no scorer for data_source {data_source!r}")


def check_ground_truth(kind, gt):
    assert isinstance(gt, str) and gt.strip(), f"ground_truth must be a non-empty string, got {gt!r}"
    if kind == "math":
        # several golds travel as {"target": [...]}; one gold is the string math-verify boxes
        if gt.lstrip().startswith('{"target"'):
            assert all(isinstance(t, str) for t in json.loads(gt)["target"])
        return
    spec = json.loads(gt)
    if kind == "qa":
        targets = spec["target"]
        assert isinstance(targets, list) and targets and all(isinstance(t, str) for t in targets), spec
        return
    assert isinstance(spec.get("question_id"), str) and spec["question_id"], f"no question_id: {sorted(spec)}"
    if "functional" in spec:
        assert isinstance(spec["functional"], str) and spec["functional"].strip()
    else:
        ins, outs = spec["stdin"], spec["expected_output"]
        assert isinstance(ins, list) and isinstance(outs, list) and len(ins) == len(outs) > 0, spec
        assert all(isinstance(x, str) for x in ins + outs)


def main(path):
    rows = pq.read_table(path).to_pylist()
    counts = {}
    for n, row in enumerate(rows):
        try:
            messages = row["prompt"]
            assert any(m["role"] == "user" and isinstance(m["content"], str) and m["content"] for m in messages), messages
            extra = row.get("extra_info") or {}
            index = extra.get("index", 0)
            assert isinstance(index, str), f"extra_info.index is {type(index).__name__}, AFM's files have a string"
            tools = extra.get("tools_kwargs") or {}
            if extra.get("need_tools_kwargs"):
                assert tools and all("create_kwargs" in v for v in tools.values()), tools
            kind = scorer(row["data_source"])
            check_ground_truth(kind, row["reward_model"]["ground_truth"])
        except Exception as e:
            print(f"row {n} (data_source {row.get('data_source')!r}, index {row.get('extra_info', {}).get('index')!r}): {type(e).__name__}: {e}")
            return 1
        counts[(row["data_source"], kind)] = counts.get((row["data_source"], kind), 0) + 1
    for (source, kind), k in sorted(counts.items()):
        print(f"{source}: {k} rows, scored by AFM's {kind} scorer")
    print(f"{path}: {len(rows)} rows load and score as AFM's training code reads them")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
