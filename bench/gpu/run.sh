#!/usr/bin/env bash
# The GPU run: correctness, kernel and train-step benchmarks against PyTorch, decoding and a pipeline
# smoke, in ONE device-tool call. The GPU machine has no Rust and no network, takes at most 64 MiB
# (working tree plus carried files), runs one command at most 10 minutes and returns at most 8
# files; so the run is built and packed here, and checked here first:
#
#   bash bench/gpu/run.sh pack       # HERE: release-build, strip and xz the binaries into .gpubin/
#   bash bench/gpu/run.sh rehearse   # HERE: the same device script on the emulated device, then the
#                                    # checks that it fits (make test runs it on the test build)
#   run(command="bash bench/gpu/run.sh device", carry=[".gpubin"], timeout_s=600)   # the GPU call
#
# The device half runs four phases, each under its own time budget inside one 9-minute total,
# most important first: (1) the GPU tests (every kernel against the CPU reference, the GPU model
# and decoder against the CPU's, coa-train-step --device cuda against the CPU trainer), (2) kernel
# TFLOP/s and GB/s against PyTorch's SDPA flash attention and F.cross_entropy, (3) the train step
# against PyTorch eager and torch.compile, (4) decoding tokens/s and the pipeline on the GPU. Each
# phase appends its section to $OUT/report.md as it ends (a phase cut at its budget says so, and
# the next one runs); every log goes into $OUT/logs.tar.gz at the end: two files come back.
set -euo pipefail
cd "$(dirname "$0")/../.."

PACK=.gpubin
ARCHIVE=$PACK/gpu-bins.tar.xz
LIMIT_BYTES=$((64 * 1024 * 1024))   # what one device call carries, working tree included
TOTAL_S=540                         # one command may run 600 s; 60 s stay for start-up slack
RESERVE_S=20                        # kept for the log tarball and the report's last lines
# Phase budgets in seconds, in the order they run (their sum plus the reserve is the total).
PHASES="tests:200 kernels:90 trainstep:140 pipeline:90"
# What the device needs: the GPU test binaries, the two benchmarks, and the two stages that run on
# a GPU. The smoke's inputs (tasks, the teacher's distilled tokens) are made here at pack time by
# the CPU stages (coa-generate, coa-extract, coa-convert, coa-tokenize), so those stay here.
TESTS="device_select nvrtc_compile gpu_kernels gpu_model gpu_train"
EXAMPLES="gpu_bench ptxas_report gpu_trainstep_bench"
STAGE_BINS="coa-train-step coa-generate"

die() { echo "run.sh: $*" >&2; exit 1; }

# Bytes a device call would carry: the files git would send (tracked, and untracked that are not
# ignored) plus the pack.
carried_bytes() {
    local tree pack
    if git rev-parse --is-inside-work-tree > /dev/null 2>&1; then
        tree=$(git ls-files -z -co --exclude-standard | xargs -0 -r stat -c %s -- 2>/dev/null | awk '{s += $1} END {print s + 0}')
    else  # a checkout without git metadata (an export, some CI): every file but the ignored folders
        tree=$(find . \( -path ./.git -o -path ./target -o -path ./runs -o -path ./.cache -o -path ./.cuda \
                  -o -path "./.venv*" -o -path ./bench/out -o -path "./$PACK" \) -prune -o -type f -printf '%s\n' \
               | awk '{s += $1} END {print s + 0}')
    fi
    pack=$(du -sb "$PACK" | cut -f1)
    echo $((tree + pack))
}

