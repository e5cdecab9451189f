#!/usr/bin/env bash
# Stop the single-node Slurm of scripts/slurm-up.sh: slurmd, slurmctld and munged, by their pid files.
set -uo pipefail
for d in slurmd slurmctld; do
  pidf=/run/$d.pid
  if [ -s "$pidf" ]; then
    pid=$(cat "$pidf")
    if grep -q "$d" "/proc/$pid/comm" 2>/dev/null; then
      kill -TERM "$pid"
      for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    fi
    rm -f "$pidf" # slurmctld leaves a stale one
  fi
done
pidf=/run/munge/munged.pid
if [ -s "$pidf" ] && grep -q munged "/proc/$(cat "$pidf")/comm" 2>/dev/null; then kill -TERM "$(cat "$pidf")"; fi
echo "==> Slurm stopped"
