"""Session fixtures shared by the suites that need real infrastructure (tests/infra, tests/slurm):
a real single-node SLURM cluster and the Harbor eval env.

Both are brought up by the repo's own scripts (idempotent; fast when already up):
  scripts/slurm-up.sh   -> cluster state in $SLURM_LAB (default /tmp/evalrun-slurm), left running afterwards
  scripts/eval-env.sh   -> Harbor venv in $EVAL_ENV (default /tmp/evalrun-eval-env), reused across runs
Needs root (apt-get, daemons, mount namespaces for Harbor's host environment); skipped otherwise.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _run_script(script: str, timeout: float, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / script)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
    )
    if proc.returncode != 0:
        pytest.fail(f"{script} failed (rc={proc.returncode}):\n{proc.stdout}\n{proc.stderr}", pytrace=False)
    return proc.stdout


@pytest.fixture(scope="session")
def slurm_env() -> dict[str, str]:
    """Environment (os.environ + SLURM_CONF) for talking to the cluster; starts it if needed."""
    if os.geteuid() != 0:
        pytest.skip("the SLURM test cluster needs root")
    _run_script("slurm-up.sh", timeout=600)
    lab = os.environ.get("SLURM_LAB", "/tmp/evalrun-slurm")
    return {**os.environ, "SLURM_CONF": f"{lab}/etc/slurm.conf"}


@pytest.fixture(scope="session")
def eval_env() -> Path:
    """Path of the Harbor eval venv (built or reused by scripts/eval-env.sh)."""
    out = _run_script("eval-env.sh", timeout=900)
    return Path(out.strip().splitlines()[-1])
