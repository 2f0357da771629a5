"""Upload gates: a run whose numbers should not reach the leaderboard unreviewed is held with the numbers in
the reason, and `upload.forceUpload` releases it (flagged partial; never a run with nothing completed). An overlong
run is uploaded with `is_overlong` on its row (`upload.overlong: upload`, the default) or held (`hold`)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from controller.api.catalog import load_catalog
from controller.core.actions import Analyze, Track, Upload
from controller.core.admission import Refused
from controller.core.levers import force_upload_lever
from controller.core.observed import JobState
from controller.core.planner import Policy, plan_cell
from controller.core.remedies import CellMemory
from controller.core.vocabulary import CellPlan, Phase, Rule
from tests.core.builders import ME, NOW, POLICY, SCORED, ago, cell, facts, job, metrics_of, obs, row, sub

C = cell()
TAG = C.run_tag(1)


def finished_run(**changes: object):
    dir_ = facts(TAG, total=100, completed=100).model_copy(update=changes)
    return obs(subs=(sub(C),), rows=(row("Started", job_name=TAG),),
               jobs=(job(TAG, JobState.COMPLETED, started=ago(hours=5), ended=ago(hours=2)),), dirs=(dir_,))


GATES = POLICY.model_copy(update={"admission": POLICY.admission.model_copy(update={"max_infra_fraction": 0.2}),
                                  "overlong": timedelta(hours=24), "hold_overlong": True, "infra_error_threshold": 50,
                                  "max_total_fires": 1})
INFRA_30 = {"n_infra_errors": 30, "n_scored": 70, "n_graded": 70, "reward_sum": 35.0,
            "tasks": {f"t{i}": (1, 0, 0.0) if i < 30 else (1, 1, 0.5) for i in range(100)}}


def test_an_overlong_run_is_held_with_its_numbers() -> None:
    decided = plan_cell(C, finished_run(started_at=ago(hours=30)), GATES, NOW)

    assert decided.phase == Phase.FAILED and [a.kind.value for a in decided.actions] == ["hold"]
    assert "ran 28 h, longer than overlongHours 24 (is_overlong; upload.overlong: hold)" in decided.reason
    assert "forceUpload" in decided.reason


def test_a_run_over_the_infra_share_is_resumed_then_held_with_its_numbers() -> None:
    resumed = plan_cell(C, finished_run(**INFRA_30), GATES.model_copy(update={"max_total_fires": 2}), NOW)
    held = plan_cell(C, finished_run(**INFRA_30), GATES, NOW)

    assert [a.kind.value for a in resumed.actions] == ["resume"] and "InfraShare" in resumed.reason
    assert held.phase == Phase.FAILED and [a.kind.value for a in held.actions] == ["hold"]
    assert "30 of 100 trials are infra (30%), above upload.maxInfraErrorFraction 0.2" in held.reason
    assert "upload.partial: upload" in held.reason


def test_force_upload_releases_a_held_run_flagged_partial() -> None:
    """`upload.forceUpload` (like `upload.partial: upload`) lets the gate publish it, flagged partial."""
    gate = POLICY.admission.model_copy(update={"max_infra_fraction": 0.2, "partial_upload": True})
    forced = GATES.model_copy(update={"force_upload": True, "admission": gate})

    decided = plan_cell(C, finished_run(**INFRA_30), forced, NOW)

    assert decided.phase == Phase.EVALUATED and [a.kind.value for a in decided.actions] == ["analyze", "upload"]
    [upload] = [a for a in decided.actions if isinstance(a, Upload)]
    assert upload.admitted.partial and upload.admitted.score == 0.5 and upload.admitted.n_scored == 70


def test_a_held_run_a_partial_upload_may_publish_says_so_and_the_flag_is_named_beside_the_retry() -> None:
    held = plan_cell(C, finished_run(**INFRA_30), GATES, NOW)

    assert isinstance(held.admission, Refused) and held.admission.partial_would_publish
    assert "set upload.partial: upload (or upload.forceUpload: true) to publish it flagged partial" in held.reason
    lever = force_upload_lever(held)
    assert lever is not None and lever.startswith("set upload.forceUpload: true in the EvalRun: uploads this run")
    assert "covers upload.minCompletedFraction, flagged partial" in lever


def test_a_held_run_short_of_min_completed_fraction_is_not_said_to_be_released_by_a_flag() -> None:
    """forceUpload does not lower upload.minCompletedFraction: neither the reason nor the lever may say it does."""
    short = {"n_completed": 30, "n_scored": 30, "n_graded": 30, "reward_sum": 15.0, "n_trial_dirs": 30,
             "tasks": {f"t{i}": (1, 1, 0.5) for i in range(30)}}
    for policy in (GATES, GATES.model_copy(update={"admission": GATES.admission.model_copy(
            update={"partial_upload": True})})):
        held = plan_cell(C, finished_run(**short), policy, NOW)

        assert held.phase == Phase.FAILED and held.rule == Rule.ADMISSION_INCOMPLETE, held.reason
        assert "30% of the expected trials covered, below the upload.minCompletedFraction 0.5" in held.reason
        assert "to publish it flagged partial" not in held.reason
        assert force_upload_lever(held) is None


def test_an_overlong_hold_names_the_flag_and_what_it_uploads() -> None:
    held = plan_cell(C, finished_run(started_at=ago(hours=30)), GATES, NOW)

    lever = force_upload_lever(held)
    assert lever is not None and "held as overlong, flagged is_overlong" in lever


def test_force_upload_releases_a_held_overlong_run_flagged() -> None:
    forced = GATES.model_copy(update={"force_upload": True})

    decided = plan_cell(C, finished_run(started_at=ago(hours=30)), forced, NOW)

    assert decided.phase == Phase.EVALUATED and _uploads(decided) == [True]


def _uploads(decided: CellPlan) -> list[bool]:
    """The is_overlong of each upload the cell plans."""
    return [a.is_overlong for a in decided.actions if isinstance(a, Upload)]


FLAGGING = POLICY.model_copy(update={"overlong": timedelta(hours=24)})  # upload.overlong: upload, the default


def test_an_overlong_run_is_uploaded_flagged_and_says_so() -> None:
    decided = plan_cell(C, finished_run(started_at=ago(hours=30)), FLAGGING, NOW)

    assert decided.phase == Phase.EVALUATED and [a.kind.value for a in decided.actions] == ["analyze", "upload"]
    assert _uploads(decided) == [True]
    assert "flagged is_overlong: ran 28 h, longer than overlongHours 24" in decided.reason
    assert "flagged is_overlong" in decided.actions[1].reason


@pytest.mark.parametrize(("policy", "started_hours_ago"), [
    (FLAGGING, 25.9),  # ran 23.9 h: below the threshold
    (FLAGGING, 26),  # exactly 24 h is not longer than 24 h
    (FLAGGING.model_copy(update={"overlong": timedelta(hours=10_000)}), 24 * 30),  # a threshold no run reaches
])
def test_a_run_within_overlong_hours_is_uploaded_unflagged(policy: Policy, started_hours_ago: float) -> None:
    decided = plan_cell(C, finished_run(started_at=ago(hours=started_hours_ago)), policy, NOW)

    assert _uploads(decided) == [False] and "is_overlong" not in decided.reason


def test_by_default_a_run_is_overlong_when_it_outlasted_one_job_of_its_cell() -> None:
    """The cell's walltime (the cluster's timeLimit, or a preset's, as resolve decided it): a run the wall cut
    short, as the lab's `upload_overlong_jobs.py` flagged the runs its 24 h wall had killed."""
    assert POLICY.overlong == "walltime" and not POLICY.hold_overlong
    ten_hours = C.model_copy(update={"time_limit": "10:00:00"})
    run = finished_run(started_at=ago(hours=13))  # ran 11 h
    assert _uploads(plan_cell(ten_hours, run, POLICY, NOW)) == [True]
    assert "longer than one job's walltime 10" in plan_cell(ten_hours, run, POLICY, NOW).reason
    long_preset = C.model_copy(update={"time_limit": "2-00:00:00"})
    assert _uploads(plan_cell(long_preset, run, POLICY, NOW)) == [False], "its jobs may run 48 h"


