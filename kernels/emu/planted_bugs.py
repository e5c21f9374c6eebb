#!/usr/bin/env python3
"""The planted-bug check: do the kernel tests fail when the kernels are wrong?

Each bug below is planted in a copy of kernels/ (one exact text replacement, which must match
exactly once, so the check cannot silently stop planting anything), the emulated device is built
from that copy (build.rs reads COA_EMU_KERNELS_DIR), and the attention tests run on it in each of
the four schedule orders. A bug must make the tests fail in at least one order; the table says in
which. The mutant build shares target/ with the normal one: the next ordinary build rebuilds the
real kernels.

    python3 kernels/emu/planted_bugs.py            # all bugs, a markdown table on stdout
    python3 kernels/emu/planted_bugs.py --bug gqa  # one of them

Run from the repository root; takes a few minutes per bug on 2 cores (one rebuild of the emulated
device, then the tests). Exits non-zero if any bug goes unnoticed.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

ORDERS = ["forward", "reverse", "random:1", "max-drift"]
# The tests run against each mutant in each order (COA_EMU_ORDER): the attention test (random
# shapes, fixed seed) and every op's small cases (two query blocks, where a rescale or a mask slip
# first shows).
TESTS = ["attention::attention_fwd_bwd_matches_cpu", "every_op_passes_in_every_schedule_order"]
SEED = "7"

# name: (file, text, replacement, what it breaks)
BUGS = {
    "causal-mask": (
        "attention.cu",
        "if (j > i || j < ((e >> 1) ? ss1 : ss0)) x = -INFINITY;",
        "if (j > i + 1 || j < ((e >> 1) ? ss1 : ss0)) x = -INFINITY;",
        "off-by-one causal mask in the forward: each query also sees the next key",
    ),
    "barrier": (
        "attention.cu",
        "        __syncthreads();  // this buffer is refilled two iterations later\n",
        "",
        "missing barrier: the forward refills a K/V buffer while other warps may still read it",
    ),
    "gqa": (
        "attention.cu",
        "const int hk = h / (p.Hq / p.Hkv);",
        "const int hk = h % p.Hkv;",
        "wrong GQA head mapping in the forward (query head h reads kv head h mod Hkv)",
    ),
    "rescale": (
        "attention.cu",
        "corr[r] = exp2f(mrow[r] - base);",
        "corr[r] = 1.f;",
        "dropped online-softmax rescale in the forward (old sums not scaled to a new maximum)",
    ),
}


def plant(root, bug):
    """A copy of kernels/*.cu and coa_common.cuh with `bug` planted; returns its directory."""
    name, text, replacement, _ = bug
    src = os.path.join(root, "kernels")
    tmp = tempfile.mkdtemp(prefix="coa-planted-")
    for f in os.listdir(src):
        if f.endswith(".cu") or f.endswith(".cuh"):
            shutil.copy(os.path.join(src, f), tmp)
    os.symlink(os.path.join(src, "emu"), os.path.join(tmp, "emu"))  # coa_common.cuh includes emu/ptx.h
    path = os.path.join(tmp, name)
    with open(path) as fh:
        code = fh.read()
    if code.count(text) != 1:
        sys.exit(f"planted_bugs.py: {name}: the text to replace occurs {code.count(text)} times (expected once): {text!r}")
    with open(path, "w") as fh:
        fh.write(code.replace(text, replacement))
    return tmp


def run_tests(root, kernels_dir, order):
    """Runs TESTS on the emulated device built from `kernels_dir`; True if they all pass."""
    env = dict(os.environ, COA_EMU_KERNELS_DIR=kernels_dir, COA_TEST_DEVICE="emu", COA_TEST_SEED=SEED)
    if order:
        env["COA_EMU_ORDER"] = order
    cmd = ["cargo", "test", "-q", "-p", "coa-kernels", "--test", "gpu_kernels", "--"] + TESTS + ["--exact"]
    p = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
    if "error[" in p.stderr or "could not compile" in p.stderr:
        sys.exit(f"planted_bugs.py: the mutant did not build:\n{p.stderr[-3000:]}")
    # A renamed test would match nothing under --exact and "pass": every test must have run.
    counts = re.findall(r"test result: \w+\. (\d+) passed; (\d+) failed", p.stdout)
    ran = sum(int(passed) + int(failed) for passed, failed in counts)
    if ran != len(TESTS):
        sys.exit(f"planted_bugs.py: {ran} tests ran, expected {len(TESTS)} ({TESTS}):\n{p.stdout[-3000:]}")
    return p.returncode == 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bug", choices=sorted(BUGS), action="append", help="plant only this bug (repeatable)")
    args = ap.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    names = args.bug or list(BUGS)
    print("| planted bug | " + " | ".join(ORDERS) + " |")
    print("|---|" + "---|" * len(ORDERS))
    unnoticed = []
    for n in names:
        kernels_dir = plant(root, BUGS[n])
        try:
            caught = [not run_tests(root, kernels_dir, o) for o in ORDERS]
        finally:
            shutil.rmtree(kernels_dir)
        cells = ["tests fail" if c else "pass (not caught)" for c in caught]
        print(f"| {BUGS[n][3]} | " + " | ".join(cells) + " |", flush=True)
        if not any(caught):
            unnoticed.append(n)
    if unnoticed:
        sys.exit(f"planted_bugs.py: no test failed for: {', '.join(unnoticed)}")


if __name__ == "__main__":
    main()
