"""`upload.mlflow` end to end against a real `mlflow server`: a cell is Completed only once its run reads back.

The local scheduler runs the fake Harbor (trial dirs with trajectories and errors); the tracker is the real
MLflow client talking to a real server (sqlite backend), directly or through a proxy that fails or swallows
writes, which is what "exit 0 but nothing stored" looks like.
"""

from __future__ import annotations

import json
import sqlite3
import uuid

import pytest
from mlflow import MlflowClient

from tests.e2e.conftest import Cluster
from tests.fixtures.evalctl import wait_until
from tests.fixtures.mlflow_server import MlflowProxy, MlflowServer

pytestmark = pytest.mark.mlflow
MODELS = ["org/m1-8B", "org/m2-8B"]
DATASETS = ["DCAgent/tiny"]
FAST = {"FAKE_HARBOR_TASKS": "4"}


def setup(cluster: Cluster, uri: str) -> str:
    experiment = f"e2e-{uuid.uuid4().hex[:8]}"
    cluster.write(models=MODELS, datasets=DATASETS, env=FAST,
                  extra_run=f"  upload: {{mlflow: true, mlflowTrackingUri: '{uri}', mlflowExperiment: {experiment}}}")
    return experiment


def runs(server: MlflowServer, experiment: str) -> list:
    client = MlflowClient(server.url)
    found = client.get_experiment_by_name(experiment)
    return [] if found is None else client.search_runs([found.experiment_id])


def phases(cluster: Cluster) -> dict[str, tuple[str, str]]:
    plan = json.loads(cluster.evalctl("plan", "-o", "json").stdout)
    return {c["model"]: (c["phase"], c["reason"]) for c in plan["evalruns"][0]["cells"]}


def db_scores(cluster: Cluster) -> dict[str, float]:
    with sqlite3.connect(cluster.root / "store.db") as conn:
        found = conn.execute("SELECT job_name, metrics FROM sandbox_jobs WHERE job_status = 'Finished'").fetchall()
    return {tag: next(m["value"] for m in json.loads(metrics) if m["name"] == "accuracy") for tag, metrics in found}


def test_completed_cells_hold_score_buckets_and_step_stats_in_one_run_each(cluster: Cluster,
                                                                           mlflow_server: MlflowServer) -> None:
    experiment = setup(cluster, mlflow_server.url)

    cluster.evalctl("reconcile", "--loop", "--interval", "0.5", "--until-done")

    tracked = runs(mlflow_server, experiment)
    scores = db_scores(cluster)
    assert len(tracked) == len(MODELS) and len(scores) == len(MODELS)
    for run in tracked:
        tag = run.data.tags["evalrun.run_tag"]
        assert run.data.metrics["accuracy"] == scores[tag], "the score MLflow shows is the one the DB has"
        assert run.data.metrics["steps_max"] >= run.data.metrics["steps_mean"] > 0, "step stats from trajectories"
        assert run.data.tags["evalrun.model"] in MODELS and run.info.status == "FINISHED"
        assert run.data.metrics["gpu_hours"] == 0.0, "its actual GPU-hours: wall × gpusPerJob (0 on this cluster)"
        assert (run.data.tags["evalrun.provisional"], run.data.tags["evalrun.partial"]) == ("true", "false")
        assert "seen=" in run.data.tags["evalrun.admission"] and "identity=ok" in run.data.tags["evalrun.admission"]
    names = [{name for name in run.data.metrics if name.startswith("errors.")} for run in tracked]
    assert names[0] == names[1] and "errors.DaytonaError" in names[0], "every bucket, zeros included"
    assert all(phase == "Completed" for phase, _ in phases(cluster).values())
    explained = cluster.evalctl("explain", MODELS[0], DATASETS[0]).stdout
    assert "remembered db_verified: row" in explained and "remembered tracked_run_tag: ev_" in explained

    with sqlite3.connect(cluster.root / "store.db") as conn:  # forget the read-back: the next pass re-analyses
        conn.execute("DELETE FROM evalrun_cell_memory")
    assert all(phase == "Evaluated" for phase, _ in phases(cluster).values())
    cluster.evalctl("reconcile", "--once")

    assert len(runs(mlflow_server, experiment)) == len(MODELS), "re-analysis logs to the same run, never a second"
    assert all(phase == "Completed" for phase, _ in phases(cluster).values())


