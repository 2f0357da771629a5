"""Two and three reconcilers at once, on EvalRuns that name the same cell, with kill -9 in between.

GitOps and cron users run one `evalctl reconcile --once -f` per spec file; when two files name the same
cell, the cell must still get exactly one job, and the EvalRun that did not claim it says who did.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from controller.adapters.scheduler.local import LocalScheduler
from controller.core.types import run_tag_of
from tests.fixtures.evalctl import cancel_live_jobs

REPO = Path(__file__).resolve().parents[2]
FAKE_HARBOR = REPO / "specs" / "demo" / "fake_harbor.py"
STEPS = ("after-submission", "after-intent", "after-find", "after-submit")
RUNS = {"gitops-a": ["org/m1-8B", "org/m2-8B"], "gitops-b": ["org/m2-8B", "org/m3-8B"]}


class Lab:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.store = f"sqlite:///{root}/store.db"
        self.scheduler = LocalScheduler(root / "logs" / ".local-scheduler")
        (root / "cluster.yaml").write_text(f"""
apiVersion: evalrun.io/v1alpha1
kind: EvalCluster
metadata: {{name: local}}
spec:
  scheduler: {{type: local}}
  jobsDir: {root}/jobs
  logsDir: {root}/logs
  jobScript: {FAKE_HARBOR}
  timeLimit: "01:00:00"
  env: {{FAKE_HARBOR_HANG_AFTER: "1", FAKE_HARBOR_TASKS: "4"}}
""")
        for name, models in RUNS.items():
            (root / f"{name}.yaml").write_text(f"""
apiVersion: evalrun.io/v1alpha1
kind: EvalRun
metadata: {{name: {name}}}
spec:
  cluster: local
  models: {models}
  datasets: [DCAgent/tiny]
""")

    def command(self, evalrun: str, *args: str) -> list[str]:
        return [sys.executable, "-m", "controller.entry.cli", *args, "-f", str(self.root / "cluster.yaml"),
                "-f", str(self.root / f"{evalrun}.yaml"), "--store", self.store]

    def at_once(self, runs: list[tuple[str, str | None]]) -> list[subprocess.CompletedProcess[str]]:
        """Start one `reconcile --once` per (EvalRun, kill step) together; wait for all of them."""
        procs = []
        for evalrun, kill_at in runs:
            env = {**os.environ, "COLUMNS": "250"}
            env.pop("EVALCTL_KILL_AT", None)
            if kill_at:
                env["EVALCTL_KILL_AT"] = kill_at
            procs.append(subprocess.Popen(self.command(evalrun, "reconcile", "--once"), env=env, text=True,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL))
        results = []
        for proc in procs:
            out, err = proc.communicate(timeout=120)
            results.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
        return results

    def plan(self, evalrun: str) -> list[dict]:
        done = subprocess.run(self.command(evalrun, "plan", "-o", "json"), capture_output=True, text=True,
                              check=True, timeout=120)
        return json.loads(done.stdout)["evalruns"][0]["cells"]

    def jobs_per_run_tag(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for job in self.scheduler.observe():
            counts[run_tag_of(job.name)] = counts.get(run_tag_of(job.name), 0) + 1
        return counts

    def stop_jobs(self) -> None:
        cancel_live_jobs(self.scheduler)


@pytest.fixture
def lab(tmp_path: Path):
    the_lab = Lab(tmp_path)
    yield the_lab
    the_lab.stop_jobs()


def _no_traceback(results: list[subprocess.CompletedProcess[str]]) -> None:
    for result in results:
        assert "Traceback" not in result.stderr, result.stderr


def _converged_on_one_job_per_cell(lab: Lab) -> None:
    counts = lab.jobs_per_run_tag()
    assert len(counts) == 3 and set(counts.values()) == {1}, f"one job per distinct cell: {counts}"
    a, b = lab.plan("gitops-a"), lab.plan("gitops-b")
    shared = [c for c in a + b if c["model"] == "org/m2-8B"]
    watching = [c for c in shared if "owned by EvalRun gitops-" in c["reason"]]
    assert len(watching) == 1, f"exactly one EvalRun watches the shared cell: {shared}"
    assert all(action["kind"] == "skip" for action in watching[0]["actions"])


def test_three_reconcilers_at_once_on_overlapping_evalruns_start_one_job_per_cell(lab):
    results = lab.at_once([("gitops-a", None), ("gitops-b", None), ("gitops-a", None)])
    _no_traceback(results)
    results += lab.at_once([("gitops-b", None), ("gitops-a", None)])  # the next cron tick, both again
    _no_traceback(results)
    assert set(lab.jobs_per_run_tag().values()) <= {1}, "never two jobs of a cell, however the passes overlapped"
    # a pass that found another launching on the cluster launches nothing (its launch lease): on a loaded machine
    # every pass of one spec can overlap another's, so a last tick, alone, is what converges
    results += lab.at_once([("gitops-b", None)]) + lab.at_once([("gitops-a", None)])
    _no_traceback(results)
    _converged_on_one_job_per_cell(lab)
    assert not any("duplicate live" in r.stdout for r in results), "nobody had to cancel a duplicate"


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_kill_9_at_random_protocol_steps_across_overlapping_reconcilers(lab, seed):
    rng = random.Random(seed)
    for _ in range(3):
        runs = [(rng.choice(list(RUNS)), rng.choice((*STEPS, None))) for _ in range(rng.randint(2, 3))]
        results = lab.at_once(runs)
        _no_traceback(results)
        for (_, kill_at), result in zip(runs, results, strict=True):
            assert result.returncode in ((-signal.SIGKILL, 0) if kill_at else (0,)), result.stderr
    _no_traceback(lab.at_once([("gitops-a", None), ("gitops-b", None)]))  # a clean pass repairs every crash
    _no_traceback(lab.at_once([("gitops-b", None), ("gitops-a", None)]))
    _converged_on_one_job_per_cell(lab)
