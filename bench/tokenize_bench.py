#!/usr/bin/env python3
"""Tokenize benchmark: coa-tokenize against HF tokenizers from Python, side by side in one run, on
the same corpus and the same vocabulary (the tokenizer.json our stage trained on that corpus).

Corpus: the `make distill` coa_text outputs (multihop, math, code), tiled to --rows rows with
distinct task ids. Both sides read Parquet and write Parquet with the same `tokens` columns.

- ours: `coa-tokenize -i corpus.parquet --tokenizer tok.json -o ours.parquet` (segment-wise
  encoding, mask from character offsets, EOS appended).
- Python: pyarrow reads the table; `Tokenizer.from_file(tok.json).encode_batch` encodes
  `prompt + "\\n" + text` in batches (rayon-parallel inside the library); the loss mask is computed
  in Python from each token's character offsets against the prompt length and observation spans
  (the way LLaMA-Factory-style preprocessing builds labels); EOS appended; pyarrow writes Parquet.

After timing, the two outputs are compared row by row (ids and masks) and the result is reported.
"""
import argparse, atexit, shutil, json, os, platform, subprocess, sys, tempfile, time

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

DISTILL = ["runs/default/distill/multihop/coa_text.parquet",
           "runs/default/distill/math/coa_text.parquet",
           "runs/default/distill/code/coa_text.parquet"]


def python_reference(inp, tok_path, out, batch_rows=2048):
    """HF tokenizers + Python masking: Parquet in, Parquet out. Returns the token count."""
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(tok_path)
    eos = tok.token_to_id("<|endoftext|>")
    table = pq.read_table(inp, columns=["task_id", "prompt", "text", "observation_spans"])
    task_ids = table["task_id"].to_pylist()
    prompts = table["prompt"].to_pylist()
    texts = table["text"].to_pylist()
    spans = table["observation_spans"].to_pylist()
    all_ids, all_mask, n_tokens, n_targets = [], [], [], []
    for lo in range(0, len(texts), batch_rows):
        hi = min(lo + batch_rows, len(texts))
        joined = [prompts[i] + "\n" + texts[i] for i in range(lo, hi)]
        encs = tok.encode_batch(joined, add_special_tokens=False)
        for k, enc in enumerate(encs):
            i = lo + k
            plen = len(prompts[i]) + 1
            bounds = [(s["start"] + plen, s["end"] + plen) for s in spans[i]]
            ids = enc.ids
            mask = []
            j = 0
            for a, b in enc.offsets:
                if a < plen:
                    mask.append(0)
                    continue
                while j < len(bounds) and bounds[j][1] <= a:
                    j += 1
                mask.append(0 if j < len(bounds) and bounds[j][0] < b else 1)
            ids.append(eos)
            mask.append(1)
            all_ids.append(ids)
            all_mask.append(mask)
            n_tokens.append(len(ids))
            n_targets.append(sum(mask))
    out_table = pa.table({
        "task_id": pa.array(task_ids, pa.string()),
        "input_ids": pa.array(all_ids, pa.list_(pa.int32())),
        "loss_mask": pa.array(all_mask, pa.list_(pa.uint8())),
        "segment_ids": pa.nulls(len(all_ids), pa.list_(pa.int32())),
        "n_tokens": pa.array(n_tokens, pa.int32()),
        "n_targets": pa.array(n_targets, pa.int32()),
    })
    pq.write_table(out_table, out, compression="zstd")
    return sum(n_tokens)


LOADS = []


