"""Writes: the intent is one idempotent transaction, rows only move forward, results land as a list."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from controller.adapters.store.errors import WriteRefused
from controller.adapters.store.sqlite import SqliteStore
from controller.core.ports import ResultUpload
from controller.core.types import Metric, RowStatus
from tests.fixtures.legacy_db import Families, LegacyDB
from tests.store.builders import RUN_TAG, T0, new_row, submission

MODEL = "laion/Qwen3-8B-sft-v3"
RESULT = ResultUpload(
    metrics=(Metric(name="accuracy", value=0.42), Metric(name="accuracy_stderr", value=0.03)),
    stats={"n_trials": 290, "n_infra_errors": 10, "infra_error_breakdown": {"DaytonaError": 10}},
    n_trials=300,
    ended_at=datetime(2025, 6, 2, 8, tzinfo=UTC),
)


def count(path: Path, table: str) -> int:
    with sqlite3.connect(path) as conn:
        return conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


def test_record_intent_twice_is_one_submission_and_one_row(store: SqliteStore, db_path: Path) -> None:
    store.record_intent(submission(), new_row())
    store.record_intent(submission(), new_row())

    snapshot = store.observe("qwen-evals", [MODEL], ["dev_set_v2"])
    assert [s.name for s in snapshot.submissions] == [RUN_TAG]
    assert [r.id for r in snapshot.rows] == ["row-1"]
    assert (count(db_path, "models"), count(db_path, "benchmarks")) == (1, 1)


def test_record_intent_writes_an_ot_agent_pending_row(store: SqliteStore, db_path: Path) -> None:
    store.record_intent(submission(), new_row())

    with sqlite3.connect(db_path) as conn:
        conn.row_factory = sqlite3.Row
        row = conn.execute("SELECT * FROM sandbox_jobs").fetchone()
        model = conn.execute("SELECT * FROM models").fetchone()
    assert row["job_status"] == "Pending"
    assert row["slurm_job_id"] == "pending"
    assert row["job_name"] == RUN_TAG
    assert row["submitted_at"] == "2025-06-01T12:00:00.000000+00:00"
    assert json.loads(row["config"])["run_tag"] == RUN_TAG
    assert row["model_id"] == model["id"]
    assert (model["name"], model["created_by"]) == (MODEL, "alice")


def test_intent_reuses_existing_legacy_models_and_benchmarks(legacy: tuple[LegacyDB, Families], db_path: Path) -> None:
    _, fam = legacy
    store = SqliteStore(db_path)

    store.record_intent(submission(), new_row(benchmark="DCAgent_dev_set_v2"))

    (row,) = store.observe("qwen-evals", [MODEL], ["dev_set_v2"]).rows
    store.close()
    assert (row.model_id, row.benchmark_id) == (fam.qwen, fam.v2_dcagent)
    assert count(db_path, "models") == 3


def test_a_crash_after_the_intent_leaves_a_pending_row_the_next_pass_sees(db_path: Path) -> None:
    crash = (
        "import os\n"
        "from controller.adapters.store.sqlite import SqliteStore\n"
        "from tests.store.builders import new_row, submission\n"
        f"SqliteStore({str(db_path)!r}).record_intent(submission(), new_row())\n"
        "os._exit(9)  # dies before sbatch and record_job_id, without closing anything\n"
    )
    result = subprocess.run([sys.executable, "-c", crash], check=False, cwd=Path(__file__).parents[2])
    assert result.returncode == 9

    store = SqliteStore(db_path, readonly=True)
    snapshot = store.observe("qwen-evals", [MODEL], ["dev_set_v2"])
    store.close()
    (row,) = snapshot.rows
    (sub,) = snapshot.submissions
    assert (row.job_status, row.slurm_job_id, row.job_name) == ("Pending", "pending", RUN_TAG)
    assert (sub.row_id, sub.job_id) == ("row-1", None)


def test_record_job_id_sets_submission_and_row(store: SqliteStore) -> None:
    store.record_intent(submission(), new_row())

    store.record_job_id(RUN_TAG, "4242", "row-1")
    store.record_job_id(RUN_TAG, "4242", "row-1")

    snapshot = store.observe("qwen-evals", [MODEL], ["dev_set_v2"])
    assert snapshot.submissions[0].job_id == "4242"
    assert snapshot.rows[0].slurm_job_id == "4242"


def test_update_row_status_moves_forward_and_never_back(store: SqliteStore) -> None:
    store.record_intent(submission(), new_row())
    started = datetime(2025, 6, 1, 13, tzinfo=UTC)

    store.update_row_status("row-1", RowStatus.STARTED, started_at=started, slurm_job_id="4242")
    store.update_row_status("row-1", RowStatus.STARTED)  # repeat without details keeps them
    store.update_row_status("row-1", RowStatus.PENDING)  # a stale plan cannot undo it

    row = store.read_row("row-1")
    assert (row.job_status, row.started_at, row.slurm_job_id) == ("Started", started, "4242")


def test_upload_result_round_trips_metrics_as_a_list(store: SqliteStore, db_path: Path) -> None:
    store.record_intent(submission(), new_row())

    store.upload_result("row-1", RESULT)
    store.upload_result("row-1", RESULT)
    store.update_row_status("row-1", RowStatus.STARTED)  # too late: Finished stays Finished

    row = store.read_row("row-1")
    assert (row.job_status, row.metrics, row.ended_at) == ("Finished", RESULT.metrics, RESULT.ended_at)
    with sqlite3.connect(db_path) as conn:
        metrics, stats, n_trials = conn.execute("SELECT metrics, stats, n_trials FROM sandbox_jobs").fetchone()
    assert json.loads(metrics) == [{"name": "accuracy", "value": 0.42}, {"name": "accuracy_stderr", "value": 0.03}]
    assert json.loads(stats) == RESULT.stats
    assert n_trials == 300


def test_writes_to_another_users_row_are_refused_when_owner_is_given(
    legacy: tuple[LegacyDB, Families], db_path: Path
) -> None:
    db, fam = legacy
    bobs = db.add_row(fam.qwen, fam.v2, username="bob", job_status="Started")
    store = SqliteStore(db_path)

    with pytest.raises(WriteRefused, match="bob"):
        store.update_row_status(bobs, RowStatus.FINISHED, owner="alice")
    with pytest.raises(WriteRefused, match="bob"):
        store.upload_result(bobs, RESULT, owner="alice")

    row = store.read_row(bobs)
    store.close()
    assert (row.job_status, row.metrics) == ("Started", None)


def test_writes_to_a_missing_row_fail(store: SqliteStore) -> None:
    with pytest.raises(LookupError):
        store.upload_result("no-such-row", RESULT)


def test_create_row_is_idempotent_on_id(store: SqliteStore, db_path: Path) -> None:
    orphan = new_row("orphan", status=RowStatus.STARTED)

    store.create_row(orphan)
    store.create_row(orphan)

    assert count(db_path, "sandbox_jobs") == 1
    assert store.read_row("orphan").job_status == "Started"
    assert store.read_row("orphan").created_at > T0


def test_read_row_of_an_unknown_id_is_none(store: SqliteStore) -> None:
    assert store.read_row("nope") is None
