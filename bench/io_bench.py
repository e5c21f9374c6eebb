#!/usr/bin/env python3
"""IO-layer benchmark: pass N task-like rows through our IO layer and through pyarrow, side by side.

Both read the same input files and write an Arrow IPC stream with zstd-compressed buffers:
  ipc->ipc      IPC stream (zstd) in, IPC stream (zstd) out
  parquet->ipc  Parquet (zstd) in, IPC stream (zstd) out
Ours runs as a subprocess (process start-up included); pyarrow runs in-process, batch by batch,
with its default threading. Best of --repeat runs each. Writes a markdown table to --out.
"""
import argparse, os, platform, random, subprocess, sys, tempfile, time

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

WORDS = ("river city founder company born located capital product university studied works for the of "
         "which what where who country organisation headquartered made by person place year").split()


def task_like_table(n: int, seed: int = 0) -> pa.Table:
    """Rows shaped like the `tasks` table: ids, suite, question, answers, tools, hops, solution JSON."""
    rng = random.Random(seed)
    suites = ["multihop", "math", "code"]
    q = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(12, 30))) + "?" for _ in range(4096)]
    sol = ['{"hops":[{"query":"%s","url":"https://wiki.local/E%d"}],"answer":"A%d"}' % (q[i][:40], i, i) for i in range(4096)]
    idx = [rng.randrange(4096) for _ in range(n)]
    return pa.table({
        "task_id": [f"{suites[i % 3]}-train-{i:07d}" for i in range(n)],
        "suite": [suites[i % 3] for i in range(n)],
        "split": ["train"] * n,
        "source": ["synthetic"] * n,
        "question": [q[j] for j in idx],
        "answers": [[f"Answer {j}"] for j in idx],
        "tools": [["web_search", "crawl_page"]] * n,
        "hops": pa.array([2 + j % 4 for j in idx], pa.int32()),
        "solution": [sol[j] for j in idx],
    })


def best(fn, repeat):
    times = []
    for _ in range(repeat):
        t = time.perf_counter(); fn(); times.append(time.perf_counter() - t)
    return min(times)


def pyarrow_pass(src: str, dst: str, fmt: str):
    opts = ipc.IpcWriteOptions(compression="zstd")
    if fmt == "ipc":
        with pa.OSFile(src, "rb") as f:
            reader = ipc.open_stream(f)
            with pa.OSFile(dst, "wb") as out, ipc.new_stream(out, reader.schema, options=opts) as w:
                for b in reader:
                    w.write_batch(b)
    else:
        pf = pq.ParquetFile(src)
        with pa.OSFile(dst, "wb") as out, ipc.new_stream(out, pf.schema_arrow, options=opts) as w:
            for b in pf.iter_batches(batch_size=8192):
                w.write_batch(b)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--bin", required=True, help="path to the io_passthrough example binary")
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default="bench/results/io.md")
    a = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="coa-io-bench-")
    table = task_like_table(a.rows)
    mb = table.nbytes / 1e6
    src = {"ipc": os.path.join(tmp, "in.ipc"), "parquet": os.path.join(tmp, "in.parquet")}
    with pa.OSFile(src["ipc"], "wb") as f, ipc.new_stream(f, table.schema, options=ipc.IpcWriteOptions(compression="zstd")) as w:
        for b in table.to_batches(max_chunksize=8192):
            w.write_batch(b)
    pq.write_table(table, src["parquet"], compression="zstd", row_group_size=128 * 1024)

    rows = []
    for fmt in ("ipc", "parquet"):
        ours_out, py_out = os.path.join(tmp, f"ours-{fmt}.ipc"), os.path.join(tmp, f"py-{fmt}.ipc")
        t_ours = best(lambda: subprocess.run([a.bin, "-i", src[fmt], "-o", ours_out], check=True, stderr=subprocess.DEVNULL), a.repeat)
        t_py = best(lambda: pyarrow_pass(src[fmt], py_out, fmt), a.repeat)
        # Both outputs must hold the same rows.
        n_ours = ipc.open_stream(pa.OSFile(ours_out, "rb")).read_all().num_rows
        assert n_ours == a.rows, (n_ours, a.rows)
        rows.append((f"{fmt}->ipc", a.rows / t_ours, mb / t_ours, a.rows / t_py, mb / t_py, t_py / t_ours))

    lines = [
        "# IO layer vs pyarrow",
        "",
        f"{a.rows:,} task-like rows ({mb:.0f} MB in memory), zstd IPC stream out, best of {a.repeat}.",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores; pyarrow {pa.__version__}; Python {platform.python_version()}.",
        "Command: `make bench-io`",
        "",
        "| case | ours rows/s | ours MB/s | pyarrow rows/s | pyarrow MB/s | ours / pyarrow |",
        "|---|---|---|---|---|---|",
    ]
    for name, r1, m1, r2, m2, ratio in rows:
        lines.append(f"| {name} | {r1:,.0f} | {m1:,.0f} | {r2:,.0f} | {m2:,.0f} | {ratio:.2f}x |")
    text = "\n".join(lines) + "\n"
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out, "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
