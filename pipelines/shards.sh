#!/usr/bin/env bash
# Runs one stage command as N shards, locally (parallel processes) or as a Slurm job array, retries
# the shards that left no output, and merges the shard outputs into one table in the unsharded
# row order. Slurm does the scheduling; this is the glue. Called by the pipelines/*.mk rules.
#
# usage: pipelines/shards.sh --executor local|slurm --shards N --out FILE --order TASKS
#            [--stats FILE] [--retries K] [--bin DIR] [--inputs "FILE..."]... [--content FILE]...
#            [--var NAME=VALUE]... [--input-parts INPUT]
#            [--partition P] [--time T] [--cpus C] [--mem M] [--sbatch-flags "..."] -- 'COMMAND'
#
# COMMAND is a bash snippet run once per shard with these variables set:
#   $SHARD  the flag `--shard I/N` (0-based I), to pass to every stage of the snippet
#   $OUT    the shard's output table, FILE.shards/part-IIIII-of-NNNNN.parquet
#   $STATS  the shard's --stats file,  FILE.shards/part-IIIII-of-NNNNN.json
#   $IN     with --input-parts INPUT: shard I's rows of INPUT. Where INPUT was itself merged by this
#           script from N shards (INPUT.shards/merged.stamp names the file it wrote), that is
#           INPUT.shards/part-IIIII-of-NNNNN.parquet, so each shard reads its own rows and not the
#           whole table; otherwise INPUT (the stage's --shard picks the rows).
# and each --var NAME=VALUE (e.g. the iteration and checkpoint of an RL loop), written into the job
# script, which is therefore complete on its own (Slurm need not pass the environment on).
# A shard whose output exists is done and never rerun, unless it is older than an --inputs file or
# was written by another job script (another COMMAND, --var value, or --content FILE whose SHA-256,
# kept in the job script, changed: a rewrite with the same bytes keeps the parts): stages write their outputs
# under a temporary name and rename them when they succeed, so an output that exists is complete.
# Rerunning the same command resumes a half-finished array.
# After up to K retries of the missing shards, the parts are merged with
#   coa-filter --rules none -i 'FILE.shards/part-*-of-NNNNN.parquet' --task-order TASKS -o FILE
# and their --stats files with pipelines/merge_stats.py into --stats FILE.
#
# With --executor slurm the missing shards are submitted as job arrays (`sbatch --array`) with
# --partition (empty: the cluster's default), --time, --cpus-per-task, --mem (empty: the default),
# --requeue and any --sbatch-flags. Array indices must stay under the cluster's MaxArraySize (read
# from `scontrol show config`; 1001 by default), so the shards go in arrays of at most that many,
# each with an offset the job script adds (SHARD_OFFSET); --array-limit K runs at most K tasks of
# an array at once (`%K`). A submission sbatch refuses is an error at once, not a retry. The
# arrays are waited for until none of their tasks is queued or running (a requeued task, after a
# preemption or a node failure, is waited for too; no accounting database is needed: which shards
# failed is read from their missing outputs). Each retry doubles the time limit (a shard killed at
# its limit would hit it again). logs/index.tsv lists every shard: the job that ran it last, the
# attempt, done or missing, its seconds (from its --stats) and its log.
#
# Preemption and time limits: Slurm sends SIGTERM to every process of the task (then SIGKILL after
# its KillWait); the stages remove their temporary outputs on SIGTERM and die of it, so the shard
# is missing and rerun (the task is requeued, or resubmitted here). Temporary files a SIGKILL left
# are removed before a shard is resubmitted.
#
# Submitted arrays are kept in logs/jobs.tsv (chain, attempt, job id) and the array task that ran
# each shard in logs/tasks.tsv, so that a rerun while an earlier run's arrays are still queued or
# running attaches to them (waits for them) instead of submitting the same shards again.
# Detached (COA_SLURM_DETACH=FILE, set by the driver job of pipelines/submit.sh): the missing
# shards are submitted, or the arrays still queued or running are found, their job ids appended to
# FILE, and the script exits with status 3 at once; the driver reruns make in a job that depends
# on them. Retries are counted per chain of driver jobs (COA_SLURM_CHAIN).
set -euo pipefail

