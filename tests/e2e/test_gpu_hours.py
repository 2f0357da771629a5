"""GPU-hours end to end on the local scheduler: actual hours per attempt (wall × gpusPerJob), stored with the
attempt and in the row's stats, shown by status; a fresh EvalRun's plan estimates from that history; a budget
below the estimate holds the launch, with the numbers."""

from __future__ import annotations

import json
import sqlite3

from tests.e2e.conftest import Cluster

GPUS = 720  # a second of wall time is 0.2 GPU-hours: numbers a reason shows legibly
FAST = {"FAKE_HARBOR_TASKS": "4", "FAKE_HARBOR_TRIAL_SECONDS": "0.3"}
DATASET = "DCAgent/tiny_gpu"


def write(cluster: Cluster, *, name: str, model: str, extra_run: str = "") -> None:
    cluster.write(models=[model], datasets=[DATASET], env=FAST, name=name, extra_run=extra_run,
                  extra_cluster=f"  gpusPerJob: {GPUS}")


def first_cell(output: str) -> dict:
    return json.loads(output)["evalruns"][0]["cells"][0]


def test_actual_gpu_hours_are_wall_times_gpus_stored_with_the_attempt_and_in_the_rows_stats(cluster: Cluster) -> None:
    write(cluster, name="first", model="org/a-8B")

    cluster.evalctl("reconcile", "--loop", "--interval", "0.5", "--until-done")

    (job,) = cluster.scheduler.observe()
    assert job.started_at is not None and job.ended_at is not None
    expected = (job.ended_at - job.started_at).total_seconds() * GPUS / 3600
    with sqlite3.connect(cluster.root / "store.db") as conn:
        recorded, finished = conn.execute("SELECT gpu_hours, finished_at FROM evalrun_submissions").fetchone()
        (stats,) = conn.execute("SELECT stats FROM sandbox_jobs").fetchone()
    assert recorded == expected and finished is not None, "recorded once the job ended; the attempt is history"
    assert json.loads(stats)["gpu_hours"] == expected
    status = json.loads(cluster.evalctl("status", "-o", "json").stdout)["evalruns"][0]
    assert status["cells"][0]["gpu_hours"] == expected
    assert status["gpu_hours"]["spent"] == expected
    assert f"{expected:.2f} GPU-h" in cluster.evalctl("status").stdout


def test_a_fresh_evalrun_is_estimated_from_history_and_a_budget_below_it_holds_the_launch(cluster: Cluster) -> None:
    write(cluster, name="first", model="org/a-8B")
    cluster.evalctl("plan")  # nothing in the store yet: nothing to go by
    unknown = first_cell(cluster.evalctl("plan", "-o", "json").stdout)["est_gpu_hours"]
    assert unknown["source"] == "unknown" and unknown["hours"] is None
    cluster.evalctl("reconcile", "--loop", "--interval", "0.5", "--until-done")
    with sqlite3.connect(cluster.root / "store.db") as conn:
        (spent,) = conn.execute("SELECT gpu_hours FROM evalrun_submissions").fetchone()

    write(cluster, name="second", model="org/b-7B")  # another model of the same size band, the same benchmark
    estimate = first_cell(cluster.evalctl("plan", "-o", "json").stdout)["est_gpu_hours"]
    table = cluster.evalctl("plan").stdout

    assert (estimate["source"], estimate["hours"]) == ("history", spent)
    assert f"{spent:.2f} (history)" in table and "est. GPU-h" in table

    write(cluster, name="second", model="org/b-7B", extra_run=f"  budget: {{maxGpuHours: {spent / 2}}}")
    cell = first_cell(cluster.evalctl("plan", "-o", "json").stdout)
    result = cluster.evalctl("reconcile", "--once")

    (hold,) = [a for a in cell["actions"] if a["kind"] == "hold"]
    assert hold["reason"].startswith(f"budget: {spent:.2g} of {spent / 2:g} GPU-h")
    assert not [a for a in cell["actions"] if a["kind"] == "submit"]
    assert "0 action(s) done" in result.stdout
    assert len(cluster.scheduler.observe()) == 1, "only the first EvalRun's job ever ran"
