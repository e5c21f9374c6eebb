#!/usr/bin/env bash
# What a run is doing: its Slurm driver chain (pipelines/submit.sh) and every sharded stage
# (pipelines/shards.sh): parts done of all, the arrays still queued or running and their tasks'
# states, and whether the parts are merged. `make status RUN=...` runs it.
#
# usage: pipelines/status.sh runs/RUN
set -euo pipefail
rundir=${1:?usage: pipelines/status.sh runs/RUN}
[ -d "$rundir" ] || { echo "status.sh: $rundir: no such run directory" >&2; exit 2; }

# Each queued or running task of this user: "ARRAY_JOB_ID STATE" (none without Slurm).
queue=
if command -v squeue >/dev/null; then
  queue=$(squeue -r -h -u "$(id -un)" -o "%F %T" 2>/dev/null || true)
fi
# states JOB...: "2 RUNNING, 1 PENDING" for the tasks of these jobs.
states() {
  local ids=" $* "
  awk -v ids="$ids" 'index(ids, " " $1 " ") {n[$2]++} END {for (s in n) printf "%s%d %s", (k++ ? ", " : ""), n[s], s}' <<< "$queue"
}

echo "run: $rundir"
slurm=$rundir/slurm
if [ -s "$slurm/driver.jobid" ]; then
  driver=$(cat "$slurm/driver.jobid")
  now=$(states "$driver")
  if [ -n "$now" ]; then
    echo "driver: job $driver ${now#1 } (log $slurm/driver-$driver.log)"
  elif [ -s "$slurm/result" ]; then
    echo "driver: $(cat "$slurm/result") (last job $driver)"
  else
    echo "driver: job $driver is no longer queued or running, and left no result: see $slurm/driver-$driver.log"
  fi
  echo "  $(wc -l < "$slurm/drivers.tsv") driver job(s) so far ($slurm/drivers.tsv)"
fi

printf '%-52s %7s %7s  %s\n' "sharded stage" shards done "merged / arrays"
find "$rundir" -type d -name '*.shards' | sort | while read -r dir; do
  out=${dir%.shards}
  index=$dir/logs/index.tsv
  [ -s "$index" ] || continue
  total=$(( $(wc -l < "$index") - 1 ))
  done_parts=$(find "$dir" -maxdepth 1 -name "part-*-of-$(printf %05d "$total").parquet" | wc -l)
  what=
  if [ -e "$out" ] && [ "$(stat -c '%i %s %.9Y' "$out")" = "$(cat "$dir/merged.stamp" 2>/dev/null)" ]; then
    what=merged
  fi
  if [ -s "$dir/logs/jobs.tsv" ]; then
    live=
    for j in $(cut -f3 "$dir/logs/jobs.tsv" | sort -u); do
      now=$(states "$j")
      [ -n "$now" ] && live+="${live:+; }job $j: $now"
    done
    [ -n "$live" ] && what+="${what:+, }$live"
  fi
  [ -n "$what" ] || what=$([ "$done_parts" -eq "$total" ] && echo "not merged yet" || echo "none queued or running")
  printf '%-52s %7d %7d  %s\n' "${out#"$rundir"/}" "$total" "$done_parts" "$what"
done
