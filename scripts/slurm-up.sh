#!/usr/bin/env bash
# A real single-node Slurm on this machine for the Slurm backend's tests (tests/slurm.rs): munged,
# slurmctld and slurmd started by hand (no systemd), 4 fake GPUs as character devices outside /dev.
# Idempotent: a Slurm that already answers `scontrol ping` with an idle node is left as it is.
# Stop it with scripts/slurm-down.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-ci-deps.sh slurm-wlm munge

host=$(hostname -s)
etc=/etc/slurm
state=/var/lib/slurm-gantry
fakegpu=/var/lib/slurm-fakegpu
# The shared log dir the engine reads (tests name it in their lab config).
logs=/var/lib/gantry-slurm-logs

ready() { scontrol ping 2>/dev/null | grep -q "is UP" && sinfo -h -N -o '%T' 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; }

mkdir -p "$etc" "$state"/{ctld,d} "$fakegpu" "$logs" /var/log/slurm /run/munge
chmod 0755 "$logs"
# GPUs without GPUs: Slurm only needs device files to count (see docs/platform notes); they live outside
# /dev and nothing ever opens them.
for i in 0 1 2 3; do [ -c "$fakegpu/nvidia$i" ] || mknod "$fakegpu/nvidia$i" c 195 "$i"; done
chown slurm:slurm "$state"/ctld "$state"/d /var/log/slurm 2>/dev/null || true

conf=$(mktemp)
cat >"$conf" <<EOF
# Written by scripts/slurm-up.sh: a single-node Slurm for Gantry's tests.
ClusterName=gantry-test
SlurmctldHost=$host
SlurmUser=root
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
StateSaveLocation=$state/ctld
SlurmdSpoolDir=$state/d
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
AuthType=auth/munge
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
# A job that asks for no memory gets this per CPU, not the whole node.
DefMemPerCPU=256
GresTypes=gpu
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=/var/log/slurm/jobcomp.log
JobAcctGatherType=jobacct_gather/none
MinJobAge=300
ReturnToService=2
MailProg=/bin/true
# Short kill wait: Gantry's tests time jobs out in seconds.
KillWait=2
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1,sched_min_interval=200000
SlurmdParameters=config_overrides
PriorityType=priority/basic
NodeName=$host CPUs=8 Boards=1 SocketsPerBoard=1 CoresPerSocket=8 ThreadsPerCore=1 RealMemory=16000 Gres=gpu:4 State=UNKNOWN
PartitionName=gpu Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
changed=1; cmp -s "$conf" "$etc/slurm.conf" && changed=0
mv "$conf" "$etc/slurm.conf"; chmod 0644 "$etc/slurm.conf"
if ready; then
  [ "$changed" = 1 ] && { echo "==> slurm.conf changed: scontrol reconfigure"; scontrol reconfigure; }
  echo "==> Slurm already up on $host"; exit 0
fi
cat >"$etc/gres.conf" <<EOF
Name=gpu File=$fakegpu/nvidia[0-3]
EOF
cat >"$etc/cgroup.conf" <<EOF
CgroupPlugin=autodetect
EOF

# munged: started directly (its init script can silently start nothing here).
if ! munge -n >/dev/null 2>&1 </dev/null; then
  [ -s /etc/munge/munge.key ] || { dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null; }
  chown munge:munge /etc/munge/munge.key /run/munge; chmod 0400 /etc/munge/munge.key
  runuser -u munge -- /usr/sbin/munged
  for _ in $(seq 1 50); do munge -n >/dev/null 2>&1 </dev/null && break; sleep 0.1; done
fi

start() { # NAME: start unless its pid file names a live process (a stale pid file is removed)
  local pidf=/run/$1.pid
  if [ -s "$pidf" ] && kill -0 "$(cat "$pidf")" 2>/dev/null && grep -q "$1" "/proc/$(cat "$pidf")/comm" 2>/dev/null; then
    scontrol reconfigure >/dev/null 2>&1 || true
    return
  fi
  rm -f "$pidf"
  "/usr/sbin/$1"
}
start slurmctld
for _ in $(seq 1 100); do scontrol ping 2>/dev/null | grep -q "is UP" && break; sleep 0.2; done
scontrol ping | grep -q "is UP" || { echo "slurmctld did not come up"; tail -20 /var/log/slurm/slurmctld.log; exit 1; }
start slurmd
for _ in $(seq 1 150); do
  st=$(sinfo -h -N -o '%T' 2>/dev/null | head -1)
  case "$st" in idle|mixed|allocated) break ;; *drain*|*down*|invalid*) scontrol update nodename="$host" state=resume >/dev/null 2>&1 || true ;; esac
  sleep 0.2
done
ready || { echo "the Slurm node did not become idle"; sinfo -N -l; tail -20 /var/log/slurm/slurmd.log; exit 1; }
echo "==> Slurm up: $(sinfo -h -N -o '%N %T %G %c CPUs')"
