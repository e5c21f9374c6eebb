#!/usr/bin/env python3
"""The planted-bug check: do the kernel tests fail when the kernels are wrong?

Each bug below is planted in a copy of kernels/ (one exact text replacement, which must match
exactly once, so the check cannot silently stop planting anything), the emulated device is built
from that copy (build.rs reads COA_EMU_KERNELS_DIR), and the GPU tests run on it: first as CI runs
them (`CI=true`, no COA_EMU_ORDER, a fresh seed: the gpu_kernels and gpu_model test binaries of
`make test`), then the kernel tests (gpu_kernels) in each of the four schedule orders with a fixed
seed. A bug must make the CI run fail; the table says where each was caught. The mutant build
shares target/ with the normal one: the next ordinary build rebuilds the real kernels.

    python3 kernels/emu/planted_bugs.py               # all bugs, a markdown table on stdout
    python3 kernels/emu/planted_bugs.py --bug gqa     # one of them
    python3 kernels/emu/planted_bugs.py --ci-only     # the CI column only

Run from the repository root; takes a few minutes per bug on 2 cores (one rebuild of the emulated
device, then the tests). Exits non-zero if the CI run misses any bug.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

ORDERS = ["forward", "reverse", "random:1", "max-drift"]
# The test binaries CI runs on the emulated device for the kernels (kernels/tests/), and tests each
# must have run (a renamed test would otherwise silently drop out of the check).
BINARIES = ["gpu_kernels", "gpu_model"]
MUST_RUN = {
    "gpu_kernels": ["attention::attention_fwd_bwd_matches_cpu", "attention::attention_long_and_packed_cases",
                    "cross_entropy::cross_entropy_matches_cpu", "every_op_passes_in_every_schedule_order"],
    "gpu_model": ["gpu_model_matches_cpu_on_one_batch", "decoder_matches_cpu_extend"],
}
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
    "dq-atomic": (
        "attention.cu",
        "atomicAdd(row + dt * 8 + 2 * t, dq[dt][2 * r] * p.scale);",
        "row[dt * 8 + 2 * t] += dq[dt][2 * r] * p.scale;",
        "dQ's atomicAdd in the backward replaced by a plain read-modify-write (key blocks race on dQ rows)",
    ),
    "xent-overrun": (
        "cross_entropy.cu",
        "bf16* cache = reinterpret_cast<bf16*>(smem_raw);",
        "bf16* cache = reinterpret_cast<bf16*>(smem_raw) + 8;",
        "shared-memory overrun in the cross-entropy kernel: the row cache starts 16 bytes in, its end passes the dynamic shared memory",
    ),
    "m-stop": (
        "attention.cu",
        "if (segb[m * BM] > k_last) atomicMin(&m_stop, m);",
        "if (segb[m * BM] > k0) atomicMin(&m_stop, m);",
        "wrong m stop in the backward: a query block whose segment starts inside the key block is skipped",
    ),
    "partial-barrier": (
        "coa_common.cuh",
        "    __syncthreads();  // scratch may still be read by a previous call\n",
        "    if (warp == 0) __syncthreads();  // scratch may still be read by a previous call\n",
        "a __syncthreads only the first warp reaches (block_sum: the other warps go on to the next one)",
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


def run_tests(root, kernels_dir, order, binaries, bug):
    """Runs `binaries` on the emulated device built from `kernels_dir`: in CI's way when `order` is
    None, else in that schedule order with a fixed seed. True if they all pass."""
    env = dict(os.environ, COA_EMU_KERNELS_DIR=kernels_dir, COA_TEST_DEVICE="emu")
    env.pop("COA_EMU_ORDER", None)
    env.pop("COA_EMU_CHECKS", None)
    if order:
        env["COA_EMU_ORDER"] = order
        env["COA_TEST_SEED"] = SEED
    else:
        env["CI"] = "true"
        env.pop("COA_TEST_SEED", None)
    cmd = ["cargo", "test", "-p", "coa-kernels", "--no-fail-fast"]
    for b in binaries:
        cmd += ["--test", b]
    p = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
    if "error[" in p.stderr or "could not compile" in p.stderr:
        sys.exit(f"planted_bugs.py: the mutant did not build:\n{p.stderr[-3000:]}")
    for b in binaries:
        for t in MUST_RUN[b]:
            if not re.search(rf"^test {re.escape(t)} \.\.\. ", p.stdout, re.M):
                sys.exit(f"planted_bugs.py: {b}: test {t} did not run:\n{p.stdout[-3000:]}")
    if p.returncode != 0:
        # What failed, and the emulator's first error, for the record (stderr).
        failed = re.findall(r"^test (\S+) \.\.\. FAILED", p.stdout, re.M)
        errors = re.findall(r"emulated device: [^\n\"]*", p.stdout + p.stderr)
        print(f"  {bug} ({order or 'CI run'}): failed {', '.join(failed) or '?'}"
              + (f"; first emulator error: {errors[0][:300]}" if errors else ""), file=sys.stderr, flush=True)
    return p.returncode == 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bug", choices=sorted(BUGS), action="append", help="plant only this bug (repeatable)")
    ap.add_argument("--ci-only", action="store_true", help="only the CI run, not the four orders")
    args = ap.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    names = args.bug or list(BUGS)
    orders = [] if args.ci_only else ORDERS
    print("| planted bug | CI run | " + " | ".join(orders) + (" |" if orders else ""))
    print("|---|---|" + "---|" * len(orders))
    unnoticed = []
    for n in names:
        kernels_dir = plant(root, BUGS[n])
        try:
            ci = not run_tests(root, kernels_dir, None, BINARIES, n)
            caught = [not run_tests(root, kernels_dir, o, ["gpu_kernels"], n) for o in orders]
        finally:
            shutil.rmtree(kernels_dir)
        cells = ["tests fail" if c else "pass (not caught)" for c in [ci] + caught]
        print(f"| {BUGS[n][3]} | " + " | ".join(cells) + " |", flush=True)
        if not ci:
            unnoticed.append(n)
    if unnoticed:
        sys.exit(f"planted_bugs.py: the CI run did not fail for: {', '.join(unnoticed)}")


if __name__ == "__main__":
    main()
