"""RULES §13: a human's retry request releases a held cell once — one new attempt, fresh refire bounds, the
history kept — and nothing else: a consumed request releases no later hold, a cell that is not held goes on."""

from __future__ import annotations

from datetime import timedelta

from controller.core.actions import Hold, Submit
from controller.core.observed import JobState, Observation, RunDirFacts
from controller.core.planner import plan, plan_cell
from controller.core.remedies import CellMemory, Remedy, RemedyCause, RemedyKind
from controller.core.retry import RetryRequest
from controller.core.vocabulary import Phase, Rule
from tests.core.builders import NOW, POLICY, RUN, ago, cell, facts, job, obs, row, spec_policy, sub

C = cell()


def request(*, consumed_attempt: int | None = None) -> RetryRequest:
    consumed = {} if consumed_attempt is None else {
        "consumed_by": f"{C.run_tag(consumed_attempt)}_f1", "consumed_attempt": consumed_attempt,
        "consumed_at": ago(minutes=50)}
    return RetryRequest(id="r1", cell_key=C.key, evalrun=RUN, requested_by="alice", requested_at=ago(hours=1),
                        reason="job script path fixed", **consumed)


def early_kill(attempt: int) -> RunDirFacts:
    return facts(C.run_tag(attempt), total=None, completed=0, has_result=False, trial_dirs=0, finished=False)


def failed_at_start(attempt: int, *retries: RetryRequest, memory: CellMemory | None = None) -> Observation:
    """Attempts 1..attempt each failed before any trial ran (the job script was not there)."""
    tags = [C.run_tag(a) for a in range(1, attempt + 1)]
    return obs(subs=tuple(sub(C, a, job_id=str(100 + a), row_id=f"row-{a}") for a in range(1, attempt + 1)),
               rows=tuple(row("Pending", job_name=t, row_id=f"row-{a}", created=ago(hours=10 - a))
                          for a, t in enumerate(tags, 1)),
               jobs=tuple(job(t, JobState.FAILED, job_id=str(100 + a), ended=ago(minutes=30),
                              reason="exit 127: /work/run.sh: not found") for a, t in enumerate(tags, 1)),
               dirs=tuple(early_kill(a) for a in range(1, attempt + 1))).model_copy(
        update={"retries": retries, "memory": memory or CellMemory()})


def test_a_held_cell_stays_held_without_a_request():
    decided = plan_cell(C, failed_at_start(1), POLICY, NOW)

    assert decided.held and decided.rule == Rule.JOB_FAILED_AT_START and decided.retry is None


def test_a_pending_request_releases_the_hold_as_one_new_attempt():
    decided = plan_cell(C, failed_at_start(1, request()), POLICY, NOW)

    assert (decided.phase, decided.rule, decided.held) == (Phase.PENDING, Rule.RETRY, False)
    [submit] = decided.actions
    assert isinstance(submit, Submit) and (submit.attempt, submit.run_tag, submit.row_id) == (2, C.run_tag(2), None)
    assert "retry requested by alice" in submit.reason and "job script path fixed" in submit.reason
    assert "was held: job 101 failed before any trial ran" in decided.reason
    assert decided.retry == request()


def test_the_release_goes_through_the_allocation_like_any_launch():
    """`suspend` turns it into a hold like every other launch: the request waits, nothing is lost."""
    [suspended] = plan(RUN, [C], [failed_at_start(1, request())], spec_policy(suspend=True), NOW).cells

    assert not any(isinstance(a, Submit) for a in suspended.actions)
    assert any(isinstance(a, Hold) and "suspended; would submit" in a.reason for a in suspended.actions)


def test_a_consumed_request_releases_no_later_hold():
    """Attempt 2 (the retry) failed at start too: the request was spent on it; a human decides again."""
    decided = plan_cell(C, failed_at_start(2, request(consumed_attempt=2)), POLICY, NOW)

    assert decided.held and decided.rule == Rule.JOB_FAILED_AT_START and "job 102" in decided.reason
    assert decided.retry is None


