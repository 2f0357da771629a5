#!/usr/bin/env bash
# Install Debian's Chromium for the report's browser tests (headless, driven by Playwright with
# executablePath=/usr/bin/chromium: Playwright's own browser download is not used). Idempotent.
#
# Usage: scripts/chromium-up.sh      last line of stdout: the chromium binary
set -euo pipefail
BIN=/usr/bin/chromium
exec 9>/tmp/evalrun-chromium.lock
flock -w 600 9
if [ ! -x "$BIN" ]; then
  [ "$(id -u)" = 0 ] || { echo "chromium-up: $BIN is missing; run as root to install Debian's chromium" >&2; exit 1; }
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq --no-install-recommends chromium >/dev/null 2>&1 || {
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends chromium >/dev/null
  }
fi
echo "$BIN"
