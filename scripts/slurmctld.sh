#!/usr/bin/env bash
# Stop or start ONLY slurmctld of the cluster made by slurm-up.sh, e.g. to simulate an unreachable controller.
# Running jobs keep running under slurmd; `start` waits until `scontrol ping` answers again and the node is
# usable (state is kept). While it is down, squeue/sbatch fail after ~9 s ("Unable to contact slurm controller").
# Usage: scripts/slurmctld.sh stop|start|status
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/slurm-lib.sh"
lock
case "${1:-}" in
  stop)   stop slurmctld; echo "slurmctld: stopped" ;;
  start)  start_slurmctld; wait_node_ready; echo "slurmctld: up" ;;
  status) if alive slurmctld && ctld_up; then echo "slurmctld: up"; else echo "slurmctld: down"; exit 1; fi ;;
  *) echo "usage: $0 stop|start|status" >&2; exit 2 ;;
esac