# pack [PROFILE]: build, strip and compress what the device runs into $ARCHIVE. The release
# profile for the GPU; the rehearsal packs the test build (dev), which `make test` has already built
# with the workspace's feature set, so nothing is rebuilt.
pack() {
    local profile=${1:-release} stage
    stage=$(mktemp -d)
    # The test build's own selection (make test: --workspace --bins --tests), else cargo would
    # resolve other features and build polars a second time.
    local select=(-p coa-kernels -p coa-train-step)
    [ "$profile" = dev ] && select=(--workspace --bins)
    cargo build --profile "$profile" "${select[@]}" --tests --examples --message-format=json-render-diagnostics \
        | python3 -c '
import json, shutil, sys
want = set(sys.argv[2].split())
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") != "compiler-artifact" or not m.get("executable") or m["target"]["name"] not in want:
        continue
    if "bin" in m["target"]["kind"] and m["profile"]["test"]:
        continue  # a binary built as its own test harness has the same name: keep the binary
    shutil.copy(m["executable"], sys.argv[1] + "/" + m["target"]["name"])
' "$stage" "$TESTS $EXAMPLES"
    local dir=target/release
    if [ "$profile" = dev ]; then
        dir=target/debug   # built above
    else
        make build   # the stages as `make build` selects them: the same features, no second build
    fi
    for b in $STAGE_BINS; do cp "$dir/$b" "$stage/"; done
    for b in $TESTS $EXAMPLES $STAGE_BINS; do
        [ -x "$stage/$b" ] || die "pack: $b was not built"
    done
    strip --strip-all "$stage"/*
    rm -rf "$PACK" && mkdir -p "$PACK/smoke"
    smoke_inputs "$dir" "$PACK/smoke" "$profile"
    # xz, not zstd: the GPU image's python3 unpacks it with the standard library alone.
    tar -C "$stage" -cf - . | xz -1 -T2 > "$ARCHIVE.tmp" && mv "$ARCHIVE.tmp" "$ARCHIVE"
    local raw
    raw=$(du -sb "$stage" | cut -f1)
    rm -rf "$stage"
    local carried
    carried=$(carried_bytes)
    printf 'pack: %s binaries, %d MB stripped, %s %d MB; a device call carries %d MB of %d MiB\n' \
        "$(echo $TESTS $EXAMPLES $STAGE_BINS | wc -w)" $((raw / 1000000)) "$ARCHIVE" \
        $(($(stat -c %s "$ARCHIVE") / 1000000)) $((carried / 1000000)) $((LIMIT_BYTES >> 20))
    ((carried < LIMIT_BYTES)) || die "pack: $carried bytes would be carried, over the device's $LIMIT_BYTES: the call would be refused"
    [ "$profile" = dev ] || echo 'now: run(command="bash bench/gpu/run.sh device", carry=[".gpubin"], timeout_s=600)'
}

# The pipeline smoke's inputs, made by the CPU stages in BIN_DIR: multihop tasks with their corpus,
# the teacher's runs distilled to CoA text and tokenized (a BPE tokenizer trained on them), held-out
# tasks for decoding, and the model to train (the `small` preset; for the rehearsal the smallest
# model the GPU path trains, head_dim 64, a few seconds a step on the emulated device). The sizes
# and the SFT settings go in smoke.env for the device half.
smoke_inputs() {
    local b=$1 d=$2 profile=$3
    local tasks=200 vocab=4096 max_len=2048 rl_tasks=16 model=small
    local env="SMOKE_STEPS=100 SMOKE_BATCH_TOKENS=32768 SMOKE_SAMPLES=4 SMOKE_RESPONSE_TOKENS=512"
    if [ "$profile" = dev ]; then
        tasks=12 vocab=512 max_len=1024 rl_tasks=1 model=model.json
        env="SMOKE_STEPS=1 SMOKE_BATCH_TOKENS=1024 SMOKE_SAMPLES=1 SMOKE_RESPONSE_TOKENS=16"
        printf '{"architectures":["LlamaForCausalLM"],"model_type":"llama","vocab_size":640,"hidden_size":128,"intermediate_size":256,"num_hidden_layers":2,"num_attention_heads":2,"num_key_value_heads":1,"max_position_embeddings":2048,"rms_norm_eps":1e-5,"rope_theta":10000.0,"tie_word_embeddings":true,"bos_token_id":0,"eos_token_id":0}\n' > "$d/model.json"
    fi
    echo "$env SMOKE_MODEL=$model" > "$d/smoke.env"
    "$b/coa-generate" tasks --suite multihop --n $tasks --split train --seed 1 --corpus-out "$d/corpus.parquet" -o "$d/tasks.parquet" 2>/dev/null
    "$b/coa-generate" mas -i "$d/tasks.parquet" --corpus "$d/corpus.parquet" 2>/dev/null \
        | "$b/coa-extract" 2>/dev/null | "$b/coa-convert" --skip-bad "$d/bad.parquet" -o "$d/coa_text.parquet" 2>/dev/null
    "$b/coa-tokenize" -i "$d/coa_text.parquet" --train-bpe --vocab-size $vocab --save-tokenizer "$d/tokenizer.json" \
        --max-len $max_len --overlong truncate -o "$d/tokens.parquet" 2>/dev/null
    "$b/coa-generate" tasks --suite multihop --n $rl_tasks --split test --seed 2 --corpus-out "$d/test_corpus.parquet" -o "$d/test_tasks.parquet" 2>/dev/null
    rm -f "$d/coa_text.parquet" "$d/bad.parquet" "$d/tasks.parquet" "$d/corpus.parquet"
}

# ---- the device half -------------------------------------------------------------------------

# Runs phase NAME (the shell function phase_NAME) under min(its budget, the time left), its output
# in $LOGS/NAME.log, then appends its section to the report: status, seconds, budget and what
# report.py makes of its results.
run_phase() {
    local name=$1 budget=$2 now left t0 rc=0 status
    now=$(date +%s)
    left=$((START + TOTAL_S - RESERVE_S - now))
    ((budget <= left)) || budget=$left
    if ((budget < 10)); then
        printf '\n## %s: not run (%d s left of the %d s total; a phase gets at least 10)\n' "$name" "$left" "$TOTAL_S" >> "$REPORT"
        printf '%s\tskipped\t0\t%s\n' "$name" "$budget" >> "$LOGS/phases.tsv"
        return
    fi
    echo "== $name (budget ${budget} s)"
    t0=$(date +%s)
    timeout --kill-after=5 "$budget" bash -euo pipefail -c "phase_$name" > "$LOGS/$name.log" 2>&1 || rc=$?
    local secs=$(($(date +%s) - t0))
    case $rc in
        0) status=ok ;;
        124|137) status="CUT at its budget of $budget s" ;;
        *) status="FAILED (exit $rc)"; FAILED=1 ;;
    esac
    [[ $rc == 124 || $rc == 137 ]] && FAILED=1
    printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$secs" "$budget" >> "$LOGS/phases.tsv"
    {
        printf '\n## %s: %s, %d s (budget %d s)\n\n' "$name" "$status" "$secs" "$budget"
        python3 bench/gpu/report.py "$name" "$LOGS" || echo "(report.py could not read this phase's logs)"
        if [ "$status" != ok ]; then
            printf '\nLast lines of %s.log:\n\n```\n' "$name"
            tail -15 "$LOGS/$name.log"
            printf '```\n'
        fi
    } >> "$REPORT"
    echo "   $status, ${secs} s"
}

# Phase 1: the GPU tests, one binary after another (a cut phase still reports the ones that ran).
phase_tests() {
    local filter
    for t in $TESTS; do
        echo "== test binary $t"
        # The rehearsal runs one quick test of each binary: the emulated device's CI run covers them all.
        filter=()
        [ "$GPU_DEVICE" = emu ] && filter=($(rehearsal_filter "$t"))
        "$BIN/$t" --test-threads=1 --nocapture "${filter[@]}" 2>&1 || echo "== test binary $t FAILED"
    done
    "$BIN/ptxas_report" || true
    ! grep -q "FAILED" "$LOGS/tests.log"
}

# The rehearsal's stand-in for a phase that overruns its budget.
phase_overrun() {
    sleep 60
}

rehearsal_filter() {
    case $1 in
        gpu_kernels) echo "rmsnorm::" ;;
        gpu_model) echo "unsupported_models_are_named" ;;
        gpu_train) echo "device_cuda_names_what_the_gpu_path_cannot_train" ;;
    esac
}

# Phase 2: our kernels, then PyTorch's on the same shapes.
phase_kernels() {
    "$BIN/gpu_bench" > "$LOGS/kernels_ours.jsonl"
    torch_ref attention xent copy > "$LOGS/kernels_torch.jsonl"
}

# Phase 3: the train step (Trainer::step on the GPU), then PyTorch eager and torch.compile.
phase_trainstep() {
    "$BIN/gpu_trainstep_bench" > "$LOGS/trainstep_ours.jsonl"
    torch_ref trainstep > "$LOGS/trainstep_torch.jsonl"
}

# PyTorch's side, where there is one (the GPU machine's python3 has it; the rehearsal says it is
# absent and goes on).
torch_ref() {
    if [ "$GPU_DEVICE" = emu ] && ! python3 -c "import torch" 2>/dev/null; then
        echo "PyTorch is not installed here: the rehearsal runs our side only"
        return 0
    fi
    python3 bench/gpu/torch_ref.py "$@"
}

# Phase 4: the GPU's part of `make pipeline`, shrunk: SFT a fresh model on the GPU on the distilled
# tokens made at pack time, then decode the policy with its tools on held-out tasks on the GPU and
# on the CPU from the same checkpoint (sampled tokens/s of each in policy_{gpu,cpu}.json).
phase_pipeline() {
    local d=$WORK/pipeline s=$PWD/$PACK/smoke
    mkdir -p "$d"
    # shellcheck disable=SC2046
    export $(cat "$s/smoke.env")
    local model=$SMOKE_MODEL
    [ -f "$s/$model" ] && model=$s/$model
    "$BIN/coa-train-step" "$s/tokens.parquet" --objective sft --init-config "$model" --tokenizer "$s/tokenizer.json" \
        --steps "$SMOKE_STEPS" --batch-tokens "$SMOKE_BATCH_TOKENS" --lr 1e-3 --min-lr 1e-4 --warmup-steps 2 --device "$GPU_DEVICE" \
        --save "$d/ckpt" --stats "$LOGS/train.json" -o "$LOGS/train_metrics.parquet"
    local dev flag
    for dev in gpu cpu; do
        flag=$GPU_DEVICE
        [ $dev = cpu ] && flag=cpu
        "$BIN/coa-generate" policy --checkpoint "$d/ckpt" -i "$s/test_tasks.parquet" --corpus "$s/test_corpus.parquet" --n "$SMOKE_SAMPLES" \
            --batch 32 --max-response-tokens "$SMOKE_RESPONSE_TOKENS" --device "$flag" --stats "$LOGS/policy_$dev.json" -o "$LOGS/rollouts_$dev.parquet"
    done
}

# The device call: unpack, describe the machine, run the phases, tar the logs. GPU_DEVICE=emu (the
# rehearsal) runs the same on the emulated device with small shapes.
device() {
    START=$(date +%s)
    GPU_DEVICE=${GPU_DEVICE:-cuda}
    OUT=${OUT:-bench/out/gpu}
    mkdir -p "$OUT"
    [ -f "$ARCHIVE" ] || die "device: $ARCHIVE is missing: run 'bash bench/gpu/run.sh pack' here and carry $PACK"
    WORK=$(mktemp -d /tmp/coa-gpu.XXXXXX)
    BIN=$WORK/bin LOGS=$WORK/logs REPORT=$OUT/report.md FAILED=0
    mkdir -p "$BIN" "$LOGS"
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$ARCHIVE" "$BIN"
    # The logs come back as one file however the run ends (the rehearsal calls this function, so
    # the normal end tars them itself: an EXIT trap would fire only when the shell exits).
    trap 'tar -C "$WORK" -czf "$OUT/logs.tar.gz" logs' EXIT

    export START GPU_DEVICE WORK BIN LOGS TESTS PACK PYTHONUNBUFFERED=1 COA_CACHE_DIR=$WORK/ptx
    export COA_TRAIN_STEP_BIN=$BIN/coa-train-step   # gpu_train runs the stage binary: the carried one
    if [ "$GPU_DEVICE" = emu ]; then
        export COA_TEST_DEVICE=emu COA_BENCH_DEVICE=emu COA_BENCH_SMALL=1 COA_BENCH_ITERS=2
    else
        # NVRTC and cuBLAS of the machine's CUDA 13 (torch's nvidia wheels or /usr/local/cuda). The
        # tests must run on this GPU: without a working driver they fail rather than pass on the
        # emulated device (kernels/src/testing.rs).
        COA_PYTHON_SITE=$(python3 -c 'import site; print(":".join(site.getsitepackages()))')
        export COA_PYTHON_SITE COA_TEST_DEVICE=cuda COA_BENCH_DEVICE=cuda
    fi
    export -f phase_tests phase_kernels phase_trainstep phase_pipeline phase_overrun torch_ref rehearsal_filter

    {
        echo "# GPU run $(date -u +%Y-%m-%dT%H:%MZ) (bench/gpu/run.sh device, GPU_DEVICE=$GPU_DEVICE)"
        echo
        echo "- GPU: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo 'no nvidia-smi')"
        echo "- CUDA driver API: $(nvidia-smi 2>/dev/null | grep -o 'CUDA Version: [0-9.]*' || echo unknown)"
        echo "- PyTorch: $(python3 -c 'import torch; print(torch.__version__, torch.version.cuda)' 2>/dev/null || echo 'not installed')"
        echo "- CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores"
        echo "- carried: $(($(stat -c %s "$ARCHIVE") / 1000000)) MB of binaries; budgets (s): $PHASES, total $TOTAL_S"
    } > "$REPORT"
    cat "$REPORT"

    local p
    for p in $PHASES; do
        run_phase "${p%%:*}" "${p##*:}"
    done
    printf '\nTotal %d s of %d.\n' $(($(date +%s) - START)) "$TOTAL_S" >> "$REPORT"
    tar -C "$WORK" -czf "$OUT/logs.tar.gz" logs
    trap - EXIT
    rm -rf "$WORK"
    echo
    cat "$REPORT"
    return $FAILED
}

# ---- the rehearsal ------------------------------------------------------------------------------

# Packs the test build, runs the device script on the emulated device into a scratch $OUT, then
# checks what the device tool would refuse or lose: the carried size, the files under $OUT (at
# most 8, 16 MiB each, 2 folders deep, plain names), the phase budgets (sum within the total, each
# phase run and finished inside its own), and that a phase over its budget is cut and reported
# while the run goes on.
rehearse() {
    local t0 out sum=0 p
    t0=$(date +%s)
    pack dev
    out=$(mktemp -d)
    for p in $PHASES; do sum=$((sum + ${p##*:})); done
    ((sum + RESERVE_S <= TOTAL_S)) || die "rehearse: phase budgets sum to $sum s + $RESERVE_S s reserve, over the $TOTAL_S s total"
    ((TOTAL_S <= 570)) || die "rehearse: a $TOTAL_S s total leaves too little of the 600 s command limit"

    OUT=$out GPU_DEVICE=emu device || die "rehearse: the device script failed on the emulated device (its report: $out/report.md)"
    check_out "$out"
    local name rc secs budget
    while IFS=$'\t' read -r name rc secs budget; do
        [ "$rc" = skipped ] && die "rehearse: phase $name was not run"
        [ "$rc" = 0 ] || die "rehearse: phase $name exited $rc"
        ((secs <= budget)) || die "rehearse: phase $name took $secs s, over its budget of $budget s"
    done < <(tar -xzOf "$out/logs.tar.gz" logs/phases.tsv)

    # The time guard: a phase that overruns is cut at its budget, reported, and the run goes on.
    local guard
    guard=$(mktemp -d)
    OUT=$guard GPU_DEVICE=emu PHASES="overrun:10 kernels:60" device > /dev/null 2>&1 && \
        die "rehearse: a phase cut at its budget did not fail the run"
    grep -q "## overrun: CUT at its budget of 10 s" "$guard/report.md" || die "rehearse: the cut phase is not reported as cut ($guard/report.md)"
    grep -q "## kernels: ok" "$guard/report.md" || die "rehearse: the phase after a cut one did not run"
    check_out "$guard"
    rm -rf "$out" "$guard"
    echo "rehearse: the device run fits: $(echo $PHASES) (s), $(($(date +%s) - t0)) s here on the emulated device"
}

check_out() {
    python3 - "$1" <<'EOF'
import os, re, sys
root = sys.argv[1]
files = []
for d, dirs, names in os.walk(root):
    for n in dirs + names:
        rel = os.path.relpath(os.path.join(d, n), root)
        if not re.fullmatch(r"[A-Za-z0-9._-]+", n):
            sys.exit(f"rehearse: {rel}: the device tool does not return names with other characters")
    for n in names:
        rel = os.path.relpath(os.path.join(d, n), root)
        if rel.count(os.sep) > 2:
            sys.exit(f"rehearse: {rel}: more than 2 folders down, it would not come back")
        size = os.path.getsize(os.path.join(d, n))
        if size > 16 << 20:
            sys.exit(f"rehearse: {rel}: {size} bytes, over the 16 MiB a returned file may have")
        files.append(rel)
if len(files) > 8:
    sys.exit(f"rehearse: {len(files)} files under $OUT, the device tool returns 8: {sorted(files)}")
for want in ("report.md", "logs.tar.gz"):
    if want not in files:
        sys.exit(f"rehearse: $OUT has no {want}")
EOF
}

case "${1:-}" in
    pack|build) pack "${PROFILE:-release}" ;;
    device) device ;;
    rehearse) rehearse ;;
    *) echo "usage: $0 pack|device|rehearse" >&2; exit 2 ;;
esac
