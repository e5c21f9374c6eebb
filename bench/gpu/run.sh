#!/usr/bin/env bash
# GPU benchmark and correctness run, in two halves (the GPU machine has no Rust and no network):
#
#   bash bench/gpu/run.sh build     # HERE: release-build the test and bench binaries into .gpubin/
#   bash bench/gpu/run.sh device    # ON THE GPU MACHINE, one device-tool call, carrying .gpubin:
#       run(command="bash bench/gpu/run.sh device", carry=[".gpubin"], timeout_s=600)
#
# The device half runs the correctness tests on the real GPU (every kernel against the CPU
# reference; the GPU model against the CPU model; `coa-train-step --device cuda` against the CPU
# trainer, checkpoints moving between them), then times our kernels and PyTorch's, and our train
# step and PyTorch eager's on the same ~125M Llama and batch, and writes $OUT/gpu_bench.md (tables
# for BENCHMARKS.md) plus the raw logs under $OUT.
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=.gpubin
PIPELINE_BINS="coa-generate coa-extract coa-filter coa-convert coa-tokenize coa-score"

# The loop of `make pipeline`, shrunk, with --device cuda: distil 300 multihop tasks, SFT the
# `small` preset (head_dim 64) on the GPU, then decode the policy on the GPU and on the CPU from
# the same checkpoint (sampled tokens/s of each in policy_{cuda,cpu}.json) and score the GPU's.
pipeline_smoke() {
    local d=$1 b=$PWD/$BIN
    mkdir -p "$d"
    "$b/coa-generate" tasks --suite multihop --n 300 --split train --seed 1 --corpus-out "$d/corpus.parquet" -o "$d/tasks.parquet"
    "$b/coa-generate" mas -i "$d/tasks.parquet" --corpus "$d/corpus.parquet" \
        | "$b/coa-extract" | "$b/coa-filter" --where "hops <= 20" | "$b/coa-convert" -o "$d/coa_text.parquet"
    "$b/coa-tokenize" -i "$d/coa_text.parquet" --train-bpe --vocab-size 4096 --save-tokenizer "$d/tokenizer.json" \
        --max-len 2048 --overlong truncate -o "$d/tokens.parquet"
    "$b/coa-train-step" "$d/tokens.parquet" --objective sft --init-config small --tokenizer "$d/tokenizer.json" \
        --steps 150 --batch-tokens 32768 --lr 1e-3 --min-lr 1e-4 --warmup-steps 10 --device cuda \
        --save "$d/ckpt" --stats "$d/train.json" -o "$d/metrics.parquet"
    "$b/coa-filter" -i "$d/tasks.parquet" --rules none --where "task_id LIKE '%1'" -o "$d/rl_tasks.parquet" 2>/dev/null
    for dev in cuda cpu; do
        "$b/coa-generate" policy --checkpoint "$d/ckpt" -i "$d/rl_tasks.parquet" --corpus "$d/corpus.parquet" --n 4 \
            --batch 32 --max-response-tokens 512 --device $dev --stats "$d/policy_$dev.json" -o "$d/rollouts_$dev.parquet"
    done
    "$b/coa-score" -i "$d/rollouts_cuda.parquet" --tasks "$d/tasks.parquet" --max-response-len 512 \
        --report "$d/report.md" -o "$d/scores.parquet"
}

build() {
    grep -qxF "/$BIN/" .git/info/exclude 2>/dev/null || echo "/$BIN/" >> .git/info/exclude
    rm -rf "$BIN" && mkdir -p "$BIN"
    cargo build --release -p coa-kernels -p coa-train-step --bins --examples --tests \
        --message-format=json-render-diagnostics \
        | python3 -c '
import json, shutil, sys
want = {"gpu_bench", "gpu_kernels", "gpu_model", "device_select", "nvrtc_compile", "ptxas_report",
        "coa-train-step", "gpu_train", "gpu_trainstep_bench"}
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") != "compiler-artifact" or not m.get("executable") or m["target"]["name"] not in want:
        continue
    if "bin" in m["target"]["kind"] and m["profile"]["test"]:
        continue  # a binary built as its own unit-test harness has the same name: keep the binary
    shutil.copy(m["executable"], sys.argv[1] + "/" + m["target"]["name"])
    print("  " + m["target"]["name"], file=sys.stderr)
' "$BIN"
    # The other stages, for the end-to-end run on the GPU (pipeline_smoke below).
    cargo build --release -p coa-generate -p coa-extract -p coa-filter -p coa-convert -p coa-tokenize -p coa-score --bins
    for b in $PIPELINE_BINS; do cp "target/release/$b" "$BIN/"; done
    for b in gpu_bench gpu_kernels gpu_model device_select nvrtc_compile coa-train-step gpu_train gpu_trainstep_bench $PIPELINE_BINS; do
        test -x "$BIN/$b"
    done
    du -sh "$BIN"
    echo "now: run(command=\"bash bench/gpu/run.sh device\", carry=[\"$BIN\"], timeout_s=600)"
}