executor=local shards= out= order= stats= retries=2 bin=target/release inputs= vars= contents=
partition= time=01:00:00 cpus=1 mem= sbatch_flags= array_limit= poll=${SHARDS_POLL_SECONDS:-5} input_parts=
while [ $# -gt 0 ]; do
  case "$1" in
    --executor) executor=$2; shift 2 ;;
    --shards) shards=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --order) order=$2; shift 2 ;;
    --stats) stats=$2; shift 2 ;;
    --retries) retries=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    --inputs) inputs="$inputs $2"; shift 2 ;;
    --content) contents="$contents $2"; shift 2 ;;
    --input-parts) input_parts=$2; shift 2 ;;
    --var)
      [[ "$2" =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || { echo "shards.sh: --var $2: expected NAME=VALUE" >&2; exit 2; }
      vars+="export ${2%%=*}=$(printf '%q' "${2#*=}")"$'\n'; shift 2 ;;
    --partition) partition=$2; shift 2 ;;
    --time) time=$2; shift 2 ;;
    --cpus) cpus=$2; shift 2 ;;
    --mem) mem=$2; shift 2 ;;
    --sbatch-flags) sbatch_flags=$2; shift 2 ;;
    --array-limit) array_limit=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "shards.sh: unknown argument $1 (see the usage at the top of $0)" >&2; exit 2 ;;
  esac
done
[ $# -eq 1 ] || { echo "shards.sh: expected one COMMAND after --" >&2; exit 2; }
command=$1
case "$executor" in local|slurm) ;; *) echo "shards.sh: EXECUTOR=$executor: expected local or slurm" >&2; exit 2 ;; esac
[[ "$shards" =~ ^[1-9][0-9]*$ ]] || { echo "shards.sh: SHARDS=$shards: expected a whole number of at least 1" >&2; exit 2; }
[[ "$retries" =~ ^[0-9]+$ ]] || { echo "shards.sh: MAX_RETRIES=$retries: expected a whole number (0 or more)" >&2; exit 2; }
[[ -z "$array_limit" || "$array_limit" =~ ^[1-9][0-9]*$ ]] || { echo "shards.sh: SLURM_ARRAY_LIMIT=$array_limit: expected a whole number of at least 1 (or empty)" >&2; exit 2; }
[ -n "$out" ] && [ -n "$order" ] || { echo "shards.sh: --out and --order are required" >&2; exit 2; }
if [ "$executor" = slurm ] && ! command -v sbatch >/dev/null; then
  echo "shards.sh: EXECUTOR=slurm but sbatch is not on PATH (run on a Slurm login node, or EXECUTOR=local)" >&2; exit 2
fi

dir=$out.shards
n5=$(printf %05d "$shards")
mkdir -p "$dir/logs"
dir=$(cd "$dir" && pwd)
part() { printf '%s/part-%05d-of-%s' "$dir" "$1" "$n5"; }

# Parts older than an input are from an earlier run: not done.
for i in $(seq 0 $((shards - 1))); do
  p=$(part "$i").parquet
  for f in $inputs; do
    if [ -e "$p" ] && [ "$f" -nt "$p" ]; then rm -f "$p" "$(part "$i").json"; fi
  done
done

digests=
for f in $contents; do
  [ -f "$f" ] || { echo "shards.sh: --content $f: no such file" >&2; exit 2; }
  digests+="# made from $f with SHA-256 $(sha256sum < "$f" | cut -d' ' -f1)"$'\n'
done

# $IN of the job script: shard I's part of --input-parts INPUT when INPUT is the file this script
# merged from them (its inode, size and modification time as merged.stamp recorded), else INPUT.
in_lines=
if [ -n "$input_parts" ]; then
  in_abs=$(cd "$(dirname "$input_parts")" && pwd)/$(basename "$input_parts")
  in_lines="in_part=\$(printf '%s/part-%05d-of-%s.parquet' $(printf '%q' "$in_abs.shards") \"\$i\" '$n5')
