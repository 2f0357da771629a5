"""End-to-end fixtures: a local cluster spec in a temp dir, and evalctl run as a real subprocess."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from controller.adapters.scheduler.local import LocalScheduler
from tests.fixtures.evalctl import cancel_live_jobs, run_evalctl

REPO = Path(__file__).resolve().parents[2]
FAKE_HARBOR = REPO / "specs" / "demo" / "fake_harbor.py"


class Cluster:
    def __init__(self, root: Path):
        self.root = root
        self.spec = root / "spec.yaml"
        self.store = f"sqlite:///{root}/store.db"
        self.scheduler = LocalScheduler(root / "logs" / ".local-scheduler")

    def write(self, *, models: list[str], datasets: list[str], env: dict[str, str] | None = None,
              script: Path = FAKE_HARBOR, extra_run: str = "", max_per_pass: int = 6, name: str = "e2e",
              namespace: str | None = None, max_concurrent: int = 48, max_live: int = 50,
              extra_cluster: str = "") -> None:
        env_yaml = "".join(f"\n    {k}: {json.dumps(v)}" for k, v in (env or {}).items()) or " {}"
        within = f", namespace: {namespace}" if namespace else ""
        self.spec.write_text(f"""
apiVersion: evalrun.io/v1alpha1
kind: EvalCluster
metadata: {{name: local{within}}}
spec:
  scheduler: {{type: local}}
  jobsDir: {self.root}/jobs
  logsDir: {self.root}/logs
  jobScript: {script}
  timeLimit: "01:00:00"
  maxSubmissionsPerPass: {max_per_pass}
  maxLiveJobs: {max_live}
  maxConcurrentTrials: {max_concurrent}
  env:{env_yaml}
{extra_cluster}
---
apiVersion: evalrun.io/v1alpha1
kind: EvalRun
metadata: {{name: {name}{within}}}
spec:
  cluster: local
  models: {models}
  datasets: {datasets}
{extra_run}
""")

    def evalctl(self, *args: str, kill_at: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        return run_evalctl(args, spec=self.spec, store=self.store, env={**os.environ, "COLUMNS": "200"},
                           kill_at=kill_at, check=check, timeout=120)

    def jobs_named(self, name: str) -> list:
        return [j for j in self.scheduler.observe() if j.name == name]

    def cancel_all(self) -> None:
        cancel_live_jobs(self.scheduler)


@pytest.fixture
def cluster(tmp_path: Path):
    the_cluster = Cluster(tmp_path)
    yield the_cluster
    the_cluster.cancel_all()
