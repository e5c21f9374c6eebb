#!/usr/bin/env bash
# Stops what start_cluster.sh DIR started (by the PIDs it recorded), jobs included.
set -uo pipefail
dir=${1:?usage: stop_cluster.sh DIR}
if [ -f "$dir/env" ]; then
  # shellcheck disable=SC1091
  . "$dir/env"
  scancel --user="$(id -un)" >/dev/null 2>&1 || true
fi
for d in slurmd slurmctld munge; do
  pid=$(cat "$dir/$d.pid" 2>/dev/null) || continue
  kill "$pid" 2>/dev/null || continue
  for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null || true
done
exit 0