def test_refires_count_afresh_from_the_retried_attempt():
    """Refires of attempts 1 and 2 used the cell's two; attempt 3 was a retry, its dead launch is refired."""
    used = tuple(Remedy(run_tag=C.run_tag(a), kind=RemedyKind.REFIRE, diagnosis="dead launch", at=ago(hours=5 - a),
                        cause=RemedyCause.DEAD_LAUNCH) for a in (1, 2))
    dead = Remedy(run_tag=C.run_tag(3), kind=RemedyKind.REFIRE, diagnosis="dead launch", at=ago(minutes=20),
                  cause=RemedyCause.DEAD_LAUNCH)
    observed = failed_at_start(3, memory=CellMemory(remedies=(*used, dead)))

    before = plan_cell(C, observed, POLICY, NOW)
    after = plan_cell(C, observed.model_copy(update={"retries": (request(consumed_attempt=3),)}), POLICY, NOW)

    assert before.held and before.rule == Rule.REFIRES_EXHAUSTED and "2 refire(s) used" in before.reason
    assert after.rule == Rule.REFIRE and not after.held
    [submit] = after.actions
    assert isinstance(submit, Submit) and submit.attempt == 4 and "refire 1 of 2" in submit.reason


def test_the_attempt_after_a_refire_hold_is_new_and_the_history_is_kept():
    used = tuple(Remedy(run_tag=C.run_tag(a), kind=RemedyKind.REFIRE, diagnosis="dead launch", at=ago(hours=5 - a),
                        cause=RemedyCause.DEAD_LAUNCH) for a in (1, 2, 3))
    decided = plan_cell(C, failed_at_start(3, request(), memory=CellMemory(remedies=used)), POLICY, NOW)

    assert decided.rule == Rule.RETRY and [a.attempt for a in decided.actions if isinstance(a, Submit)] == [4]
    assert decided.remember is None or decided.remember.remedies[:3] == used, "old remedies stay remembered"


def test_a_failed_job_whose_run_dir_was_not_seen_is_released_past_every_attempt_recorded():
    """A job script that never ran leaves no jobs dir at all: the hold names the failed job, and the retry's
    attempt is the one after every submission and row of the cell (intents come before jobs, RULES §12)."""
    unseen = failed_at_start(3, request()).model_copy(update={"run_dirs": None, "unknown_reason": "no jobs dir"})
    held = plan_cell(C, unseen.model_copy(update={"retries": ()}), POLICY, NOW)
    decided = plan_cell(C, unseen, POLICY, NOW)

    assert held.held and held.rule == Rule.JOB_FAILED_DIR_UNSEEN
    assert decided.rule == Rule.RETRY and [a.attempt for a in decided.actions if isinstance(a, Submit)] == [4]


def test_a_request_for_a_running_cell_changes_nothing_but_is_shown():
    live = job(C.run_tag(1), JobState.RUNNING, started=ago(minutes=20))
    observed = obs(subs=(sub(C),), rows=(row("Started", job_name=C.run_tag(1)),), jobs=(live,),
                   dirs=(facts(C.run_tag(1), total=60, finished=False, last_progress=NOW - timedelta(minutes=1)),))
    without = plan_cell(C, observed, POLICY, NOW)
    with_request = plan_cell(C, observed.model_copy(update={"retries": (request(),)}), POLICY, NOW)

    assert with_request.actions == without.actions and with_request.rule == without.rule == Rule.IN_FLIGHT
    assert with_request.retry == request()


def test_a_retry_interrupted_before_sbatch_is_finished_while_the_run_dirs_are_unseen():
    """Killed after the retry's intent (the request consumed with it), before its job: no jobs dir exists yet, but
    the same submission is finished, never held again (the request is spent) nor made a third attempt."""
    intent = sub(C, 2, job_id=None, row_id="row-2", created=ago(minutes=5))
    observed = failed_at_start(1, request(consumed_attempt=2)).model_copy(update={
        "run_dirs": None, "unknown_reason": "no jobs dir", "submissions": (sub(C, 1, job_id="101"), intent)})

    decided = plan_cell(C, observed, POLICY, NOW)

    assert (decided.rule, decided.phase) == (Rule.SUBMISSION_REPAIR, Phase.PENDING)
    [submit] = decided.actions
    assert isinstance(submit, Submit)
    assert (submit.run_tag, submit.attempt, submit.row_id, submit.intent_at) == (C.run_tag(2), 2, "row-2",
                                                                                intent.created_at)