@pytest.mark.parametrize("mode", ["swallow_writes", "fail_writes_500"])
def test_a_server_that_does_not_store_leaves_cells_evaluated_until_it_does(
        cluster: Cluster, mlflow_server: MlflowServer, mlflow_proxy: MlflowProxy, mode: str) -> None:
    experiment = setup(cluster, mlflow_proxy.url)
    mlflow_proxy.mode = "pass"
    cluster.evalctl("reconcile", "--once")  # submits; the experiment is created through the proxy later
    mlflow_proxy.mode = mode  # type: ignore[assignment]

    def evaluated_and_unverified() -> bool:
        cluster.evalctl("reconcile", "--once", check=False)
        seen = phases(cluster)
        return all(phase == "Evaluated" and "UploadNotVerified" in reason for phase, reason in seen.values())

    wait_until(evaluated_and_unverified, "both cells to be Evaluated with UploadNotVerified", timeout_s=120)
    assert len(db_scores(cluster)) == len(MODELS), "the DB upload landed; only MLflow is unverified"
    assert all(not run.data.metrics.get("accuracy") for run in runs(mlflow_server, experiment))

    mlflow_proxy.mode = "pass"
    cluster.evalctl("reconcile", "--once")

    assert all(phase == "Completed" for phase, _ in phases(cluster).values())
    assert len(runs(mlflow_server, experiment)) == len(MODELS)


def test_a_stopped_server_leaves_cells_evaluated_until_it_is_back(cluster: Cluster,
                                                                   mlflow_server: MlflowServer) -> None:
    experiment = setup(cluster, mlflow_server.url)
    cluster.evalctl("reconcile", "--once")  # submits while the server is up
    mlflow_server.stop()
    try:
        def evaluated_and_unverified() -> bool:
            cluster.evalctl("reconcile", "--once", check=False)
            seen = phases(cluster)
            return all(phase == "Evaluated" and "UploadNotVerified" in reason for phase, reason in seen.values())

        wait_until(evaluated_and_unverified, "both cells to be Evaluated with UploadNotVerified", timeout_s=120)
        failed = cluster.evalctl("reconcile", "--once", check=False)
        assert failed.returncode == 1, "an upload that could not be verified is a failed action"
        explained = cluster.evalctl("explain", MODELS[0], DATASETS[0]).stdout
        assert "remembered track_error: MLflow:" in explained and "remembered db_verified: row" in explained
    finally:
        mlflow_server.start()

    cluster.evalctl("reconcile", "--once")

    assert all(phase == "Completed" for phase, _ in phases(cluster).values())
    assert len(runs(mlflow_server, experiment)) == len(MODELS)


def test_with_db_upload_off_mlflow_read_back_alone_completes_a_cell(cluster: Cluster,
                                                                     mlflow_server: MlflowServer) -> None:
    experiment = f"e2e-{uuid.uuid4().hex[:8]}"
    cluster.write(models=MODELS, datasets=DATASETS, env=FAST,
                  extra_run=f"  upload: {{db: false, mlflow: true, mlflowTrackingUri: '{mlflow_server.url}', "
                            f"mlflowExperiment: {experiment}}}")

    cluster.evalctl("reconcile", "--loop", "--interval", "0.5", "--until-done")

    assert db_scores(cluster) == {}, "upload.db off: no row is Finished by us"
    tracked = runs(mlflow_server, experiment)
    assert len(tracked) == len(MODELS) and all(run.data.metrics["accuracy"] >= 0 for run in tracked)
    seen = phases(cluster)
    assert all(phase == "Completed" and "read back as logged; upload.db is off" in reason
               for phase, reason in seen.values()), seen
