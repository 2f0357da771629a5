#!/usr/bin/env bash
# Stop the private sshd that sshd-up.sh started, by its recorded pid (never by name). Idempotent.
# Usage: scripts/sshd-down.sh [--purge]     --purge also deletes $SSH_LAB (keys, configs, log)
# Its per-connection children (open sessions, e.g. ssh ControlMaster connections) are ended too.
set -euo pipefail
LAB=${SSH_LAB:-/tmp/evalrun-ssh}
LAB=${LAB%/}
mkdir -p "$(dirname "$LAB")"
exec 9>"$LAB.lock"
flock -w 600 9 || { echo "sshd-down: timed out waiting for $LAB.lock" >&2; exit 1; }

running() { local st; st=$(awk '/^State:/{print $2}' "/proc/$1/status" 2>/dev/null) && [ -n "$st" ] && [ "$st" != Z ]; }
pid=$(cat "$LAB/sshd.pid" 2>/dev/null || true)
if [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = sshd ] && running "$pid"; then
  # its children first (found by parent pid): sshd does not end open connections when the listener stops
  kids=$(grep -lx "PPid:[[:space:]]*$pid" /proc/[0-9]*/status 2>/dev/null | cut -d/ -f3 || true)
  kill $kids "$pid" 2>/dev/null || true
  for _ in $(seq 100); do running "$pid" || break; sleep 0.1; done
  running "$pid" && kill -9 "$pid" 2>/dev/null
fi
rm -f "$LAB/sshd.pid"
if [ "${1:-}" = --purge ]; then rm -rf "$LAB"; fi
echo "sshd-down: stopped${1:+ and purged $LAB}"
