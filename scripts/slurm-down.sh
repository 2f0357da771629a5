#!/usr/bin/env bash
# Stop what slurm-up.sh started, by recorded pid (never by name), newest first. Idempotent.
# Usage: scripts/slurm-down.sh [--purge]     --purge also deletes $SLURM_LAB (state, accounting db, logs)
# munged is stopped only if this lab's slurm-up.sh started it (a munged that was already running is left alone) and
# no other SLURM daemon on this host (another lab's) still needs it. Other labs (SLURM_LAB) are not touched.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/slurm-lib.sh"
lock
if alive slurmctld && ctld_up; then
  # cancel our cluster's jobs so no slurmstepd outlives slurmd; wait (bounded) until they are gone
  scancel --user=root 2>/dev/null || true
  poll 20 - sh -c '[ -z "$(squeue -h -o %i 2>/dev/null)" ]' || echo "slurm-down: jobs still listed, stopping anyway" >&2
fi
for d in slurmd slurmctld slurmdbd mariadbd; do stop "$d"; done
users=""  # SLURM daemons still running on this host (ours are stopped; a zombie is gone)
for pid in $(pgrep -x 'slurmctld|slurmd|slurmdbd'); do running "$pid" && users="$users $pid"; done
if alive munged && [ -n "$users" ]; then
  echo "slurm-down: munged left running: SLURM daemons of another lab use it (pids$users)"
else
  stop munged
fi
if [ "${1:-}" = --purge ]; then rm -rf "$LAB"; fi
echo "slurm-down: stopped${1:+ and purged $LAB}"
