#!/usr/bin/env bash
# Bring up a scratch PostgreSQL cluster for the lab and the tests (Debian packages), as root, without systemd:
# initdb into $PG_LAB/data (trust auth, fsync off: throwaway data), then pg_ctl start on 127.0.0.1 + a unix socket
# in $PG_LAB. The server runs as the `postgres` user (it refuses to run as root).
# Idempotent: already running → prints the URL and exits 0 at once.
#
# Usage: scripts/pg-up.sh        last line of stdout: postgresql://postgres@127.0.0.1:$PG_PORT/postgres
# Env:   PG_LAB   state dir (default /tmp/evalrun-pg): data/, pg.log, the socket
#        PG_PORT  TCP port on 127.0.0.1 (default 55432)
#        PG_BIN   server binaries (default: those of the cluster's version, else the newest /usr/lib/postgresql/*/bin)
# Stop:  scripts/pg-down.sh [--purge]
set -euo pipefail
LAB=${PG_LAB:-/tmp/evalrun-pg}
PORT=${PG_PORT:-55432}
DATA=$LAB/data
LOG=$LAB/pg.log
URL="postgresql://postgres@127.0.0.1:$PORT/postgres"
TAG=pg-up
# shellcheck source=daemon-lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/daemon-lib.sh"

# serialise pg-up/pg-down on this $PG_LAB (test sessions may run side by side)
mkdir -p "$(dirname "$LAB")"
exec 9>"${LAB%/}.lock"
flock -w 300 9 || die "timed out waiting for ${LAB%/}.lock"

# the binaries of the cluster's own major version (pg_ctl refuses another version's data dir), else the newest
pick_bin() {
  local v; v=$(cat "$DATA/PG_VERSION" 2>/dev/null || true)
  if [ -n "$v" ] && [ -x "/usr/lib/postgresql/$v/bin/pg_ctl" ]; then echo "/usr/lib/postgresql/$v/bin"
  else ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1; fi
}
BIN=${PG_BIN:-$(pick_bin)}
# the server refuses to run as root: as root, run it as `postgres`; anyone else runs it as themselves
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }

if [ -n "$BIN" ] && [ -s "$DATA/PG_VERSION" ] && as_pg "$BIN/pg_ctl" -D "$DATA" status >/dev/null 2>&1 \
   && "$BIN/pg_isready" -q -h 127.0.0.1 -p "$PORT"; then
  echo "$TAG: already up ($LAB)"; echo "$URL"; exit 0
fi

# --- packages (CI images do not have them; this one does)
if [ -z "$BIN" ] || [ ! -x "$BIN/initdb" ]; then
  echo "$TAG: installing postgresql"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends postgresql >/dev/null
  BIN=${PG_BIN:-$(pick_bin)}
  [ -x "$BIN/initdb" ] || die "no initdb after installing postgresql (looked in ${BIN:-/usr/lib/postgresql/*/bin})"
fi

# --- cluster: created once; the settings live in evalrun.conf (rewritten every time) so a plain
# `pg_ctl start` (tests restart the server) gets the same port and socket
if [ "$(id -u)" = 0 ]; then install -d -o postgres -g postgres -m 0700 "$LAB"; else mkdir -p -m 0700 "$LAB"; fi
if [ ! -s "$DATA/PG_VERSION" ]; then
  rm -rf "$DATA"
  as_pg "$BIN/initdb" -D "$DATA" -U postgres --auth=trust -E UTF8 --no-locale >"$LAB/initdb.log" 2>&1 \
    || die "initdb failed" "$LAB/initdb.log"
  echo "include_if_exists = 'evalrun.conf'" >>"$DATA/postgresql.conf"
fi
as_pg tee "$DATA/evalrun.conf" >/dev/null <<CONF
# written by scripts/pg-up.sh: a throwaway lab server, many short-lived test databases. fsync off: no durability
# against an OS crash; commits still reach the OS at once, so a killed server (pg_ctl -m immediate) keeps them
listen_addresses = '127.0.0.1'
port = $PORT
unix_socket_directories = '$LAB'
fsync = off
full_page_writes = off
max_connections = 300
log_min_messages = warning
CONF

# -w: return once it accepts connections; a stale postmaster.pid from a killed server is handled by pg_ctl.
# 9>&-: the server must not inherit our lock, or it would hold it for as long as it runs.
as_pg "$BIN/pg_ctl" -D "$DATA" -l "$LOG" -w -t 60 start >/dev/null 2>&1 9>&- || die "PostgreSQL did not start" "$LOG"
"$BIN/pg_isready" -q -h 127.0.0.1 -p "$PORT" -t 30 || die "PostgreSQL does not answer on 127.0.0.1:$PORT" "$LOG"
echo "$TAG: up ($LAB, $(head -1 "$DATA/PG_VERSION" 2>/dev/null || echo '?'))"
echo "$URL"