def test_with_walltime_auto_overlong_is_still_the_cells_walltime_not_a_sized_request() -> None:
    """A sized request says how long a run was expected to take; overlong says a run outlasted what one job of the
    cell may run (RULES §16): a run a little slower than its estimate is not flagged."""
    auto = POLICY.model_copy(update={"walltime": POLICY.walltime.model_copy(update={"auto": True})})
    run = finished_run(started_at=ago(hours=8))  # ran 6 h: more than any request sized for a 4 h estimate
    assert _uploads(plan_cell(C.model_copy(update={"time_limit": "10:00:00"}), run, auto, NOW)) == [False]


def test_an_unfinished_run_is_measured_to_its_last_progress() -> None:
    decided = plan_cell(C, finished_run(started_at=ago(hours=40), finished_at=None, last_progress_at=ago(hours=3)),
                        FLAGGING.model_copy(update={"max_total_fires": 1}), NOW)

    assert _uploads(decided) == [True] and "ran 37 h" in decided.reason


def test_the_mlflow_retry_of_a_finished_row_writes_nothing_to_it() -> None:
    """Reaching MLflow for a Finished row logs the run only: the row, its is_overlong flag included, is history."""
    tracked = FLAGGING.model_copy(update={"track": True})
    dir_ = facts(TAG, total=100, completed=100).model_copy(update={"started_at": ago(hours=30)})
    uploaded = metrics_of(dir_, load_catalog().error_classes, C).metrics
    finished = obs(subs=(sub(C),), rows=(row("Finished", job_name=TAG, metrics=uploaded),), dirs=(dir_,))

    decided = plan_cell(C, finished, tracked, NOW)

    assert decided.phase == Phase.EVALUATED and _uploads(decided) == []
    assert [type(a) for a in decided.actions] == [Analyze, Track]


