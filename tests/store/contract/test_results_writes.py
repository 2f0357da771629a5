"""Writing to the lab's results DB as a good citizen: our rows only, forward only, each result exactly once."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from controller.core.observed import Metric, RowStatus
from controller.core.ports import WriteRefused
from controller.core.records import NewRow, ResultUpload
from tests.store.contract.conftest import Backend

MODEL = "laion/Qwen3-8B-sft-v3"
RUN_TAG = "ev_laion_qwen3-8b-sft-v3__dev_set_v2__0123456789ab__a1"
T0 = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
RESULT = ResultUpload(
    metrics=(Metric(name="accuracy", value=0.42), Metric(name="accuracy_stderr", value=0.03)),
    stats={"n_trials": 290, "n_infra_errors": 10, "infra_error_breakdown": {"DaytonaError": 10}},
    n_trials=300,
    ended_at=datetime(2025, 6, 2, 8, tzinfo=UTC),
)


def pending_row(row_id: str | None = None, *, benchmark: str = "dev_set_v2", username: str = "alice",
                status: RowStatus = RowStatus.PENDING) -> NewRow:
    return NewRow(id=row_id or str(uuid.uuid4()), job_name=RUN_TAG, username=username, model_name=MODEL,
                  benchmark_name=benchmark, job_status=status, submitted_at=T0,
                  config={"agent": "terminus-2", "env": "daytona", "timeout_multiplier": 2.0, "run_tag": RUN_TAG})


def test_create_row_writes_an_ot_agent_pending_row_once(results_backend: Backend) -> None:
    results = results_backend.results
    row = pending_row()

    results.create_row(row)
    results.create_row(row)

    snapshot = results.read_results([MODEL], ["dev_set_v2"])
    (stored,) = snapshot.rows
    assert (stored.id, stored.job_status, stored.slurm_job_id, stored.job_name) == (row.id, "Pending", "pending", RUN_TAG)
    assert stored.submitted_at == T0 and stored.created_at is not None
    assert stored.config is not None and stored.config["run_tag"] == RUN_TAG
    assert [m.name for m in snapshot.models] == [MODEL] and [b.name for b in snapshot.benchmarks] == ["dev_set_v2"]


def test_create_row_reuses_the_labs_models_and_benchmarks(results_backend: Backend) -> None:
    fam = results_backend.families

    results_backend.results.create_row(pending_row(benchmark="DCAgent_dev_set_v2"))

    snapshot = results_backend.results.read_results([MODEL], ["dev_set_v2"])
    (row,) = snapshot.rows
    assert (row.model_id, row.benchmark_id) == (fam.qwen, fam.v2_dcagent)
    assert len(results_backend.results.read_results(None, None).models) == 3


def test_create_row_leaves_an_existing_row_of_another_user_as_it_is(results_backend: Backend) -> None:
    fam = results_backend.families
    bobs = results_backend.legacy.add_row(fam.qwen, fam.v2, username="bob", job_status="Started")
    before = results_backend.raw_row(bobs)

    results_backend.results.create_row(pending_row(bobs))

    assert results_backend.raw_row(bobs) == before


def test_update_row_moves_forward_and_never_back(results_backend: Backend) -> None:
    results = results_backend.results
    row = pending_row()
    results.create_row(row)
    started = datetime(2025, 6, 1, 13, tzinfo=UTC)

    results.update_row(row.id, owner="alice", status=RowStatus.STARTED, started_at=started)
    results.update_row(row.id, owner="alice", slurm_job_id="4242")
    results.update_row(row.id, owner="alice", status=RowStatus.STARTED)  # repeat without details keeps them
    results.update_row(row.id, owner="alice", status=RowStatus.PENDING)  # a stale plan cannot undo it

    stored = results.read_row(row.id)
    assert stored is not None
    assert (stored.job_status, stored.started_at, stored.slurm_job_id) == ("Started", started, "4242")


def test_upload_lands_as_a_list_exactly_once(results_backend: Backend) -> None:
    results = results_backend.results
    row = pending_row()
    results.create_row(row)

    first = results.upload_result(row.id, RESULT, owner="alice")
    raw_after_first = results_backend.raw_row(row.id)
    again = results.upload_result(row.id, RESULT, owner="alice")
    results.update_row(row.id, owner="alice", status=RowStatus.STARTED)  # too late: Finished stays Finished

    stored = results.read_row(row.id)
    assert (first, again) == (True, False)
    assert results_backend.raw_row(row.id) == raw_after_first, "a repeated upload rewrote the row"
    assert stored is not None
    assert (stored.job_status, stored.metrics, stored.ended_at) == ("Finished", RESULT.metrics, RESULT.ended_at)


OVERLONG = RESULT.model_copy(update={"is_overlong": True})


def _flag(raw: dict[str, Any] | None) -> object:
    """The stored is_overlong as the backend spells it (bool, 0/1)."""
    assert raw is not None
    return raw["is_overlong"]


def test_an_overlong_upload_flags_the_row_exactly_once(results_backend: Backend) -> None:
    results = results_backend.results
    row = pending_row()
    results.create_row(row)

    first = results.upload_result(row.id, OVERLONG, owner="alice")
    raw_after_first = results_backend.raw_row(row.id)
    again = results.upload_result(row.id, OVERLONG, owner="alice")

    stored = results.read_row(row.id)
    assert (first, again) == (True, False)
    assert results_backend.raw_row(row.id) == raw_after_first, "a repeated flagged upload rewrote the row"
    assert _flag(raw_after_first) in (True, 1)
    assert stored is not None and (stored.job_status, stored.metrics, stored.is_overlong) == \
        ("Finished", OVERLONG.metrics, True)


def test_a_run_within_its_hours_reads_back_unflagged(results_backend: Backend) -> None:
    results = results_backend.results
    row = pending_row()
    results.create_row(row)

    results.upload_result(row.id, RESULT, owner="alice")

    stored = results.read_row(row.id)
    assert stored is not None and stored.is_overlong is False and _flag(results_backend.raw_row(row.id)) in (False, 0)


@pytest.mark.parametrize(("before", "after"), [(RESULT, OVERLONG), (OVERLONG, RESULT)])
def test_the_same_metrics_with_another_flag_is_written(results_backend: Backend, before: ResultUpload,
                                                       after: ResultUpload) -> None:
    """Exactly once is per result: the flag is part of it, so the row ends as the last upload says."""
    results = results_backend.results
    row = pending_row()
    results.create_row(row)
    results.upload_result(row.id, before, owner="alice")

    written = results.upload_result(row.id, after, owner="alice")

    stored = results.read_row(row.id)
    assert written and stored is not None and (stored.metrics, stored.is_overlong) == (after.metrics, after.is_overlong)


def test_a_legacy_null_flag_reads_as_not_overlong(results_backend: Backend) -> None:
    """A Finished row of ours whose is_overlong is null already holds an unflagged result: it is left untouched."""
    fam = results_backend.families
    metrics = [{"name": m.name, "value": m.value} for m in RESULT.metrics]
    ours = results_backend.legacy.add_row(fam.qwen, fam.v2, metrics=metrics, is_overlong=None)
    before = results_backend.raw_row(ours)

    assert results_backend.results.upload_result(ours, RESULT, owner="alice") is False

    stored = results_backend.results.read_row(ours)
    assert results_backend.raw_row(ours) == before and stored is not None and stored.is_overlong is None


def test_a_different_result_replaces_a_cleared_or_older_one(results_backend: Backend) -> None:
    results = results_backend.results
    row = pending_row()
    results.create_row(row)
    results.upload_result(row.id, RESULT, owner="alice")
    better = RESULT.model_copy(update={"metrics": (Metric(name="accuracy", value=0.5),)})

    assert results.upload_result(row.id, better, owner="alice")

    stored = results.read_row(row.id)
    assert stored is not None and stored.metrics == better.metrics


@pytest.mark.parametrize("status", ["Started", "Finished", "Pending"])
def test_another_users_row_is_never_modified(results_backend: Backend, status: str) -> None:
    fam = results_backend.families
    metrics = [{"name": "accuracy", "value": 0.1}] if status == "Finished" else None
    bobs = results_backend.legacy.add_row(fam.qwen, fam.v2, username="bob", job_status=status, metrics=metrics)
    before = results_backend.raw_row(bobs)

    with pytest.raises(WriteRefused, match="bob"):
        results_backend.results.update_row(bobs, owner="alice", status=RowStatus.FINISHED, slurm_job_id="1")
    with pytest.raises(WriteRefused, match="bob"):
        results_backend.results.upload_result(bobs, RESULT, owner="alice")

    assert results_backend.raw_row(bobs) == before


def test_writes_to_a_missing_row_fail(results_backend: Backend) -> None:
    missing = str(uuid.uuid4())
    with pytest.raises(LookupError):
        results_backend.results.upload_result(missing, RESULT, owner="alice")
    with pytest.raises(LookupError):
        results_backend.results.update_row(missing, owner="alice", status=RowStatus.STARTED)


def test_read_row_of_an_unknown_id_is_none(results_backend: Backend) -> None:
    assert results_backend.results.read_row(str(uuid.uuid4())) is None


def test_an_upload_names_the_cluster_its_run_ran_on_and_keeps_the_rest_of_the_config(results_backend: Backend) -> None:
    """A cell whose queued job spilled to another cluster got its row where it was first submitted: the row says
    where the numbers were measured once they are uploaded."""
    results = results_backend.results
    row = pending_row()
    results.create_row(row)

    results.upload_result(row.id, RESULT.model_copy(update={"env": "lab-b"}), owner="alice")

    stored = results.read_row(row.id)
    assert stored is not None and stored.config == {**row.config, "env": "lab-b"}


def test_an_upload_leaves_a_config_that_is_no_object_as_it_is(results_backend: Backend) -> None:
    results = results_backend.results
    row = pending_row().model_copy(update={"config": None})
    results.create_row(row)

    results.upload_result(row.id, RESULT.model_copy(update={"env": "lab-b"}), owner="alice")

    stored = results.read_row(row.id)
    assert stored is not None and stored.job_status == "Finished" and not stored.config


def test_a_rows_attempts_per_task_are_read_back_for_matching(results_backend: Backend) -> None:
    """Our rows from before `n_attempts` was in their config say it in n_rep_eval: what keeps a row of one
    attempt per task from completing a cell of three."""
    results = results_backend.results
    results.create_row(pending_row().model_copy(update={"n_rep_eval": 3}))

    (stored,) = results.read_results([MODEL], ["dev_set_v2"]).rows
    assert stored.n_rep_eval == 3
