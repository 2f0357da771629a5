#!/usr/bin/env bash
# Stop what kube-up.sh started (kube-apiserver, then etcd), by recorded pid, never by name. Idempotent.
# Usage: scripts/kube-down.sh [--purge]    --purge also deletes $KUBE_LAB (etcd data, PKI, kubeconfig, logs);
#                                          the binary cache ($KUBE_LAB_CACHE) is always kept.
set -euo pipefail
LAB=${KUBE_LAB:-/tmp/evalrun-kube}
PIDS=$LAB/pids
mkdir -p "$(dirname "$LAB")"
exec 9>"${LAB%/}.lock"
flock -w 900 9 || { echo "kube-down: timed out waiting for ${LAB%/}.lock" >&2; exit 1; }

running() { local st; st=$(awk '/^State:/{print $2}' "/proc/$1/status" 2>/dev/null) && [ -n "$st" ] && [ "$st" != Z ]; }
alive() {
  local pid; pid=$(cat "$PIDS/$1" 2>/dev/null) || return 1
  [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$1" ] && running "$pid"
}
# stop NAME: SIGTERM the recorded pid, wait up to 30 s for it to exit, then SIGKILL. No-op if not running.
stop() {
  local name=$1 pid i
  if alive "$name"; then
    pid=$(cat "$PIDS/$name")
    kill "$pid" 2>/dev/null || true
    for i in $(seq 300); do running "$pid" || break; sleep 0.1; done
    if running "$pid"; then echo "kube-down: $name ($pid) ignored SIGTERM for 30 s; SIGKILL" >&2; kill -9 "$pid" 2>/dev/null || true; fi
  fi
  rm -f "$PIDS/$name"
}
t0=$(date +%s%N)
stop kube-apiserver
stop etcd
if [ "${1:-}" = --purge ]; then rm -rf "$LAB"; fi
echo "kube-down: stopped${1:+ and purged $LAB} in $(( ($(date +%s%N) - t0) / 1000000 )) ms"
