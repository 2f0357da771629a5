"""GPU-hours on the lab SLURM (4 fake GPUs as GRES, scripts/slurm-up.sh): an attempt's actual GPU-hours are what
sacct says (ElapsedRaw × AllocTRES gres/gpu); a fresh EvalRun after a completed one is estimated from it; a budget
below that estimate holds the launch, with the numbers in the reason."""

from __future__ import annotations

import json

import pytest

from tests.slurm.conftest import SlurmCluster, slurm, wait_until

pytestmark = pytest.mark.slurm
GPUS = 2
FAST = {"FAKE_HARBOR_TASKS": "4", "FAKE_HARBOR_TRIAL_SECONDS": "0.5"}


def write(cluster: SlurmCluster, *, name: str, model: str, extra_run: str = "") -> None:
    cluster.write(models=[model], datasets=["DCAgent/gpubench"], script=cluster.fake_harbor_script(), env=FAST,
                  name=name, extra_run=f"  monitor: {{settleMinutes: 0}}\n{extra_run}",
                  extra_cluster=f"  gpusPerJob: {GPUS}")


def complete(cluster: SlurmCluster) -> dict:
    """Acting passes until the EvalRun's one cell is Completed and its job's hours are recorded (sacct accounts a
    job a moment after it ends: the pass that sees it accounted records them); its submission record then."""
    def done() -> dict | None:
        cluster.reconcile()
        records = cluster._query("SELECT job_id, gpu_hours, finished_at FROM evalrun_submissions")
        completed = cluster.status()["counts"] == {"Completed": 1}
        return dict(records[0]) if completed and records and records[0]["gpu_hours"] is not None else None

    return wait_until(done, "the cell Completed, its GPU-hours recorded", step_s=1.0)  # type: ignore[return-value]


def sacct_gpu_hours(cluster: SlurmCluster, job_id: str) -> tuple[int, str]:
    out = slurm(["sacct", "-n", "-P", "-X", "-j", job_id, "-o", "ElapsedRaw,AllocTRES"], cluster.env).stdout
    elapsed, tres = out.strip().split("|")
    return int(elapsed), tres


def test_an_attempts_gpu_hours_are_sacct_elapsed_times_allocated_gpus(cluster: SlurmCluster) -> None:
    write(cluster, name="gpu-first", model=cluster.model(1))

    record = complete(cluster)

    elapsed, tres = sacct_gpu_hours(cluster, record["job_id"])
    assert f"gres/gpu={GPUS}" in tres.split(","), f"the job ran with --gres gpu:{GPUS}: {tres}"
    assert elapsed > 0
    assert record["gpu_hours"] == elapsed * GPUS / 3600
    (row,) = cluster.rows()
    # the upload carries the hours sacct had accounted by then (a job that just ended may not be accounted yet)
    assert row["stats"].get("gpu_hours") in (None, record["gpu_hours"]), "the row's stats carry the attempt's hours"
    status = cluster.status()
    assert status["cells"][0]["gpu_hours"] == record["gpu_hours"] == status["gpu_hours"]["spent"]


def test_a_fresh_evalrun_is_estimated_from_the_completed_one_and_a_budget_below_holds_it(
        cluster: SlurmCluster) -> None:
    write(cluster, name="gpu-first", model=cluster.model(1))
    spent = complete(cluster)["gpu_hours"]
    assert spent > 0

    write(cluster, name="gpu-second", model=cluster.model(2))
    (fresh,) = cluster.plan_cells()
    assert (fresh["est_gpu_hours"]["source"], fresh["est_gpu_hours"]["hours"]) == ("history", spent)
    assert any(a["kind"] == "submit" for a in fresh["actions"])

    write(cluster, name="gpu-second", model=cluster.model(2), extra_run=f"  budget: {{maxGpuHours: {spent / 2}}}")
    (held,) = cluster.plan_cells()
    cluster.reconcile()

    (hold,) = [a for a in held["actions"] if a["kind"] == "hold"]
    assert hold["reason"].startswith(f"budget: {spent:.2g} of {spent / 2:g} GPU-h"), hold["reason"]
    assert not [a for a in held["actions"] if a["kind"] == "submit"]
    assert len(cluster._query("SELECT name FROM evalrun_submissions")) == 1, "the second EvalRun launched nothing"
    summary = json.loads(cluster.evalctl("status", "-o", "json").stdout)["evalruns"][0]["gpu_hours"]
    assert (summary["max_hours"], summary["held"], summary["by_source"]) == (spent / 2, 1, {"history": 1})