def test_a_completed_cell_shows_its_flagged_row() -> None:
    flagged = row("Finished", job_name=TAG, metrics=SCORED).model_copy(update={"is_overlong": True})
    plain = row("Finished", job_name=TAG, metrics=SCORED)

    shown = [plan_cell(C, obs(subs=(sub(C),), rows=(r,)), FLAGGING, NOW) for r in (flagged, plain)]

    assert [d.phase for d in shown] == [Phase.COMPLETED, Phase.COMPLETED]
    assert "flagged is_overlong" in shown[0].reason and "is_overlong" not in shown[1].reason


@pytest.mark.parametrize(("user", "says"), [(ME, "ran 28 h, longer than overlongHours 24, but its row is not flagged"),
                                            ("bob", None)])
def test_an_unflagged_row_of_an_overlong_run_is_shown_never_rewritten(user: str, says: str | None) -> None:
    """Our Finished row that lacks the flag (a store that dropped it, or written before the flag): said, not
    re-uploaded. Another user's row is theirs to judge."""
    dir_ = facts(TAG, total=100, completed=100).model_copy(update={"started_at": ago(hours=30)})
    finished = obs(rows=(row("Finished", job_name=TAG, metrics=SCORED, user=user),), dirs=(dir_,))

    decided = plan_cell(C, finished, FLAGGING, NOW)

    assert decided.phase == Phase.COMPLETED and [a.kind.value for a in decided.actions] == ["skip"]
    assert (says in decided.reason) if says else ("is_overlong" not in decided.reason)


def test_within_every_gate_the_run_is_uploaded() -> None:
    decided = plan_cell(C, finished_run(n_infra_errors=10, n_scored=90, n_graded=90), GATES, NOW)

    assert decided.phase == Phase.EVALUATED and [a.kind.value for a in decided.actions] == ["analyze", "upload"]


def test_nothing_completed_is_never_uploaded_even_when_forced() -> None:
    forced = POLICY.model_copy(update={"force_upload": True, "max_total_fires": 1})

    decided = plan_cell(C, finished_run(n_completed=0, n_scored=0, n_graded=0, n_trial_dirs=0, tasks={},
                                        finished_at=None), forced, NOW)

    assert decided.phase == Phase.FAILED and "forceUpload" not in decided.reason


NO_DB = POLICY.model_copy(update={"may_upload": False})


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
