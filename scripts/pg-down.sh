#!/usr/bin/env bash
# Stop the cluster pg-up.sh started (pg_ctl -m fast: running sessions are disconnected). Idempotent.
# Usage: scripts/pg-down.sh [--purge]    --purge also deletes $PG_LAB (the data directory and the log)
# Env:   PG_LAB, PG_BIN as for pg-up.sh
set -euo pipefail
LAB=${PG_LAB:-/tmp/evalrun-pg}
DATA=$LAB/data
TAG=pg-down
# shellcheck source=daemon-lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/daemon-lib.sh"

mkdir -p "$(dirname "$LAB")"
exec 9>"${LAB%/}.lock"
flock -w 300 9 || die "timed out waiting for ${LAB%/}.lock"

V=$(cat "$DATA/PG_VERSION" 2>/dev/null || true)
BIN=${PG_BIN:-/usr/lib/postgresql/${V:-none}/bin}
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }

if [ -x "$BIN/pg_ctl" ] && as_pg "$BIN/pg_ctl" -D "$DATA" status >/dev/null 2>&1; then
  as_pg "$BIN/pg_ctl" -D "$DATA" -m fast -w -t 60 stop >/dev/null 9>&- || die "pg_ctl stop failed" "$LAB/pg.log"
fi
if [ "${1:-}" = --purge ]; then rm -rf "$LAB"; fi
echo "$TAG: stopped${1:+ and purged $LAB}"
