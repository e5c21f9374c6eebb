#!/usr/bin/env python3
"""A straightforward Python (json + pandas) implementation of extract + filter + convert, the way
one would write it on top of the reference stack. It is the baseline `bench/distill_bench.py`
times our Rust stages against; it follows the same contracts (DESIGN §4, §7):

  extract: mas_runs events -> ordered CoA steps (think + action per activation; tool observations)
  filter:  dedup, complexity (hops >= 5), quality (correct, format, no repeated tool input),
           reflection (down-sample / drop for math+code), error-correction (up-sample)
  convert: CoA text with AFM tags and observation spans (character offsets)

usage: distill_ref.py -i mas_runs.parquet -o coa_text.parquet [--alpaca out.json]
"""
import argparse, hashlib, json, re

import pandas as pd
import pyarrow.parquet as pq

ACTIONS = {"plan", "web_search", "crawl_page", "code", "reflection", "suggested_answer", "double_check", "answer"}
TOOLS = {"web_search", "crawl_page", "code"}
NEEDS_THINK = {"plan", "web_search", "crawl_page", "code", "reflection", "suggested_answer", "double_check"}
NEXT = {
    None: {"plan"},
    "plan": {"web_search", "crawl_page", "suggested_answer", "code"},
    "reflection": {"plan", "web_search", "crawl_page", "suggested_answer", "code", "answer"},
    "suggested_answer": {"double_check"},
    "double_check": {"plan", "web_search", "crawl_page", "answer"},
    "web_search": {"plan", "web_search", "crawl_page", "reflection", "suggested_answer"},
    "crawl_page": {"plan", "web_search", "crawl_page", "reflection", "suggested_answer"},
    "code": {"reflection", "code", "answer"},
}
TAG_RE = re.compile(r"<(/?)([a-z_]+)>")
SCORE_RE = re.compile(r"score:\s*([1-4])", re.I)


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
                    m = SCORE_RE.search(content)
                    scores.append(int(m.group(1)) if m else 0)
                steps.append(step)
        ok, err = validate(steps)
        out.append({
            "task_id": run.task_id, "suite": run.suite, "question": run.question, "answers": list(run.answers),
            "steps": steps, "hops": hops, "reflections": refl, "double_check_scores": scores,
            "final_answer": run.final_answer, "correct": bool(run.success), "format_ok": ok, "format_error": err,
            "teacher_tokens": int(run.tokens_in + run.tokens_out),
        })
    return pd.DataFrame(out)


def validate(steps):
    prev, thought = None, False
    for i, s in enumerate(steps):
        r = s["role"]
        if r == "think":
            thought = True
            continue
        if r in NEEDS_THINK and not thought:
            return False, f"step {i}: <{r}> without a preceding <think>"
        if r not in NEXT.get(prev, ACTIONS):
            return False, f"step {i}: <{r}> may not follow <{prev}>"
        prev, thought = r, False
    if prev != "answer":
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
