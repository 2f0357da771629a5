# Shared helpers for slurm-up.sh / slurm-down.sh / slurmctld.sh. Source it; it does nothing on its own.
# Env: SLURM_LAB          state dir (default /tmp/evalrun-slurm): config, state, spool, logs, MariaDB datadir, pids
#      SLURM_PORT_BASE    slurmctld port (default: the lab's own, else 6817); slurmd +1, slurmdbd +2, MariaDB +3
#      SLURM_CLUSTER_NAME ClusterName of a lab other than the default one (default: evalrun-<suffix of its dir>)
# Several labs can run side by side, each with its own SLURM_LAB and SLURM_PORT_BASE: every daemon but munged
# (shared) is the lab's own, accounting included.
DEFAULT_LAB=/tmp/evalrun-slurm
LAB=${SLURM_LAB:-$DEFAULT_LAB}
LAB=${LAB%/}
PORT_BASE=${SLURM_PORT_BASE:-$(sed -n 's/^SlurmctldPort=//p' "$LAB/etc/slurm.conf" 2>/dev/null || true)}
PORT_BASE=${PORT_BASE:-6817}
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

# The default lab is cluster `evalrun` on node `hostname -s`; another lab's node is named after its cluster (two
# slurmd on one host need distinct names: `slurmd -N`, NodeHostname = this host).
if [ "$LAB" = "$DEFAULT_LAB" ]; then
  if [ -n "${SLURM_CLUSTER_NAME:-}" ] && [ "$SLURM_CLUSTER_NAME" != evalrun ]; then
    echo "slurm: the default lab ($DEFAULT_LAB) is always cluster evalrun; set SLURM_LAB for cluster $SLURM_CLUSTER_NAME" >&2
    exit 2
  fi
  CLUSTER=evalrun
  NODE=$(hostname -s)
else
  suffix=$(basename "$LAB" | tr 'A-Z' 'a-z'); suffix=${suffix#evalrun-slurm-}
  CLUSTER=evalrun-$(printf '%s' "$suffix" | tr -c 'a-z0-9_-' '-')
  CLUSTER=${SLURM_CLUSTER_NAME:-${CLUSTER:0:40}}
  # Slurm lower-cases cluster names and makes table names of them in the accounting database
  if ! [[ $CLUSTER =~ ^[a-z][a-z0-9_-]{0,39}$ ]]; then
    echo "slurm: cluster name '$CLUSTER' is not valid: lower-case letters, digits, '-' and '_', a letter first," \
      "at most 40 (set SLURM_CLUSTER_NAME)" >&2
    exit 2
  fi
  NODE=$CLUSTER-node
fi

ctld_up() { scontrol ping 2>/dev/null | grep -q 'is UP'; }
# the node offers the lab's fake GPUs (a lab started before they were configured does not: slurm-down.sh first)
node_has_gpus() { sinfo -h -n "$NODE" -o '%G' 2>/dev/null | grep -q 'gpu:'; }
# the node is usable; right after a slurmctld (re)start it reads "unknown" for ~4 s until slurmd re-registers
node_ready() { sinfo -h -n "$NODE" -o '%T' 2>/dev/null | grep -qE '^(idle|mixed|allocated|completing)$'; }

# port_free PORT NAME: nothing listens on 127.0.0.1:PORT yet, else stop with the likely cause (another lab's daemon
# would answer our clients there).
port_free() {
  [ -z "$(ss -Hltn "sport = :$1" 2>/dev/null)" ] ||
    die "port $1 for $2 is taken (another lab on the same SLURM_PORT_BASE? give each lab its own): $(ss -Hltnp "sport = :$1")"
}

start_slurmctld() {
  alive slurmctld && return 0
  port_free "$PORT_BASE" slurmctld
  # -i: ignore unreadable state files rather than refusing to start
  start slurmctld /usr/sbin/slurmctld -D -i
  poll 60 slurmctld ctld_up || die "slurmctld did not answer 'scontrol ping' within 60 s" \
    "$LOGS/slurmctld.log" "$LOGS/slurmctld.stdout"
}

wait_node_ready() {
  poll 60 - node_ready || die "node $NODE not ready within 60 s: $(sinfo -h -o '%T %E' 2>&1)" \
    "$LOGS/slurmd.log" "$LOGS/slurmd.stdout" "$LOGS/slurmctld.log"
}