device() {
    OUT=${OUT:-bench/out/gpu}
    mkdir -p "$OUT"
    nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || true
    head -15 "$OUT/nvidia-smi.txt"
    # NVRTC, cuBLAS and the headers come from the machine's CUDA 13.0 (torch's nvidia wheels or
    # /usr/local/cuda): coa-kernels searches COA_PYTHON_SITE/nvidia/cu13/{lib,include}.
    COA_PYTHON_SITE=$(python3 -c 'import site; print(":".join(site.getsitepackages()))')
    export COA_PYTHON_SITE
    export COA_CACHE_DIR=/tmp/coa-ptx PYTHONUNBUFFERED=1
    # The tests must run on this GPU: without a working driver they fail rather than pass on the
    # emulated device (kernels/src/testing.rs).
    export COA_TEST_DEVICE=cuda
    local status=0
    : > "$OUT/tests.log"
    # gpu_train runs the stage binary too: the one carried here, not the build machine's path.
    export COA_TRAIN_STEP_BIN=$PWD/$BIN/coa-train-step
    for t in device_select nvrtc_compile gpu_kernels gpu_model gpu_train; do
        echo "== $t" | tee -a "$OUT/tests.log"
        "$BIN/$t" --test-threads=1 --nocapture >> "$OUT/tests.log" 2>&1 || status=1
        grep -E "^test result|FAILED|panicked|skipped" "$OUT/tests.log" | tail -3
    done
    "$BIN/ptxas_report" > "$OUT/ptxas.txt" 2>&1 || true
    echo "== our kernels"
    "$BIN/gpu_bench" > "$OUT/ours.jsonl" 2> "$OUT/ours.err" || { status=1; tail -20 "$OUT/ours.err"; }
    echo "== PyTorch"
    python3 bench/gpu/torch_ref.py attention xent copy > "$OUT/torch.jsonl" 2> "$OUT/torch.err" || { status=1; tail -20 "$OUT/torch.err"; }

    # Train step: `Trainer::step` on the GPU (what `coa-train-step --device cuda` runs) and PyTorch
    # eager, both on the ~125M Llama with a batch of 8 x 1024 tokens.
    echo "== train step"
    "$BIN/gpu_trainstep_bench" >> "$OUT/ours.jsonl" 2> "$OUT/trainstep.err" || { status=1; tail -20 "$OUT/trainstep.err"; }
    tail -2 "$OUT/trainstep.err"
    python3 bench/gpu/torch_ref.py trainstep >> "$OUT/torch.jsonl" 2>> "$OUT/torch.err" || { status=1; tail -20 "$OUT/torch.err"; }

    echo "== pipeline on the GPU (distill -> SFT small -> policy decoding, cuda and cpu)"
    if timeout 300 bash -c "set -euo pipefail; $(declare -f pipeline_smoke); BIN=$BIN; pipeline_smoke $OUT/pipeline" > "$OUT/pipeline.log" 2>&1; then
        grep -h sampled_tokens_per_s "$OUT"/pipeline/policy_*.json || true
    else
        status=1
        tail -20 "$OUT/pipeline.log"
    fi

    python3 bench/gpu/report.py "$OUT/ours.jsonl" "$OUT/torch.jsonl" "$OUT/tests.log" > "$OUT/gpu_bench.md"
    cat "$OUT/gpu_bench.md"
    return $status
}

case "${1:-}" in
    build) build ;;
    device) device ;;
    *) echo "usage: $0 build|device" >&2; exit 2 ;;
esac
