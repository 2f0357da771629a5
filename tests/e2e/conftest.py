"""End-to-end fixtures: a local cluster spec in a temp dir, and evalctl run as a real subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from controller.adapters.scheduler.local import LocalScheduler

REPO = Path(__file__).resolve().parents[2]
FAKE_HARBOR = REPO / "specs" / "demo" / "fake_harbor.py"


class Cluster:
    def __init__(self, root: Path):
        self.root = root
        self.spec = root / "spec.yaml"
        self.store = f"sqlite:///{root}/store.db"
        self.scheduler = LocalScheduler(root / "logs" / ".local-scheduler")

    def write(self, *, models: list[str], datasets: list[str], env: dict[str, str] | None = None,
              script: Path = FAKE_HARBOR, extra_run: str = "", max_per_pass: int = 6) -> None:
        env_yaml = "".join(f"\n    {k}: \"{v}\"" for k, v in (env or {}).items()) or " {}"
        self.spec.write_text(f"""
apiVersion: evalrun.io/v1alpha1
kind: EvalCluster
metadata: {{name: local}}
spec:
  scheduler: {{type: local}}
  jobsDir: {self.root}/jobs
  logsDir: {self.root}/logs
  jobScript: {script}
  timeLimit: "01:00:00"
  maxSubmissionsPerPass: {max_per_pass}
  env:{env_yaml}
---
apiVersion: evalrun.io/v1alpha1
kind: EvalRun
metadata: {{name: e2e}}
spec:
  cluster: local
  models: {models}
  datasets: {datasets}
{extra_run}
""")

    def evalctl(self, *args: str, kill_at: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "COLUMNS": "200"}
        env.pop("EVALCTL_KILL_AT", None)
        if kill_at:
            env["EVALCTL_KILL_AT"] = kill_at
        command = [sys.executable, "-m", "controller.entry.cli", *args]
        if args and args[0] in ("plan", "reconcile", "status", "explain"):
            command += ["-f", str(self.spec), "--store", self.store]
        result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
        if check and kill_at is None:
            assert result.returncode == 0, result.stdout + result.stderr
        return result

    def jobs_named(self, name: str) -> list:
        return [j for j in self.scheduler.observe() if j.name == name]

    def cancel_all(self) -> None:
        for job in self.scheduler.observe():
            if job.state.active:
                self.scheduler.cancel(job.job_id)


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 60.0, step_s: float = 0.1) -> None:
    """Poll a condition with a bounded deadline (synchronisation on observable state, not on time)."""
    import time

    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(step_s)


@pytest.fixture
def cluster(tmp_path: Path):
    the_cluster = Cluster(tmp_path)
    yield the_cluster
    the_cluster.cancel_all()
