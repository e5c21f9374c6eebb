#!/usr/bin/env bash
# Starts a one-node Slurm cluster for the tests, without systemd: munged, slurmctld and slurmd
# run as this (root) user from a generated slurm.conf, with every state file under DIR.
#
# usage: tests/slurm/start_cluster.sh DIR     then: source DIR/env; ...; tests/slurm/stop_cluster.sh DIR
#
# Needs root and Debian's slurm-wlm and munge packages (`apt-get install slurm-wlm munge`).
# Exit status 3 means Slurm cannot run here, with the reason on stderr (the test then skips);
# any other failure is an error. The daemons' PIDs go to DIR/*.pid for stop_cluster.sh.
set -euo pipefail
dir=${1:?usage: start_cluster.sh DIR}
cannot() { echo "slurm cannot start here: $*" >&2; exit 3; }

[ "$(id -u)" = 0 ] || cannot "slurmd must run as root to start jobs (uid is $(id -u))"
for b in munged mungekey slurmctld slurmd sbatch scontrol sinfo; do
  command -v "$b" >/dev/null || [ -x "/usr/sbin/$b" ] || cannot "$b is not installed (apt-get install slurm-wlm munge)"
done
export PATH=$PATH:/usr/sbin

mkdir -p "$dir"/{munge,state,spool,log}
dir=$(cd "$dir" && pwd)
chmod 700 "$dir/munge"
host=$(hostname -s)
getent hosts "$host" >/dev/null || cannot "this host's name $host does not resolve"
cpus=$(nproc)
mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 * 3 / 4 ))
# Free ports for the controller and the node daemon (not the defaults: a real cluster may be here).
read -r ctl_port node_port < <(python3 -c '
import socket
socks = [socket.socket() for _ in range(2)]
for s in socks: s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in socks])')

# munge: a fresh key and its own socket.
mungekey --create --keyfile "$dir/munge/munge.key" --force >/dev/null 2>&1 || \
  dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$dir/munge/munge.key"
munged --force --key-file "$dir/munge/munge.key" --socket "$dir/munge/munge.socket" \
  --pid-file "$dir/munge.pid" --log-file "$dir/log/munged.log" --seed-file "$dir/munge/seed" \
  || cannot "munged did not start: $(tail -3 "$dir/log/munged.log" 2>/dev/null)"

cat > "$dir/slurm.conf" <<CONF
ClusterName=coatest
SlurmctldHost=$host
SlurmctldPort=$ctl_port
SlurmdPort=$node_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
MinJobAge=300
# Slurm's default: more than 1001 shards need several arrays.
MaxArraySize=1001
# Schedule at every event, not on the default timers, and take a thousand pending tasks at once:
# with 32 CPUs declared on this node (config_overrides: more than it has; the tests' shards mostly
# wait on Slurm's own start-up), 1,100 one-second array tasks take about 2.5 min, not 20.
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0,sched_interval=1,default_queue_depth=5000,bf_interval=1
SlurmdParameters=config_overrides
KillWait=5
NodeName=$host CPUs=32 RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
export SLURM_CONF=$dir/slurm.conf
echo "export SLURM_CONF=$dir/slurm.conf" > "$dir/env"

slurmctld -i -f "$SLURM_CONF" || cannot "slurmctld did not start: $(tail -3 "$dir/log/slurmctld.log" 2>/dev/null)"
slurmd -f "$SLURM_CONF" || cannot "slurmd did not start: $(tail -3 "$dir/log/slurmd.log" 2>/dev/null)"

# Ready when the node is idle.
for _ in $(seq 1 60); do
  state=$(sinfo -h -N -o %t 2>/dev/null | head -1 || true)
  case "$state" in idle*) echo "slurm: one-node cluster up on $host (32 CPUs declared, $cpus real, ${mem}M), SLURM_CONF=$SLURM_CONF" >&2; exit 0 ;; esac
  sleep 0.5
done
cannot "the node never became idle (state '${state:-none}'): $(tail -3 "$dir/log/slurmd.log" 2>/dev/null)"
