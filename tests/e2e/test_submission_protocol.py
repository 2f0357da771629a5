"""The create-pending protocol under SIGKILL: whatever step the reconciler dies at, one job per cell."""

from __future__ import annotations

import json
import re
import signal
import sqlite3

import pytest

from tests.fixtures.evalctl import wait_until

MODELS = ["org/m-8B", "org/n-8B"]
DATASETS = ["DCAgent/tiny"]


def submissions(cluster) -> list[tuple[str, str | None]]:
    with sqlite3.connect(cluster.root / "store.db") as conn:
        return sorted(conn.execute("SELECT name, job_id FROM evalrun_submissions").fetchall())


@pytest.mark.parametrize("step", ["after-submission", "after-intent", "after-find", "after-submit"])
def test_kill_at_each_step_then_one_job_per_cell(cluster, step):
    cluster.write(models=MODELS, datasets=DATASETS, env={"FAKE_HARBOR_HANG_AFTER": "1", "FAKE_HARBOR_TASKS": "4"})
    killed = cluster.evalctl("reconcile", "--once", kill_at=step)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    cluster.evalctl("reconcile", "--once")
    cluster.evalctl("reconcile", "--once")  # a third pass must not add anything either
    plan = json.loads(cluster.evalctl("plan", "-o", "json").stdout)
    for cell in plan["evalruns"][0]["cells"]:
        name = next(n for n, _ in submissions(cluster) if cell["model"].replace("/", "__") in n)
        assert len(cluster.jobs_named(name)) == 1, f"{step}: {name} has {cluster.jobs_named(name)}"
    assert len(cluster.scheduler.observe()) == len(MODELS)
    assert all(job_id is not None for _, job_id in submissions(cluster)), "every job id is recorded in the end"
    assert len(submissions(cluster)) == len(MODELS)
    with sqlite3.connect(cluster.root / "store.db") as conn:
        rows = conn.execute("SELECT s.name, r.job_status FROM evalrun_submissions s JOIN sandbox_jobs r ON r.id = s.row_id"
                            " WHERE r.slurm_job_id = s.job_id").fetchall()
    assert len(rows) == len(MODELS), "every submission has its row, which carries its job id"
    assert not any(re.search(r"-r\d+$", name) for name, _ in rows), f"{step}: an interrupted intent became a resume"


def test_jobs_outlive_the_reconciler_and_the_next_pass_sees_them_running(cluster):
    cluster.write(models=MODELS[:1], datasets=DATASETS, env={"FAKE_HARBOR_HANG_AFTER": "2", "FAKE_HARBOR_TASKS": "4"})
    cluster.evalctl("reconcile", "--once")
    [job] = cluster.scheduler.observe()
    wait_until(lambda: cluster.scheduler.observe()[0].state.value == "Running", "the job to run")
    wait_until(lambda: len(list((cluster.root / "jobs").glob("*/*__*/result.json"))) >= 2, "two trials")
    cell = json.loads(cluster.evalctl("plan", "-o", "json").stdout)["evalruns"][0]["cells"][0]
    assert cell["phase"] == "Running" and cell["actions"][0]["kind"] == "wait"
    with sqlite3.connect(cluster.root / "store.db") as conn:
        assert conn.execute("SELECT job_status FROM sandbox_jobs").fetchall() == [("Pending",)]
    cluster.evalctl("reconcile", "--once")
    with sqlite3.connect(cluster.root / "store.db") as conn:
        assert conn.execute("SELECT job_status, slurm_job_id FROM sandbox_jobs").fetchall() == [
            ("Started", job.job_id)]
