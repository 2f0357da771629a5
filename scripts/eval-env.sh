#!/usr/bin/env bash
# Create (or reuse) the "eval env": a separate Python >= 3.12 venv holding Harbor, the way real clusters keep
# Harbor in its own eval env, apart from the reconciler's Python (Harbor does not import on 3.11).
#
# Usage: scripts/eval-env.sh            -> prints the venv path on its last line
# Env:   EVAL_ENV     venv path (default /tmp/evalrun-eval-env: outside the checkout, so CI runs on the same
#                     machine reuse it; a stamp file decides whether it is current, so a fresh machine just builds it)
#        EVAL_PYTHON  interpreter to build it from (default: pyenv's 3.12.1, else python3.12/python3.13 on PATH)
# Pins:  harbor==$HARBOR_VERSION plus eval/harbor/constraints.txt (every transitive dependency, `uv pip freeze`).
# Warm (stamp matches): ~0.05 s. Cold: ~15-20 s here (uv from PyPI; compiling bytecode is most of it).
set -euo pipefail
HARBOR_VERSION=0.26.0
UV_VERSION=0.13.9
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ENV_DIR=${EVAL_ENV:-/tmp/evalrun-eval-env}
CONSTRAINTS=$REPO/eval/harbor/constraints.txt

# Several test sessions on one machine may call this at once: serialise them (one builds, the others reuse).
mkdir -p "$(dirname "$ENV_DIR")"
exec 9>"${ENV_DIR%/}.lock"
flock -w 900 9 || { echo "eval-env: timed out waiting for ${ENV_DIR%/}.lock" >&2; exit 1; }

if [ -z "${EVAL_PYTHON:-}" ]; then
  if command -v pyenv >/dev/null && p=$(pyenv prefix 3.12.1 2>/dev/null) && [ -x "$p/bin/python3.12" ]; then
    EVAL_PYTHON=$p/bin/python3.12
  else
    # pyenv not on PATH (non-login shell): look in its tree directly, then on PATH
    EVAL_PYTHON=$(ls "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12.*/bin/python3.12 2>/dev/null | head -1 || true)
    [ -n "$EVAL_PYTHON" ] || EVAL_PYTHON=$(command -v python3.12 || command -v python3.13 || true)
  fi
fi
[ -n "$EVAL_PYTHON" ] && "$EVAL_PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 12))' \
  || { echo "eval-env: need Python >= 3.12 (set EVAL_PYTHON); found '${EVAL_PYTHON:-none}'" >&2; exit 1; }

# The stamp records everything the env was built from; any change rebuilds it from scratch.
want="harbor=$HARBOR_VERSION uv=$UV_VERSION python=$("$EVAL_PYTHON" -c 'import sys; print(sys.version.split()[0])') constraints=$(sha256sum "$CONSTRAINTS" | cut -c1-16)"
if [ -f "$ENV_DIR/.evalrun-stamp" ] && [ "$(cat "$ENV_DIR/.evalrun-stamp")" = "$want" ] && [ -x "$ENV_DIR/bin/harbor" ]; then
  echo "$ENV_DIR"; exit 0
fi

t0=$(date +%s%N)
rm -rf "$ENV_DIR"
"$EVAL_PYTHON" -m venv "$ENV_DIR"
# uv is much faster than pip here. pip --isolated skips this machine's pip.conf (its file:// extra indexes only
# print warnings); uv ignores pip.conf anyway (and the machine's torch cap, which Harbor doesn't need).
"$ENV_DIR/bin/python" -m pip --isolated --disable-pip-version-check install -q "uv==$UV_VERSION"
# --compile-bytecode: PYTHONDONTWRITEBYTECODE=1 is set on these machines, so without it every `harbor` call
# would recompile its imports (several seconds per call).
"$ENV_DIR/bin/uv" pip install -q --python "$ENV_DIR/bin/python" --compile-bytecode \
  -c "$CONSTRAINTS" "harbor==$HARBOR_VERSION"
"$ENV_DIR/bin/harbor" --version >/dev/null
echo "$want" > "$ENV_DIR/.evalrun-stamp"
echo "eval-env: built $ENV_DIR in $(( ($(date +%s%N) - t0) / 1000000 )) ms ($want)" >&2
echo "$ENV_DIR"
