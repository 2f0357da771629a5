"""The monitor rules that need memory (RULES §5, the eval-monitor seed): a second stuck-general reading
escalates, and a run the monitor cancelled is analysed and uploaded as it is, never resumed."""

from __future__ import annotations

from datetime import timedelta

from controller.core.observed import JobState
from controller.core.planner import plan_cell
from controller.core.remedies import CellMemory, StallReading
from controller.core.vocabulary import Phase, Rule
from tests.core.builders import NOW, POLICY, ago, cell, facts, job, obs, row, sub

C = cell()
TAG = C.run_tag(1)


def running(memory: CellMemory, *, scored: int = 100, quiet_min: float = 91):
    dir_ = facts(TAG, total=300, completed=scored, scored=scored, finished=False, last_progress=ago(minutes=quiet_min))
    observed = obs(subs=(sub(C),), rows=(row("Started", job_name=TAG),),
                   jobs=(job(TAG, JobState.RUNNING, started=ago(hours=5)),), dirs=(dir_,))
    return observed.model_copy(update={"memory": memory})


def kinds(decided) -> list[str]:
    return [a.kind.value for a in decided.actions]


def test_the_first_stuck_general_reading_reports_and_is_remembered() -> None:
    decided = plan_cell(C, running(CellMemory()), POLICY, NOW)

    assert decided.phase == Phase.STALLED and kinds(decided) == ["wait"] and "first reading" in decided.reason
    assert decided.remember == CellMemory(stall_reading=StallReading(run_tag=TAG, scored=100, at=NOW))


def test_a_second_reading_a_whole_window_later_without_a_new_score_cancels_to_upload() -> None:
    first = CellMemory(stall_reading=StallReading(run_tag=TAG, scored=100, at=NOW - timedelta(minutes=90)))

    decided = plan_cell(C, running(first, quiet_min=181), POLICY, NOW)

    assert kinds(decided) == ["cancel"] and "second reading" in decided.reason
    assert decided.remember == CellMemory(upload_as_is=TAG)


def test_readings_closer_than_a_window_only_report() -> None:
    first = CellMemory(stall_reading=StallReading(run_tag=TAG, scored=100, at=NOW - timedelta(minutes=30)))

    decided = plan_cell(C, running(first, quiet_min=121), POLICY, NOW)

    assert kinds(decided) == ["wait"] and decided.remember is None, "the first reading's time is kept"


def test_a_new_score_since_the_first_reading_starts_over() -> None:
    first = CellMemory(stall_reading=StallReading(run_tag=TAG, scored=90, at=NOW - timedelta(minutes=200)))

    decided = plan_cell(C, running(first), POLICY, NOW)

    assert kinds(decided) == ["wait"] and decided.remember is not None
    assert decided.remember.stall_reading is not None and decided.remember.stall_reading.scored == 100


def test_progress_ends_the_reading() -> None:
    first = CellMemory(stall_reading=StallReading(run_tag=TAG, scored=90, at=ago(minutes=100)), db_verified="row 1")

    decided = plan_cell(C, running(first, quiet_min=5), POLICY, NOW)

    assert decided.phase == Phase.RUNNING and decided.remember == CellMemory(db_verified="row 1")


def test_near_complete_and_zombie_cancels_are_remembered_as_upload_as_is() -> None:
    near = plan_cell(C, running(CellMemory(), scored=292, quiet_min=61), POLICY, NOW)

    assert kinds(near) == ["cancel"] and near.remember == CellMemory(upload_as_is=TAG)


def test_a_run_the_monitor_cancelled_is_uploaded_as_it_is_not_resumed() -> None:
    killed = facts(TAG, total=300, completed=292, scored=292, finished=False, last_progress=ago(hours=2))
    observed = obs(subs=(sub(C),), rows=(row("Started", job_name=TAG),),
                   jobs=(job(TAG, JobState.CANCELLED, started=ago(hours=5), ended=ago(hours=2)),), dirs=(killed,))

    without = plan_cell(C, observed, POLICY, NOW)
    remembered = plan_cell(C, observed.model_copy(update={"memory": CellMemory(upload_as_is=TAG)}), POLICY, NOW)

    partial = POLICY.model_copy(update={"admission": POLICY.admission.model_copy(update={"partial_upload": True})})
    published = plan_cell(C, observed.model_copy(update={"memory": CellMemory(upload_as_is=TAG)}), partial, NOW)

    assert kinds(without) == ["resume"]
    assert remembered.phase == Phase.FAILED and kinds(remembered) == ["hold"], "292 of 300 is no plain score"
    assert remembered.rule == Rule.ADMISSION_INCOMPLETE and "292 of 300 expected" in remembered.reason
    assert published.phase == Phase.EVALUATED and kinds(published) == ["analyze", "upload"]
    assert published.rule == Rule.MONITOR_CANCELLED and published.actions[1].admitted.partial


def test_trials_still_landing_after_the_cancel_are_waited_for_first() -> None:
    landing = facts(TAG, total=300, completed=293, scored=293, finished=False, last_progress=ago(minutes=2))
    observed = obs(subs=(sub(C),), rows=(row("Started", job_name=TAG),),
                   jobs=(job(TAG, JobState.CANCELLED, started=ago(hours=5), ended=ago(minutes=10)),),
                   dirs=(landing,)).model_copy(update={"memory": CellMemory(upload_as_is=TAG)})

    decided = plan_cell(C, observed, POLICY, NOW)

    assert decided.phase == Phase.SETTLING and kinds(decided) == ["wait"]


def test_a_run_the_monitor_cancelled_waits_a_settle_window_for_late_trials() -> None:
    just_killed = facts(TAG, total=300, completed=292, scored=292, finished=False, last_progress=ago(hours=2))
    observed = obs(subs=(sub(C),), rows=(row("Started", job_name=TAG),),
                   jobs=(job(TAG, JobState.CANCELLED, started=ago(hours=5), ended=ago(minutes=20)),),
                   dirs=(just_killed,)).model_copy(update={"memory": CellMemory(upload_as_is=TAG)})

    decided = plan_cell(C, observed, POLICY, NOW)

    assert decided.phase == Phase.SETTLING and kinds(decided) == ["wait"] and "upload after" in decided.reason
