#!/usr/bin/env python3
"""A straightforward Python (json + pandas) implementation of extract + filter + convert, the way
one would write it on top of the reference stack. It is the baseline `bench/distill_bench.py`
times our Rust stages against; it follows the same contracts as our stages (the tag orders are
coa-format's, AFM's per suite):

  extract: mas_runs events -> ordered CoA steps (think + action per activation; tool observations)
  filter:  dedup, complexity (hops >= 5), quality (correct, format, no repeated tool input),
           reflection (down-sample / drop for math+code), error-correction (up-sample)
  convert: CoA text with AFM tags and observation spans (character offsets)

usage: distill_ref.py -i mas_runs.parquet -o coa_text.parquet [--alpaca out.json]
"""
import argparse, hashlib, json, re

import pandas as pd
import pyarrow.parquet as pq

TOOLS = {"web_search", "wiki_search", "crawl_page", "code"}

# AFM's tag orders, as coa-format's grammar states them: after the last action (None = start),
# the actions that may come next, per flavor. math and code follow the code agent's order, qa
# either QA order, every other suite the web agent's.
FLAVOR = {"math": "code", "code": "code", "qa": "qa"}
SEARCH = ["web_search", "wiki_search", "crawl_page"]
WEB = {
    None: ["plan"],
    "plan": SEARCH + ["suggested_answer"],
    **{t: ["observation"] for t in SEARCH},
    "observation": ["plan"] + SEARCH + ["reflection", "suggested_answer"],
    "reflection": ["plan"] + SEARCH + ["suggested_answer"],
    "suggested_answer": ["double_check"],
    "double_check": ["plan"] + SEARCH + ["answer"],
}
QA = dict(WEB, plan=WEB["plan"] + ["answer"], observation=WEB["observation"] + ["answer"], reflection=WEB["reflection"] + ["answer"])
CODE = {None: ["plan"], "plan": ["code", "answer"], "code": ["observation"], "observation": ["reflection"], "reflection": ["code", "answer"]}
TRANSITIONS = {"web": WEB, "qa": QA, "code": CODE}


def think_rule(flavor, tag):
    """Whether a <think> must, may or must not come right before `tag`."""
    if tag in ("observation", "think"):
        return "forbidden"
    if flavor == "code":
        return "forbidden" if tag in ("plan", "reflection") else "required"
    return "optional" if tag == "answer" else "required"


TAG_RE = re.compile(r"<(/?)([a-z_]+)>")
# `key: value` as coa-format's grade parsers read it: the key on its own (any case), markdown
# around the key and the colon, the value the word after it.
MARKUP = r"[ \t*_`\"']*"


def graded_word(text, key, underscore_before=False):
    before = r"(?<![A-Za-z0-9])" if underscore_before else r"(?<![A-Za-z0-9_])"
    m = re.search(before + re.escape(key) + r"(?![A-Za-z0-9])" + MARKUP + ":" + MARKUP + r"([^\W_]*)", text, re.I)
    return m.group(1) if m else None


def double_check_score(content):
    """The `score: N` (1-4) of a double_check, or None."""
    w = graded_word(content, "score", underscore_before=True)
    return int(w) if w and w.isascii() and w.isdigit() and 1 <= int(w) <= 4 else None


def reflection_grades(content):
    """The three grades of a reflection (good, fair or poor; AFM's `Average` is fair), or None."""
    grades = []
    for key in ("information_conflict", "tool_effectiveness", "trajectory_monitoring"):
        w = graded_word(content, key)
        w = w if w is not None else graded_word(content, key.replace("_", " "))
        g = {"average": "fair"}.get((w or "").lower(), (w or "").lower())
        if g not in ("good", "fair", "poor"):
            return None
        grades.append(g)
    return grades


def parse_blocks(text):
    """Split tagged text into (tag, content) blocks; raise on unclosed or stray tags."""
    blocks, pos = [], 0
    while True:
        m = TAG_RE.search(text, pos)
        if not m:
            break
        if m.group(1):
            raise ValueError(f"stray closing tag </{m.group(2)}>")
        tag = m.group(2)
        end = text.find(f"</{tag}>", m.end())
        if end < 0:
            raise ValueError(f"<{tag}> is never closed")
        blocks.append((tag, text[m.end():end].strip()))
        pos = end + len(tag) + 3
    return blocks


def extract(runs: pd.DataFrame) -> pd.DataFrame:
    out = []
    for run in runs.itertuples(index=False):
        steps, hops, refl, scores = [], 0, 0, []
        for ev in run.events:
            if ev["role"] == "manager":
                continue
            hops += 1
            for tag, content in parse_blocks(ev["output"]):
                step = {"role": tag, "agent": ev["agent"], "content": content, "tool": None, "tool_input": None, "observation": None}
                if tag in TOOLS:
                    step.update(tool=ev["tool"], tool_input=ev["tool_input"], observation=ev["observation"])
                if tag == "reflection":
                    refl += 1
                if tag == "double_check":
                    scores.append(double_check_score(content) or 0)
                steps.append(step)
        ok, err = validate(steps, run.suite)
        out.append({
            "task_id": run.task_id, "suite": run.suite, "question": run.question, "answers": list(run.answers),
            "steps": steps, "hops": hops, "reflections": refl, "double_check_scores": scores,
            "final_answer": run.final_answer, "correct": bool(run.success), "format_ok": ok, "format_error": err,
            "teacher_tokens": int(run.tokens_in + run.tokens_out),
        })
    return pd.DataFrame(out)


