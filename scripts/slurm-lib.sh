# Shared helpers for slurm-up.sh / slurm-down.sh / slurmctld.sh. Source it; it does nothing on its own.
# Env: SLURM_LAB        state dir (default /tmp/evalrun-slurm): config, state, spool, logs, MariaDB datadir, pids
#      SLURM_PORT_BASE  slurmctld port (default 6817); slurmd = +1, slurmdbd = +2, MariaDB (127.0.0.1) = +3
LAB=${SLURM_LAB:-/tmp/evalrun-slurm}
PORT_BASE=${SLURM_PORT_BASE:-6817}
export SLURM_CONF=$LAB/etc/slurm.conf
PIDS=$LAB/pids   # our own pid files: slurmctld/slurmd/slurmdbd delete theirs when they exit
LOGS=$LAB/log

# lock: serialise slurm-up/down/slurmctld.sh calls on this $SLURM_LAB (test sessions may run side by side).
lock() {
  mkdir -p "$(dirname "$LAB")"
  exec 9>"${LAB%/}.lock"
  flock -w 600 9 || { echo "slurm: timed out waiting for ${LAB%/}.lock" >&2; exit 1; }
}

die() {  # die MESSAGE [LOGFILE...]: print the message and the tail of each log, exit 1
  echo "slurm: ERROR: $1" >&2; shift
  for f in "$@"; do [ -s "$f" ] && { echo "----- tail -n 30 $f" >&2; tail -n 30 "$f" >&2; }; done
  exit 1
}

# running PID: the process exists and is not a zombie. (PID 1 on these machines reaps orphans only every ~2 s,
# and kill -0 succeeds on a zombie.)
running() { local st; st=$(awk '/^State:/{print $2}' "/proc/$1/status" 2>/dev/null) && [ -n "$st" ] && [ "$st" != Z ]; }

# alive NAME: the process recorded in $PIDS/NAME is running and really is NAME (guards against pid reuse).
alive() {
  local pid; pid=$(cat "$PIDS/$1" 2>/dev/null) || return 1
  [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$1" ] && running "$pid"
}

# poll SECS NAME CMD...: retry CMD every 0.1 s until it succeeds; fail after SECS s or as soon as daemon NAME
# has exited (NAME '-' = don't watch a daemon).
poll() {
  local secs=$1 name=$2; shift 2
  local end=$(( $(date +%s) + secs ))
  until "$@" >/dev/null 2>&1; do
    [ "$name" = - ] || alive "$name" || return 1
    [ "$(date +%s)" -lt "$end" ] || return 1
    sleep 0.1
  done
}

# start NAME CMD...: run a foreground daemon detached (own session, no inherited stdio), record its pid.
# In a non-interactive shell a background child is not a process-group leader, so setsid execs in place
# and $! is the daemon's own pid.
start() {
  local name=$1; shift
  setsid "$@" </dev/null >>"$LOGS/$name.stdout" 2>&1 9>&- &   # 9>&-: do not hand the lock to the daemon
  echo $! >"$PIDS/$name"
}

# stop NAME: SIGTERM the recorded pid, wait up to 15 s for it to exit, then SIGKILL. No-op if not running.
stop() {
  local name=$1 pid i
  if alive "$name"; then
    pid=$(cat "$PIDS/$name")
    kill "$pid" 2>/dev/null || true
    for i in $(seq 150); do running "$pid" || break; sleep 0.1; done
    running "$pid" && kill -9 "$pid" 2>/dev/null
  fi
  rm -f "$PIDS/$name"
}

ctld_up() { scontrol ping 2>/dev/null | grep -q 'is UP'; }
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
