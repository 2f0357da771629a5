# Shared helpers for slurm-up.sh / slurm-down.sh / slurmctld.sh. Source it; it does nothing on its own.
# Env: SLURM_LAB        state dir (default /tmp/evalrun-slurm): config, state, spool, logs, MariaDB datadir, pids
#      SLURM_PORT_BASE  slurmctld port (default 6817); slurmd = +1, slurmdbd = +2, MariaDB (127.0.0.1) = +3
LAB=${SLURM_LAB:-/tmp/evalrun-slurm}
PORT_BASE=${SLURM_PORT_BASE:-6817}
export SLURM_CONF=$LAB/etc/slurm.conf
PIDS=$LAB/pids   # our own pid files: slurmctld/slurmd/slurmdbd delete theirs when they exit
LOGS=$LAB/log
TAG=slurm
LOG_EXT=stdout
# shellcheck source=daemon-lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/daemon-lib.sh"

# lock: serialise slurm-up/down/slurmctld.sh calls on this $SLURM_LAB (test sessions may run side by side).
lock() {
  mkdir -p "$(dirname "$LAB")"
  exec 9>"${LAB%/}.lock"
  flock -w 600 9 || { echo "slurm: timed out waiting for ${LAB%/}.lock" >&2; exit 1; }
}

ctld_up() { scontrol ping 2>/dev/null | grep -q 'is UP'; }
# the node offers the lab's fake GPUs (a lab started before they were configured does not: slurm-down.sh first)
node_has_gpus() { sinfo -h -n "$(hostname -s)" -o '%G' 2>/dev/null | grep -q 'gpu:'; }
# the node is usable; right after a slurmctld (re)start it reads "unknown" for ~4 s until slurmd re-registers
node_ready() { sinfo -h -n "$(hostname -s)" -o '%T' 2>/dev/null | grep -qE '^(idle|mixed|allocated|completing)$'; }

start_slurmctld() {
  alive slurmctld && return 0
  # -i: ignore unreadable state files rather than refusing to start
  start slurmctld /usr/sbin/slurmctld -D -i
  poll 60 slurmctld ctld_up || die "slurmctld did not answer 'scontrol ping' within 60 s" \
    "$LOGS/slurmctld.log" "$LOGS/slurmctld.stdout"
}

wait_node_ready() {
  poll 60 - node_ready || die "node $(hostname -s) not ready within 60 s: $(sinfo -h -o '%T %E' 2>&1)" \
    "$LOGS/slurmd.log" "$LOGS/slurmd.stdout" "$LOGS/slurmctld.log"
}
