#!/usr/bin/env bash
# run_both.sh BINDIR OUTDIR: with the stage binaries in BINDIR, the default size's tasks, distillation, SFT
# tokens and teacher evaluation, and the smoke size's whole pipeline (SFT shortened to 20 steps);
# the two run directories are then moved to OUTDIR. Run it with the binaries before and after a
# change, then compare.py BEFORE/runname AFTER/runname.
set -euo pipefail
BINDIR=$1; OUT=$2
cd "$(dirname "$0")/../../.."
rm -rf runs/cmpd runs/cmps "$OUT"; mkdir -p "$OUT"
t0=$(date +%s)
make tasks distill RUN=cmpd BIN="$BINDIR" CARGO=true
make runs/cmpd/sft/multihop/tokens.parquet runs/cmpd/sft/math/tokens.parquet runs/cmpd/sft/code/tokens.parquet runs/cmpd/eval/teacher/mas_runs.parquet RUN=cmpd BIN="$BINDIR" CARGO=true
t1=$(date +%s)
make pipeline SIZE=smoke RUN=cmps SFT_STEPS=20 SFT_SAVE_EVERY=10 BIN="$BINDIR" CARGO=true
t2=$(date +%s)
echo "default part $((t1-t0)) s, smoke pipeline $((t2-t1)) s"
mv runs/cmpd runs/cmps "$OUT"/
