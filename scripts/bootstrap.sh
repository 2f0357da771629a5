#!/usr/bin/env bash
# Create .venv with the reconciler and its test tools. Idempotent: re-running only installs what changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
# uv resolves and installs in seconds where pip takes a minute; it is itself a PyPI package.
.venv/bin/python -m pip install -q --disable-pip-version-check uv
VIRTUAL_ENV=$PWD/.venv .venv/bin/uv pip install -q --compile-bytecode -e ".[test]"