if [ -e \"\$in_part\" ] && [ \"\$(stat -c '%i %s %.9Y' $(printf '%q' "$in_abs"))\" = \"\$(cat $(printf '%q' "$in_abs.shards/merged.stamp") 2>/dev/null)\" ]; then
  export IN=\$in_part
else
  export IN=$(printf '%q' "$in_abs")
fi"$'\n'
fi

# The one job script both executors run: shard I from SLURM_ARRAY_TASK_ID (Slurm) or SHARD_INDEX (local).
job=$dir/job.sh
cat > "$job.tmp" <<JOB
#!/usr/bin/env bash
# One shard of: $out (written by pipelines/shards.sh)
${digests}set -euo pipefail
i=\${SHARD_INDEX:-\$(( \${SHARD_OFFSET:-0} + \${SLURM_ARRAY_TASK_ID:?neither SHARD_INDEX nor SLURM_ARRAY_TASK_ID is set} ))}
p=\$(printf '%s/part-%05d-of-%s' '$dir' "\$i" '$n5')
export SHARD="--shard \$i/$shards" OUT=\$p.parquet STATS=\$p.json
${vars}${in_lines}if [ -e "\$OUT" ]; then echo "shard \$i/$shards: \$OUT exists, not rerun"; exit 0; fi
cd '$(pwd)'
echo "shard \$i/$shards on \$(hostname)\${IN:+ from \$IN}: \$OUT"
exec bash -euo pipefail -c $(printf '%q' "$command")
JOB

# Submissions (logs/jobs.tsv: chain, attempt, job id) and the array task that ran each shard
# (logs/tasks.tsv: shard, job, attempt, log), kept across runs of this script.
jobs_file=$dir/logs/jobs.tsv tasks_file=$dir/logs/tasks.tsv
# The recorded jobs with a task still queued, running or requeued.
live_jobs() {
  [ "$executor" = slurm ] && [ -s "$jobs_file" ] || return 0
  local queue; queue=$(squeue -h -u "$(id -un)" -o %F 2>/dev/null | sort -u)
  [ -n "$queue" ] || return 0
  cut -f3 "$jobs_file" | sort -u | grep -Fx -f <(printf '%s\n' "$queue") || true
}
live=$(live_jobs | paste -sd' ' -)

# Parts of another job script (another command, --var value or --content) are not this run's.
if [ -e "$job" ] && ! cmp -s "$job" "$job.tmp"; then
  if [ -n "$live" ]; then
    rm -f "$job.tmp"
    echo "shards.sh: $out: job(s) $live of an earlier command are still queued or running (logs/jobs.tsv); wait for them or scancel them, then rerun" >&2
    exit 1
  fi
  rm -f "$dir"/part-*-of-"$n5".parquet "$dir"/part-*-of-"$n5".json "$jobs_file" "$tasks_file"
fi
mv "$job.tmp" "$job"
chmod +x "$job"

missing() {
  for i in $(seq 0 $((shards - 1))); do [ -e "$(part "$i").parquet" ] || echo "$i"; done
}
# Temporary outputs of the shards about to run again (a stage killed by SIGKILL leaves its own).
clean_temps() {
  local i
  for i in "$@"; do rm -f "$dir/.$(basename "$(part "$i")")".*.tmp*; done
}

# Slurm time limits (M, M:S, H:M:S, D-H, D-H:M, D-H:M:S) in minutes, and back as D-HH:MM:00.
minutes() {
  local t=$1 d=0 h=0 m=0 s=0
  if [[ "$t" == *-* ]]; then
    d=${t%%-*}; t=${t#*-}
    IFS=: read -r h m s <<< "$t"
  else
    local n; n=$(tr -cd : <<< "$t" | wc -c)
    case $n in 0) m=$t ;; 1) IFS=: read -r m s <<< "$t" ;; *) IFS=: read -r h m s <<< "$t" ;; esac
  fi
  echo $(( 10#${d:-0} * 1440 + 10#${h:-0} * 60 + 10#${m:-0} + (10#${s:-0} > 0 ? 1 : 0) ))
}
slurm_time() { printf '%d-%02d:%02d:00' $(($1 / 1440)) $(($1 % 1440 / 60)) $(($1 % 60)); }
if [ "$executor" = slurm ]; then
  [[ "$time" =~ ^([0-9]+-)?[0-9]+(:[0-9]+){0,2}$ ]] || { echo "shards.sh: SLURM_TIME=$time: expected a Slurm time (MM, HH:MM:SS, D-HH:MM:SS)" >&2; exit 2; }
  max_array=$(scontrol show config 2>/dev/null | awk -F= '/^MaxArraySize/ {gsub(/ /, "", $2); print $2}')
  [[ "$max_array" =~ ^[1-9][0-9]*$ ]] || max_array=1001
fi
chain=${COA_SLURM_CHAIN:-local-$$-$(date +%s)}

# submit_arrays ATTEMPT TIME SHARD...: the shards as arrays of indices under MaxArraySize; adds
# the job ids to jobs_submitted. Exits on a refused submission.
submit_arrays() {
  local attempt=$1 limit=$2; shift 2
  local offset=-1 spec= prev=-2 start=-1 i
  flush() {
    [ "$offset" -ge 0 ] || return 0
    [ "$start" -ge 0 ] && { [ "$prev" -gt "$start" ] && spec+="${spec:+,}$start-$prev" || spec+="${spec:+,}$start"; }
    local jid err
    err=$(mktemp)
    # shellcheck disable=SC2086
    if ! jid=$(sbatch --parsable --array="$spec${array_limit:+%$array_limit}" --export="ALL,SHARD_OFFSET=$offset" \
        --job-name="coa-$(basename "$out" .parquet)" --requeue --open-mode=append \
        ${partition:+--partition="$partition"} --time="$limit" --cpus-per-task="$cpus" ${mem:+--mem="$mem"} $sbatch_flags \
        --output="$dir/logs/slurm-%A-a$attempt-o$offset-%a.log" "$job" 2> "$err"); then
      echo "shards.sh: $out: sbatch refused the array of shards $offset+($spec): $(tr '\n' ' ' < "$err")" >&2
      rm -f "$err"; exit 1
    fi
    rm -f "$err"
    jid=${jid%%;*}
    echo "shards.sh: $out: submitted job $jid: shards $offset+($spec), time limit $limit" >&2
    jobs_submitted+="${jobs_submitted:+ }$jid"
    printf '%s\t%s\t%s\n' "$chain" "$attempt" "$jid" >> "$jobs_file"
    for r in $(expand "$spec"); do
      printf '%s\t%s\t%s\t%s\n' $((offset + r)) "${jid}_$r" "$attempt" "$dir/logs/slurm-$jid-a$attempt-o$offset-$r.log" >> "$tasks_file"
    done
    offset=-1 spec= prev=-2 start=-1
  }
  for i in "$@"; do
    if [ "$offset" -ge 0 ] && [ $((i - offset)) -ge "$max_array" ]; then flush; fi
    [ "$offset" -lt 0 ] && offset=$i
    local r=$((i - offset))
    if [ "$r" -ne $((prev + 1)) ]; then
      [ "$start" -ge 0 ] && { [ "$prev" -gt "$start" ] && spec+="${spec:+,}$start-$prev" || spec+="${spec:+,}$start"; }
      start=$r
    fi
    prev=$r
  done
  flush
}
# The indices of an --array spec like 0-3,7.
expand() {
  local part
  for part in ${1//,/ }; do
    if [[ "$part" == *-* ]]; then seq "${part%-*}" "${part#*-}"; else echo "$part"; fi
  done
}
# Waits until no task of the recorded jobs is queued, running or requeued.
wait_jobs() {
  while [ -n "$(live_jobs)" ]; do sleep "$poll"; done
}

# logs/index.tsv: shard, job (Slurm JOBID_TASK or local), attempt, done|missing, seconds, log.
write_index() {
  declare -A ran_by ran_attempt ran_log
  local i p state secs job att log
  if [ -s "$tasks_file" ]; then
    while IFS=$'\t' read -r i job att log; do ran_by[$i]=$job ran_attempt[$i]=$att ran_log[$i]=$log; done < "$tasks_file"
  fi
  {
    printf 'shard\tjob\tattempt\tstate\tseconds\tlog\n'
    for i in $(seq 0 $((shards - 1))); do
      p=$(part "$i") state=missing secs=
      if [ -e "$p.parquet" ]; then
        state=done
        secs=$(grep -o '"seconds": *[0-9.]*' "$p.json" 2>/dev/null | head -1 | grep -o '[0-9.]*$' || true)
      fi
      printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$i" "${ran_by[$i]:-}" "${ran_attempt[$i]:-}" "$state" "$secs" "${ran_log[$i]:-}"
    done
  } > "$dir/logs/index.tsv.tmp"
  mv "$dir/logs/index.tsv.tmp" "$dir/logs/index.tsv"
}
last_log() { [ -s "$tasks_file" ] || return 0; awk -F'\t' -v s="$1" '$1 == s {l = $4} END {print l}' "$tasks_file"; }
give_up() {
  write_index
  echo "shards.sh: $out: shard(s) $1 still have no output after $retries retries; logs in $dir/logs/ (index.tsv)" >&2
  local i log
  for i in ${1//,/ }; do
    log=$(last_log "$i")
    [ -n "$log" ] && { echo "--- shard $i, $log:" >&2; tail -5 "$log" >&2 || true; }
  done
  exit 1
}
# run_missing ATTEMPT TODO: runs (local) or submits (Slurm) the shards of TODO (comma list).
run_missing() {
  local attempt=$1 todo=$2 i
  [ "$attempt" -gt 0 ] && echo "shards.sh: $out: rerunning shard(s) $todo (retry $attempt of $retries)" >&2
  clean_temps ${todo//,/ }
  if [ "$executor" = local ]; then
    for i in ${todo//,/ }; do printf '%s\t%s\t%s\t%s\n' "$i" local "$attempt" "$dir/logs/local-a$attempt-$i.log" >> "$tasks_file"; done
    write_index
    # As many at once as there are CPUs (a shard's own threads share them).
    printf '%s\n' ${todo//,/ } | xargs -P "$(nproc)" -I{} \
      bash -c 'SHARD_INDEX=$1 bash "$2" > "$3/logs/local-a$4-$1.log" 2>&1 || true' _ {} "$job" "$dir" "$attempt"
  else
    jobs_submitted=
    submit_arrays "$attempt" "$(slurm_time $(( $(minutes "$time") << attempt )))" ${todo//,/ }
    write_index
  fi
}

todo=$(missing | paste -sd, -)
if [ -n "${COA_SLURM_DETACH:-}" ] && [ "$executor" = slurm ] && [ -n "$todo" ]; then
  # Detached: submit (or find) the arrays, hand their ids to the driver, and return.
  if [ -n "$live" ]; then
    echo "shards.sh: $out: job(s) $live still queued or running; the driver goes on when they end" >&2
    jobs_submitted=$live
  else
    attempt=0
    [ -s "$jobs_file" ] && attempt=$(awk -F'\t' -v c="$chain" '$1 == c {print $2}' "$jobs_file" | sort -u | wc -l)
    [ "$attempt" -gt "$retries" ] && give_up "$todo"
    run_missing "$attempt" "$todo"
    echo "shards.sh: $out: the driver goes on when job(s) $jobs_submitted end" >&2
  fi
  printf '%s\n' $jobs_submitted >> "$COA_SLURM_DETACH"
  write_index
  exit 3
fi
if [ -n "$live" ]; then
  echo "shards.sh: $out: attaching to job(s) $live of an earlier run, still queued or running" >&2
  wait_jobs
fi
attempt=0
while :; do
  todo=$(missing | paste -sd, -)
  [ -z "$todo" ] && break
  [ "$attempt" -gt "$retries" ] && give_up "$todo"
  run_missing "$attempt" "$todo"
  [ "$executor" = slurm ] && wait_jobs
  attempt=$((attempt + 1))
done

write_index
"$bin/coa-filter" --rules none -i "$dir/part-*-of-$n5.parquet" --task-order "$order" --stats "$dir/merge.json" -o "$out"
# What the merge wrote: a later stage's --input-parts reads the parts only while this is the file.
stat -c '%i %s %.9Y' "$out" > "$dir/merged.stamp.tmp" && mv "$dir/merged.stamp.tmp" "$dir/merged.stamp"
if [ -n "$stats" ]; then
  python3 "$(dirname "$0")/merge_stats.py" "$dir"/part-*-of-"$n5".json > "$stats.tmp"
  mv "$stats.tmp" "$stats"
fi
echo "shards.sh: $out: $shards shard(s) merged ($executor)" >&2