def validate(steps, suite):
    """(True, None) if the steps follow AFM's order for the suite's flavor and the grades that
    steer it (a double_check score of 3-4 leads to the answer, 1-2 away from it; a Poor reflection
    grade to a new plan; web reflections must grade), else (False, why)."""
    flavor = FLAVOR.get(suite, "web")
    table = TRANSITIONS[flavor]
    last, thought, demand = None, False, None

    def advance(tag, i):
        nonlocal last, thought
        if last == "answer":
            return f"step {i}: <{tag}> after <answer>"
        nxt = table.get(last, [])
        after = f"<{last}>" if last else "the start"
        if tag == "think":
            if thought or all(think_rule(flavor, t) == "forbidden" for t in nxt):
                return f"step {i}: <think> may not follow {after}"
            thought = True
            return None
        if tag not in nxt:
            return f"step {i}: <{tag}> may not follow {after}"
        rule = think_rule(flavor, tag)
        if rule == "required" and not thought:
            return f"step {i}: <{tag}> without a preceding <think>"
        if rule == "forbidden" and thought:
            return f"step {i}: <{tag}> may not follow a <think>"
        last, thought = tag, False
        return None

    for i, s in enumerate(steps):
        r = s["role"]
        err = advance(r, i)
        if err:
            return False, err
        if r != "think":
            if demand == "replan" and r != "plan":
                return False, f"step {i}: a Poor reflection grade is followed by <{r}>, not <plan>"
            if isinstance(demand, int) and (demand >= 3) != (r == "answer"):
                return False, f"step {i}: double_check score {demand} is followed by <{r}>"
            demand = None
        if r == "double_check":
            demand = double_check_score(s["content"])
            if demand is None:
                return False, f"step {i}: <double_check> without `score: N` (N = 1-4)"
        elif r == "reflection" and flavor != "code":
            grades = reflection_grades(s["content"])
            if grades is None and flavor == "web":
                return False, f"step {i}: <reflection> does not grade its three criteria"
            if grades and "poor" in grades:
                demand = "replan"
        if r in TOOLS:
            if s["observation"] is None:
                return False, f"step {i}: <{r}> without an <observation>"
            err = advance("observation", i)
            if err:
                return False, err
    if last != "answer":
        return False, "trajectory does not end with <answer>"
    return True, None


def keep_fraction(task_id, seed, frac):
    h = int(hashlib.sha1(f"{seed}:{task_id}".encode()).hexdigest()[:8], 16)
    return h / 0xFFFFFFFF < frac


def filter_rules(df: pd.DataFrame, seed=0, min_hops=5, no_reflection_keep=0.3, copies=2):
    stats = []

    def apply(name, mask):
        nonlocal df
        stats.append({"rule": name, "rows_in": len(df), "kept": int(mask.sum()), "dropped": int((~mask).sum())})
        df = df[mask]

    key = df.apply(lambda r: r.task_id + json.dumps(r.steps, sort_keys=True), axis=1)
    apply("dedup", ~key.duplicated())
    apply("complexity", df.hops >= min_hops)
    apply("quality.correct", df.correct)
    apply("quality.format", df.format_ok)

    def repeated(steps):
        seen = set()
        for s in steps:
            if s["tool"]:
                k = (s["tool"], s["tool_input"])
                if k in seen:
                    return True
                seen.add(k)
        return False

    apply("quality.repeated_tool_input", ~df.steps.apply(repeated))
    no_refl = df.reflections == 0
    sampled = df.task_id.apply(lambda t: keep_fraction(t, seed, no_reflection_keep))
    apply("reflection", ~no_refl | (~df.suite.isin(["math", "code"]) & sampled))
    doubted = df.double_check_scores.apply(lambda s: len(s) > 0 and s[0] <= 2) & df.correct
    df = pd.concat([df] + [df[doubted]] * (copies - 1), ignore_index=True)
    stats.append({"rule": "error_correction", "duplicated": int(doubted.sum()) * (copies - 1)})
    return df, stats


def render(steps):
    text, spans = [], []
    pos = 0
    for s in steps:
        r = s["role"]
        body = f"```py\n{s['content']}\n```" if r == "code" else s["content"]
        block = f"<{r}>\n{body}\n</{r}>\n"
        text.append(block)
        pos += len(block)
        if s["observation"] is not None:
            obs = f"<observation>\n{s['observation']}\n</observation>\n"
            spans.append({"start": pos, "end": pos + len(obs) - 1})
            text.append(obs)
            pos += len(obs)
    return "".join(text), spans


def convert(df: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for r in df.itertuples(index=False):
        text, spans = render(r.steps)
        prompt = f"Solve the task with <think>, <plan>, tool calls and <answer>.\n\nTask: {r.question}"
        rows.append({"task_id": r.task_id, "suite": r.suite, "prompt": prompt, "text": text, "observation_spans": spans})
    return pd.DataFrame(rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-i", "--input", required=True)
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--alpaca")
    a = ap.parse_args()
    # Read in batches: the nested `events` column of 100k runs is too big for one pandas frame.
    pf = pq.ParquetFile(a.input)
    parts = [extract(b.to_pandas()) for b in pf.iter_batches(batch_size=8192)]
    traj = pd.concat(parts, ignore_index=True)
    n_runs = pf.metadata.num_rows
    kept, stats = filter_rules(traj)
    coa = convert(kept)
    coa.to_parquet(a.output, compression="zstd")
    if a.alpaca:
        with open(a.alpaca, "w") as f:
            json.dump([{"instruction": p, "input": "", "output": t} for p, t in zip(coa.prompt, coa.text)], f)
    print(json.dumps({"rows_in": n_runs, "kept": len(kept), "rules": stats}))


if __name__ == "__main__":
    main()
