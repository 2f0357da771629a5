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

TAG=kube-down
# shellcheck source=daemon-lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/daemon-lib.sh"
t0=$(date +%s%N)
stop kube-apiserver
stop etcd
if [ "${1:-}" = --purge ]; then rm -rf "$LAB"; fi
echo "kube-down: stopped${1:+ and purged $LAB} in $(( ($(date +%s%N) - t0) / 1000000 )) ms"
