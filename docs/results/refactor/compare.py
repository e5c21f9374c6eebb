# compare.py A B: compares two run directories file by file: bytes, then JSON without wall-clock keys,
# then Parquet column by column (pyarrow, where installed); prints what differs and the counts.
import json, os, sys, filecmp
A, B = sys.argv[1], sys.argv[2]
def is_timing(key):
    """Wall-clock fields: durations and rates (seconds, *_secs, *_seconds, *_s, *_per_s)."""
    return key == "seconds" or key.endswith(("_s", "_secs", "_seconds"))
def strip(x):
    if isinstance(x, dict):
        return {k: strip(v) for k, v in x.items() if not is_timing(k)}
    if isinstance(x, list):
        return [strip(v) for v in x]
    return x
same = diff = jsonsame = 0
only = []
for root, _, files in os.walk(A):
    for f in files:
        pa = os.path.join(root, f); rel = os.path.relpath(pa, A); pb = os.path.join(B, rel)
        if not os.path.exists(pb):
            only.append("only in A: " + rel); continue
        if filecmp.cmp(pa, pb, shallow=False):
            same += 1; continue
        if f.endswith(".json"):
            try:
                if strip(json.load(open(pa))) == strip(json.load(open(pb))):
                    jsonsame += 1; continue
            except Exception:
                pass
        if f.endswith(".parquet"):
            try:
                import pyarrow.parquet as pq
                ta, tb = pq.read_table(pa), pq.read_table(pb)
                cols = [c for c in ta.column_names if c not in tb.column_names or not ta[c].equals(tb[c])]
                if ta.schema.equals(tb.schema) and cols and all(is_timing(c) for c in cols):
                    jsonsame += 1; print("timing columns only:", rel, cols); continue
            except ImportError:
                pass
        diff += 1; print("DIFF", rel)
for root, _, files in os.walk(B):
    for f in files:
        rel = os.path.relpath(os.path.join(root, f), B)
        if not os.path.exists(os.path.join(A, rel)):
            only.append("only in B: " + rel)
for o in only: print(o)
print(f"identical bytes: {same}, identical but for timing fields (JSON keys, Parquet columns): {jsonsame}, differ: {diff}, unmatched: {len(only)}")
