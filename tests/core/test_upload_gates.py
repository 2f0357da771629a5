"""Upload gates: a run whose numbers should not reach the leaderboard unreviewed is held with the numbers in
the reason, and `upload.forceUpload` releases it (never a run with nothing completed)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from controller.core.planner import plan_cell
from controller.core.types import CellMemory, JobState
from controller.core.vocabulary import Phase
from tests.core.builders import NOW, POLICY, ago, cell, facts, job, obs, row, sub

C = cell()
TAG = C.run_tag(1)


def finished_run(**changes: object):
    dir_ = facts(TAG, total=100, completed=100).model_copy(update=changes)
    return obs(subs=(sub(C),), rows=(row("Started", job_name=TAG),),
               jobs=(job(TAG, JobState.COMPLETED, started=ago(hours=5), ended=ago(hours=2)),), dirs=(dir_,))


GATES = POLICY.model_copy(update={"max_infra_error_fraction": 0.2, "overlong": timedelta(hours=24)})


@pytest.mark.parametrize(("changes", "says"), [
    ({"n_infra_errors": 30, "n_scored": 70}, "30 infra errors in 100 completed (30%), above maxInfraErrorFraction 0.2"),
    ({"started_at": ago(hours=30)}, "longer than overlongHours 24 (is_overlong)"),
])
def test_a_run_past_a_gate_is_held_with_its_numbers(changes: dict, says: str) -> None:
    decided = plan_cell(C, finished_run(**changes), GATES.model_copy(update={"infra_error_threshold": 50}), NOW)

    assert decided.phase == Phase.FAILED and [a.kind.value for a in decided.actions] == ["hold"]
    assert says in decided.reason and "forceUpload" in decided.reason


def test_force_upload_releases_a_held_run() -> None:
    forced = GATES.model_copy(update={"force_upload": True, "infra_error_threshold": 50})

    decided = plan_cell(C, finished_run(n_infra_errors=30, n_scored=70), forced, NOW)

    assert decided.phase == Phase.EVALUATED and [a.kind.value for a in decided.actions] == ["analyze", "upload"]


def test_within_every_gate_the_run_is_uploaded() -> None:
    decided = plan_cell(C, finished_run(n_infra_errors=10, n_scored=90), GATES, NOW)

    assert decided.phase == Phase.EVALUATED and [a.kind.value for a in decided.actions] == ["analyze", "upload"]


def test_nothing_completed_is_never_uploaded_even_when_forced() -> None:
    forced = POLICY.model_copy(update={"force_upload": True, "max_total_fires": 1})

    decided = plan_cell(C, finished_run(n_completed=0, n_scored=0, n_trial_dirs=0, finished_at=None), forced, NOW)

    assert decided.phase == Phase.FAILED and "forceUpload" not in decided.reason


NO_DB = POLICY.model_copy(update={"upload_db": False})


def test_without_db_upload_the_report_is_the_goal() -> None:
    first = plan_cell(C, finished_run(), NO_DB, NOW)
    analysed = plan_cell(C, finished_run().model_copy(update={"memory": CellMemory(analyzed_run_tag=TAG)}), NO_DB, NOW)
    older = plan_cell(C, finished_run().model_copy(update={"memory": CellMemory(analyzed_run_tag=C.run_tag(0))}), NO_DB, NOW)

    assert first.phase == Phase.EVALUATED and [a.kind.value for a in first.actions] == ["analyze"]
    assert analysed.phase == Phase.COMPLETED and "upload.db and upload.mlflow are off" in analysed.reason
    assert older.phase == Phase.EVALUATED, "another run's report does not count"


def test_without_db_upload_mlflow_alone_decides_completed() -> None:
    tracked = NO_DB.model_copy(update={"track": True})

    first = plan_cell(C, finished_run().model_copy(update={"memory": CellMemory(analyzed_run_tag=TAG)}), tracked, NOW)
    failed = plan_cell(C, finished_run().model_copy(update={"memory": CellMemory(track_error="MLflow: metric accuracy: …")}),
                       tracked, NOW)
    verified = plan_cell(C, finished_run().model_copy(update={"memory": CellMemory(tracked_run_tag=TAG)}), tracked, NOW)

    assert first.phase == Phase.EVALUATED and [a.kind.value for a in first.actions] == ["analyze", "track"]
    assert "UploadNotVerified" in first.reason, "a written report is not a verified upload"
    assert failed.phase == Phase.EVALUATED and "MLflow: metric accuracy" in failed.reason
    assert verified.phase == Phase.COMPLETED and "upload.db is off" in verified.reason
    assert verified.score is not None, "a Completed cell shows its score"
