"""Progress, not fake scores (issue 21): a running cell carries scored/total and an ETA from its own throughput,
and no score until one is uploaded."""

from __future__ import annotations

from datetime import timedelta

from controller.core.observed import JobState, RunDirFacts
from controller.core.planner import plan_cell
from controller.core.progress import Progress, eta_minutes, progress_of
from controller.core.vocabulary import Phase
from tests.core.builders import NOW, POLICY, SCORED, ago, cell, facts, job, obs, row, sub

C = cell()
TAG = C.run_tag(1)


def started(minutes: float, *, completed: int, total: int | None = 18, scored: int | None = None) -> RunDirFacts:
    return facts(TAG, total=total, completed=completed, scored=scored, finished=False,
                 last_progress=ago(minutes=1)).model_copy(update={"started_at": ago(minutes=minutes)})


def test_known_throughput_gives_the_remaining_trials_at_that_rate() -> None:
    # 6 trials in 12 min is 2 min a trial; 12 to go: 24 min
    assert eta_minutes(started(12, completed=6), NOW, 1) == 24
    # 5 in 4 min, 13 to go: 10.4 min, rounded up
    assert eta_minutes(started(4, completed=5), NOW, 1) == 11


def test_a_run_that_stops_sees_its_eta_grow_not_count_down() -> None:
    """The rate is over the time since the start, up to now: a stall slows it."""
    assert eta_minutes(started(60, completed=6), NOW, 1) == 120, "6 in an hour: 10 min a trial, 12 to go"


def test_no_eta_when_it_cannot_be_known() -> None:
    assert eta_minutes(started(30, completed=0), NOW, 1) is None, "zero progress: no throughput"
    assert eta_minutes(started(30, completed=5, total=None), NOW, 1) is None, "no expected total"
    assert eta_minutes(started(30, completed=18), NOW, 1) is None, "nothing left to run: when it exits is unknown"
    assert eta_minutes(started(30, completed=5).model_copy(update={"started_at": None}), NOW, 1) is None
    assert eta_minutes(started(-5, completed=5), NOW, 1) is None, "a start in the future (clock skew)"


def test_the_last_minute_is_one_minute_not_zero() -> None:
    assert eta_minutes(started(60, completed=17_999, total=18_000), NOW, 1) == 1


def test_an_eta_only_while_a_job_works_on_it() -> None:
    dir_ = started(12, completed=6, scored=5)
    assert progress_of(dir_, 1, NOW) == Progress(scored=5, total=18, eta_minutes=24)
    assert progress_of(dir_, 1, None) == Progress(scored=5, total=18, eta_minutes=None)
    assert progress_of(None, 1, NOW) is None
    assert progress_of(dir_.model_copy(update={"unreadable": "permission denied"}), 1, NOW) is None


def test_a_running_cell_has_progress_and_no_score() -> None:
    """Before the fix its score was the run dir's partial accuracy (0.000 with 5 of 18 scored, reward 0)."""
    dir_ = started(12, completed=6, scored=5)
    observed = obs(subs=(sub(C),), rows=(row("Started", job_name=TAG),),
                   jobs=(job(TAG, JobState.RUNNING, started=NOW - timedelta(minutes=12)),), dirs=(dir_,))

    decided = plan_cell(C, observed, POLICY, NOW)

    assert decided.phase == Phase.RUNNING, decided.reason
    assert decided.score is None
    assert decided.progress == Progress(scored=5, total=18, eta_minutes=24)


def test_the_eta_is_what_the_pass_decided_whatever_phase_the_plan_shows_later() -> None:
    """Progress is derived where it is shown, from what the pass decided: a sharded cell, whose phase is set from its
    shards after its own decision, neither gains an ETA nor loses one by it."""
    dir_ = started(12, completed=6, scored=5)
    running = plan_cell(C, obs(subs=(sub(C),), rows=(row("Started", job_name=TAG),),
                               jobs=(job(TAG, JobState.RUNNING, started=NOW - timedelta(minutes=12)),), dirs=(dir_,)),
                        POLICY, NOW)
    ended = plan_cell(C, obs(subs=(sub(C),), rows=(row("Started", job_name=TAG),), dirs=(dir_,)), POLICY, NOW)
    assert running.phase == Phase.RUNNING and ended.phase != Phase.RUNNING, ended.reason

    assert running.model_copy(update={"phase": Phase.PENDING}).progress == Progress(scored=5, total=18,
                                                                                     eta_minutes=24)
    assert ended.model_copy(update={"phase": Phase.RUNNING}).progress == Progress(scored=5, total=18,
                                                                                   eta_minutes=None)


def test_a_finished_cell_shows_the_uploaded_score_not_the_run_dirs() -> None:
    done = facts(TAG, total=18, completed=18)  # its run dir's accuracy is 0.5 × 18 / 18 = 0.5
    accuracy = SCORED[0].model_copy(update={"value": 0.25})
    uploaded = obs(subs=(sub(C),), rows=(row("Finished", job_name=TAG, metrics=(accuracy,)),), dirs=(done,))

    decided = plan_cell(C, uploaded, POLICY.model_copy(update={"track": False}), NOW)

    assert decided.phase == Phase.COMPLETED and decided.score == 0.25
    assert decided.progress is not None and decided.progress.eta_minutes is None


def test_a_task_s_re_runs_count_once_in_progress_and_the_eta() -> None:
    """12 results in 18 min, 6 of them re-runs of 3 one-attempt tasks: 6 trials done, 12 to go at 3 min each. Were
    the tasks of 3 attempts, the same results are 12 trials done, 6 to go at 1.5 min each."""
    tasks = {f"task-{i:03d}": (3, 3, 1.5) if i < 3 else (1, 1, 0.5) for i in range(6)}
    dir_ = started(18, completed=12).model_copy(update={"tasks": tasks, "n_scored": 12})
    assert progress_of(dir_, 1, NOW) == Progress(scored=6, total=18, eta_minutes=36)
    assert progress_of(dir_, 3, NOW) == Progress(scored=12, total=18, eta_minutes=9)
