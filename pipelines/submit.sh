#!/usr/bin/env bash
# Submit and return: runs `make GOAL... VAR=VALUE...` on Slurm as a chain of short driver jobs,
# so no process has to stay alive on the login node for the hours a large run takes.
#
# usage: pipelines/submit.sh --rundir runs/RUN [--time T] [--cpus C] [--mem M] [--partition P]
#            [--sbatch-flags "..."] -- GOAL... VAR=VALUE...
# (`make submit GOALS="pipeline" EXECUTOR=slurm SHARDS=64 ...` calls it with the Makefile's values.)
#
# The driver is a Slurm job (--time/--cpus/--mem: the resources of the steps that run in it: the
# merges, the filters, SFT and DAPO) that runs `make -k GOAL... EXECUTOR=slurm VAR=VALUE...`. Every
# sharded stage that still has shards to run submits its arrays and returns at once
# (pipelines/shards.sh with COA_SLURM_DETACH); make goes on with whatever does not depend on them.
# When make ends, the driver submits the next driver with --dependency=afterany on those arrays and
# exits; the next one reruns the same make, which merges the finished shards (retrying the missing
# ones, up to MAX_RETRIES per stage over the whole chain) and goes on to the next phase. afterany,
# not afterok: a failed shard is the next driver's to retry, where afterok would leave it waiting
# forever. When make has nothing left to submit, the last driver ends with make's status.
#
# Everything is kept in runs/RUN/slurm/: driver.sh (the job script), driver.jobid (the chain's
# current driver), drivers.tsv (every driver: job, submitted at, what it waits for), driver-JOB.log,
# and result (done, or failed with make's status) once the chain ends. A second submit while the
# chain's driver is queued or running attaches to it: it says so and submits nothing.
# `make status RUN=...` shows the driver and every sharded stage.
set -euo pipefail

rundir= time=12:00:00 cpus=4 mem=16G partition= sbatch_flags=
while [ $# -gt 0 ]; do
  case "$1" in
    --rundir) rundir=$2; shift 2 ;;
    --time) time=$2; shift 2 ;;
    --cpus) cpus=$2; shift 2 ;;
    --mem) mem=$2; shift 2 ;;
    --partition) partition=$2; shift 2 ;;
    --sbatch-flags) sbatch_flags=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "submit.sh: unknown argument $1 (see the usage at the top of $0)" >&2; exit 2 ;;
  esac
done
[ -n "$rundir" ] || { echo "submit.sh: --rundir is required" >&2; exit 2; }
[ $# -gt 0 ] || { echo "submit.sh: expected the make goals and settings after --" >&2; exit 2; }
command -v sbatch >/dev/null || { echo "submit.sh: sbatch is not on PATH (run on a Slurm login node)" >&2; exit 2; }
for a in "$@"; do
  case "$a" in
    EXECUTOR=slurm) ;;
    EXECUTOR=*) echo "submit.sh: $a: a submitted run shards on Slurm (EXECUTOR=slurm)" >&2; exit 2 ;;
  esac
done

state=$rundir/slurm
mkdir -p "$state"
state=$(cd "$state" && pwd)
user=$(id -un)
# A chain whose driver is still queued or running: attach, submit nothing.
if [ -s "$state/driver.jobid" ]; then
  current=$(cat "$state/driver.jobid")
  st=$(squeue -h -u "$user" -j "$current" -o %T 2>/dev/null | head -1 || true)
  if [ -n "$st" ]; then
    echo "submit.sh: $rundir is already being run by driver job $current ($st): not submitted again."
    echo "  follow it: make status RUN=$(basename "$rundir")   log: $state/driver-$current.log   start over: scancel $current"
    exit 0
  fi
fi

q() { printf '%q ' "$@"; }
chain=$(date +%s)-$$
cat > "$state/driver.sh.tmp" <<JOB
#!/usr/bin/env bash
#SBATCH --job-name=coa-driver-$(basename "$rundir")
#SBATCH --output=$state/driver-%j.log
#SBATCH --open-mode=append
#SBATCH --time=$time
#SBATCH --cpus-per-task=$cpus
${mem:+#SBATCH --mem=$mem
}${partition:+#SBATCH --partition=$partition
}# The driver of $rundir on Slurm (written by pipelines/submit.sh): runs make; the sharded stages
# submit their arrays and return; this job submits the next driver to run once they end.
set -uo pipefail
cd $(printf %q "$(pwd)")
export COA_SLURM_CHAIN=$chain
state=$(printf %q "$state")
user=\$(id -un)
while :; do
  export COA_SLURM_DETACH=\$state/pending-\$SLURM_JOB_ID
  : > "\$COA_SLURM_DETACH"
  echo "driver job \$SLURM_JOB_ID on \$(hostname), \$(date -u +%FT%TZ): make -k $(q "$@")"
  # CARGO=true: the binaries were built by make submit; nothing is rebuilt on the nodes.
  make --no-print-directory -k CARGO=true $(q "$@") EXECUTOR=slurm
  rc=\$?
  waited=\$(sort -u "\$COA_SLURM_DETACH")
  rm -f "\$COA_SLURM_DETACH"
  [ -n "\$waited" ] || break
  # Of the arrays make submitted or found, those still queued or running (the others ended
  # already: make runs again here at once).
  live=\$(squeue -h -u "\$user" -o %F 2>/dev/null | sort -u | grep -Fx -f <(printf '%s\n' \$waited) | paste -sd: - || true)
  [ -n "\$live" ] || continue
  # shellcheck disable=SC2086
  if ! next=\$(sbatch --parsable --dependency=afterany:\$live $sbatch_flags "\$state/driver.sh"); then
    echo "driver: sbatch refused the next driver job" >&2
    echo "failed: the next driver could not be submitted (see \$state/driver-\$SLURM_JOB_ID.log)" > "\$state/result"
    exit 1
  fi
  next=\${next%%;*}
  echo "\$next" > "\$state/driver.jobid.tmp" && mv "\$state/driver.jobid.tmp" "\$state/driver.jobid"
  printf '%s\t%s\tafter %s\n' "\$next" "\$(date -u +%FT%TZ)" "\${live//:/,}" >> "\$state/drivers.tsv"
  echo "driver: make goes on in job \$next once job(s) \${live//:/ } end"
  exit 0
done
if [ "\$rc" -eq 0 ]; then
  echo "done \$(date -u +%FT%TZ)" > "\$state/result"
  echo "driver: done"
else
  echo "failed: make exited with status \$rc (see \$state/driver-\$SLURM_JOB_ID.log)" > "\$state/result"
  echo "driver: make failed with status \$rc" >&2
fi
exit "\$rc"
JOB
mv "$state/driver.sh.tmp" "$state/driver.sh"
chmod +x "$state/driver.sh"

err=$(mktemp)
# shellcheck disable=SC2086
if ! jid=$(sbatch --parsable $sbatch_flags "$state/driver.sh" 2> "$err"); then
  echo "submit.sh: sbatch refused the driver job: $(tr '\n' ' ' < "$err")" >&2
  rm -f "$err"; exit 1
fi
rm -f "$err"
jid=${jid%%;*}
rm -f "$state/result"
echo "$jid" > "$state/driver.jobid.tmp" && mv "$state/driver.jobid.tmp" "$state/driver.jobid"
printf '%s\t%s\tsubmitted: make %s\n' "$jid" "$(date -u +%FT%TZ)" "$*" >> "$state/drivers.tsv"
echo "submit.sh: $rundir: driver job $jid submitted (make $*); this shell can go."
echo "  follow it: make status RUN=$(basename "$rundir")   log: $state/driver-$jid.log"