def timed(cmd):
    """Runs cmd; returns (seconds, stderr) and records the 1-minute load average after it."""
    t = time.perf_counter()
    r = subprocess.run(cmd, check=True, stderr=subprocess.PIPE, text=True)
    LOADS.append(os.getloadavg()[0])
    return time.perf_counter() - t, r.stderr


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True, help="directory with the coa-tokenize binary")
    ap.add_argument("--inputs", nargs="+", default=DISTILL, help="coa_text Parquet files to tile")
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--vocab-size", type=int, default=8192)
    ap.add_argument("--out", default="bench/results/tokenize.md")
    ap.add_argument("--ref", nargs=3, metavar=("IN", "TOKENIZER", "OUT"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.ref:
        n = python_reference(*a.ref)
        print(json.dumps({"tokens": n}), file=sys.stderr)
        return

    missing = [p for p in a.inputs if not os.path.exists(p)]
    if missing:
        sys.exit(f"missing {', '.join(missing)}: run `make distill` first")
    tmp = tempfile.mkdtemp(prefix="coa-tokenize-bench-")
    atexit.register(shutil.rmtree, tmp, True)
    p = lambda name: os.path.join(tmp, name)
    cols = ["task_id", "suite", "prompt", "text", "observation_spans"]
    base = pa.concat_tables([pq.read_table(f, columns=cols) for f in a.inputs])
    copies = -(-a.rows // base.num_rows)
    parts = [base.set_column(0, "task_id", pc.binary_join_element_wise(base["task_id"], pa.scalar(f"-r{k}"), ""))
             for k in range(copies)]
    corpus = pa.concat_tables(parts).slice(0, a.rows)
    pq.write_table(corpus, p("corpus.parquet"), compression="zstd")
    tool = os.path.join(a.bin, "coa-tokenize")

    # The vocabulary: our stage trains it on the corpus (timed separately, not part of the comparison).
    t_train, _ = timed([tool, "-i", p("corpus.parquet"), "--train-bpe", "--vocab-size", str(a.vocab_size),
                        "--save-tokenizer", p("tokenizer.json"), "-o", p("train_tokens.parquet")])

    t_ours, err = timed([tool, "-i", p("corpus.parquet"), "--tokenizer", p("tokenizer.json"), "-o", p("ours.parquet")])
    summary = json.loads(err.strip().splitlines()[-1])
    t_py, err = timed([sys.executable, os.path.abspath(__file__), "--bin", a.bin,
                       "--ref", p("corpus.parquet"), p("tokenizer.json"), p("py.parquet")])
    py_tokens = json.loads(err.strip().splitlines()[-1])["tokens"]

    ours = pq.read_table(p("ours.parquet"), columns=["task_id", "input_ids", "loss_mask"])
    py = pq.read_table(p("py.parquet"), columns=["task_id", "input_ids", "loss_mask"])
    same_ids = ours["input_ids"].combine_chunks().equals(py["input_ids"].combine_chunks())
    same_mask = ours["loss_mask"].combine_chunks().equals(py["loss_mask"].combine_chunks())
    same_order = ours["task_id"].combine_chunks().equals(py["task_id"].combine_chunks())
    tokens = summary["tokens"]

    import tokenizers
    rows = a.rows
    text = "\n".join([
        "# Tokenize: coa-tokenize vs HF tokenizers from Python",
        "",
        f"{rows:,} coa_text rows (the `make distill` outputs, tiled), {tokens:,} tokens; Parquet in, Parquet out;",
        f"same vocabulary on both sides: the {summary['vocab_size']:,}-id byte-level BPE our stage trained on this corpus "
        f"({t_train:.1f} s for training + a first tokenize, not compared).",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores; Python {platform.python_version()}, "
        f"tokenizers {tokenizers.__version__}, pyarrow {pa.__version__}.",
        "Command: `nice -n -15 make bench-tokenize` "
        f"(`{os.path.basename(sys.executable)} bench/tokenize_bench.py --bin {a.bin} --rows {rows} --vocab-size {a.vocab_size}`)",
        "",
        "| implementation | seconds | rows/s | tokens/s |",
        "|---|---|---|---|",
        f"| ours (`coa-tokenize --tokenizer`) | {t_ours:.2f} | {rows / t_ours:,.0f} | {tokens / t_ours:,.0f} |",
        f"| Python (`Tokenizer.encode_batch` + offset masking, pyarrow IO) | {t_py:.2f} | {rows / t_py:,.0f} | {py_tokens / t_py:,.0f} |",
        "",
        f"Ours is **{t_py / t_ours:.1f}x** faster (target 3x).",
        "",
        f"Outputs compared row by row: ids {'identical' if same_ids else 'DIFFER'}, "
        f"masks {'identical' if same_mask else 'DIFFER'}, row order {'identical' if same_order else 'DIFFERS'} "
        f"({tokens:,} vs {py_tokens:,} tokens).",
        "",
        f"1-minute load average after each side (other work on a shared machine inflates a side's time): "
        f"ours {LOADS[1]:.1f}, Python {LOADS[2]:.1f}.",
        "",
    ])
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out, "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
