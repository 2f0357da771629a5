# Helpers for the labs' hand-started daemons (SLURM, Kubernetes): source it after setting
#   TAG   prefix of messages (e.g. "slurm", "kube-up")
#   PIDS  dir of our own pid files (daemons often delete theirs when they exit)
#   LOGS  dir of the daemons' output, one "$LOGS/<name>.$LOG_EXT" each (LOG_EXT default "log")
# It does nothing on its own.

die() {  # die MESSAGE [LOGFILE...]: print the message and the tail of each log, exit 1
  echo "$TAG: ERROR: $1" >&2; shift
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
# and $! is the daemon's own pid. Fds 8 and 9 (our locks) are not handed to the daemon.
start() {
  local name=$1; shift
  # from /: a daemon keeps its cwd for ever, and one started in a directory deleted later (a checkout, a temp dir)
  # makes slurmstepd print "Unable to get current working directory" into every job's output
  (cd / && exec setsid "$@" </dev/null >>"$LOGS/$name.${LOG_EXT:-log}" 2>&1 8>&- 9>&-) &
  echo $! >"$PIDS/$name"
}

# cwd_gone NAME: the running daemon NAME was started in a directory that no longer exists.
cwd_gone() {
  local pid; pid=$(cat "$PIDS/$1" 2>/dev/null) || return 1
  case "$(readlink "/proc/$pid/cwd" 2>/dev/null)" in *" (deleted)") return 0 ;; *) return 1 ;; esac
}

# stop NAME: SIGTERM the recorded pid, wait up to 30 s for it to exit, then SIGKILL. No-op if not running.
stop() {
  local name=$1 pid i
  if alive "$name"; then
    pid=$(cat "$PIDS/$name")
    kill "$pid" 2>/dev/null || true
    for i in $(seq 300); do running "$pid" || break; sleep 0.1; done
    if running "$pid"; then echo "$TAG: $name ($pid) ignored SIGTERM for 30 s; SIGKILL" >&2; kill -9 "$pid" 2>/dev/null || true; fi
  fi
  rm -f "$PIDS/$name"
}
