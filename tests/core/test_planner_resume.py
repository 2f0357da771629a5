"""RULES §4, one test row per class: our row, our job ended, and what its run dir says."""

from __future__ import annotations

from datetime import timedelta

import pytest

from controller.core.observed import JobState
from controller.core.planner import plan_cell
from controller.core.types import submission_name
from controller.core.vocabulary import Phase
from tests.core.builders import NOW, POLICY, ago, cell, facts, job, obs, row, sub

C = cell()
TAG = C.run_tag(1)


def ours_after(job_state: JobState, the_facts, *, fires_launched: int = 1, ended=None):
    """Our Started row, `fires_launched` jobs launched on TAG, the last one ended in `job_state`."""
    subs = tuple(sub(C, fire=f, job_id=str(100 + f)) for f in range(1, fires_launched + 1))
    last = job(submission_name(TAG, fires_launched), job_state, job_id=str(100 + fires_launched),
               started=ago(hours=3), ended=ended or ago(hours=2))
    return obs(rows=(row("Started", job_name=TAG, started=ago(hours=3)),), subs=subs, jobs=(last,),
               dirs=(the_facts,) if the_facts else ())


RESUME_ROWS = [
    # name, job state, facts, fires launched, phase, action kinds, reason fragment
    ("SETTLING: trials landing after the job ended", JobState.CANCELLED,
     facts(TAG, completed=7, finished=False, last_progress=ago(minutes=5)), 1, Phase.SETTLING, ["wait"], "landing"),
    ("DONE: more results than Harbor's total (leftovers of an earlier fire) decide, never settle for ever",
     JobState.TIMEOUT, facts(TAG, completed=12, total=10), 1, Phase.EVALUATED, ["analyze", "upload"], "12/10"),
    ("REJECTED and incomplete: held, never a plain score", JobState.TIMEOUT,
     facts(TAG, completed=6, finished=False, no_resume=True), 1, Phase.FAILED, ["hold"], "6 of 10 expected"),
    ("AT_RESUME_LIMIT and incomplete: held", JobState.TIMEOUT, facts(TAG, completed=6, finished=False, fires=2), 2,
     Phase.FAILED, ["hold"], "resumes cannot complete it"),
    ("AT_RESUME_LIMIT far short", JobState.TIMEOUT, facts(TAG, completed=2, finished=False, fires=2),
     2, Phase.FAILED, ["hold"], "2 of 10 expected"),
    ("EARLY_KILL: no result.json, no trials", JobState.NODE_FAIL,
     facts(TAG, completed=0, total=None, finished=False, has_result=False, trial_dirs=0), 1, Phase.PENDING,
     ["resume"], "EARLY_KILL"),
    ("EARLY_KILL: no dir at all", JobState.PREEMPTED, None, 1, Phase.PENDING, ["resume"], "EARLY_KILL"),
    ("INCOMPLETE", JobState.TIMEOUT, facts(TAG, completed=5, finished=False), 1, Phase.PENDING, ["resume"],
     "INCOMPLETE"),
    ("PARTIAL: finished, infra > threshold", JobState.COMPLETED, facts(TAG, completed=5, infra=11, total=20), 1,
     Phase.PENDING, ["resume"], "PARTIAL"),
    ("PARTIAL_OK: finished short of its total: the admission gate resumes it", JobState.COMPLETED,
     facts(TAG, completed=6, infra=2), 1, Phase.PENDING, ["resume"], "6 of 10 expected"),
    ("DONE_WITH_ERRORS", JobState.COMPLETED, facts(TAG, completed=20, total=20, infra=11), 1, Phase.PENDING,
     ["resume"], "DONE_WITH_ERRORS"),
    ("DONE: infra == threshold, but half the trials: the infra share resumes it", JobState.COMPLETED,
     facts(TAG, completed=20, total=20, infra=10), 1, Phase.PENDING, ["resume"], "InfraShare"),
    ("DONE: 2 infra of 20 (10%) is within maxInfraErrorFraction", JobState.COMPLETED,
     facts(TAG, completed=20, total=20, infra=2), 1, Phase.EVALUATED, ["analyze", "upload"], "done"),
    ("DONE", JobState.COMPLETED, facts(TAG, completed=10), 1, Phase.EVALUATED, ["analyze", "upload"], "done"),
    ("DONE_WITH_ERRORS at the limit: held with its infra share", JobState.COMPLETED,
     facts(TAG, completed=20, total=20, infra=11, fires=2), 2, Phase.FAILED, ["hold"], "11 of 20 trials are infra"),
]


@pytest.mark.parametrize(("name", "state", "the_facts", "fires", "phase", "kinds", "reason"), RESUME_ROWS,
                         ids=[r[0] for r in RESUME_ROWS])
def test_resume_table_row(name, state, the_facts, fires, phase, kinds, reason):
    decided = plan_cell(C, ours_after(state, the_facts, fires_launched=fires), POLICY, NOW)
    assert decided.phase == phase, decided.reason
    assert [a.kind.value for a in decided.actions] == kinds
    assert reason.lower() in (decided.reason + " ".join(a.reason for a in decided.actions)).lower()


def test_in_flight_waits():
    live = job(TAG, JobState.RUNNING, started=ago(minutes=10))
    decided = plan_cell(C, obs(rows=(row("Started", job_name=TAG),), subs=(sub(C),), jobs=(live,),
                               dirs=(facts(TAG, completed=3, finished=False, last_progress=ago(minutes=1)),)),
                        POLICY, NOW)
    assert decided.phase == Phase.RUNNING and [a.kind.value for a in decided.actions] == ["wait"]


def test_resume_reuses_run_tag_and_counts_the_fire():
    decided = plan_cell(C, ours_after(JobState.TIMEOUT, facts(TAG, completed=5, finished=False)), POLICY, NOW)
    [resume] = decided.actions
    assert (resume.run_tag, resume.fire, resume.row_id) == (TAG, 2, "row-1")
    assert submission_name(resume.run_tag, resume.fire) == f"{TAG}-r1"


def test_legacy_meta_env_fires_count_towards_the_limit():
    """A dir whose meta.env says it was resumed once already is at the limit, even if we launched nothing."""
    decided = plan_cell(C, ours_after(JobState.TIMEOUT, facts(TAG, completed=6, finished=False, fires=2)),
                        POLICY, NOW)
    assert [a.kind.value for a in decided.actions] == ["hold"] and "resumes cannot complete it" in decided.reason


def test_upload_partial_publishes_what_resumes_cannot_complete_flagged_partial():
    partial = POLICY.model_copy(update={"admission": POLICY.admission.model_copy(update={"partial_upload": True})})
    decided = plan_cell(C, ours_after(JobState.TIMEOUT, facts(TAG, completed=6, finished=False, fires=2), fires_launched=2),
                        partial, NOW)
    assert [a.kind.value for a in decided.actions] == ["analyze", "upload"]
    upload = decided.actions[1]
    assert upload.admitted.partial and "6 of 10 expected" in upload.admitted.partial_why
    assert "partial: 6 of 10" in decided.reason


def test_a_partial_upload_still_needs_min_completed_fraction():
    partial = POLICY.model_copy(update={"admission": POLICY.admission.model_copy(update={"partial_upload": True})})
    decided = plan_cell(C, ours_after(JobState.TIMEOUT, facts(TAG, completed=2, finished=False, fires=2), fires_launched=2),
                        partial, NOW)
    assert [a.kind.value for a in decided.actions] == ["hold"] and "minCompletedFraction 0.5" in decided.reason


def test_finished_row_of_a_dir_uploaded_as_is_stays_failed():
    from tests.core.builders import SCORED

    finished = row("Finished", metrics=SCORED, job_name=TAG)
    decided = plan_cell(C, obs(rows=(finished,), subs=(sub(C), sub(C, fire=2)),
                               dirs=(facts(TAG, completed=6, finished=False, fires=2),)), POLICY, NOW)
    assert decided.phase == Phase.FAILED and [a.kind.value for a in decided.actions] == ["hold"]
    assert "uploaded as is" in decided.reason


def test_failed_at_start_holds_with_the_log_tail():
    decided = plan_cell(C, obs(rows=(row("Pending", job_name=TAG, submitted=ago(minutes=30)),), subs=(sub(C),),
                               jobs=(job(TAG, JobState.FAILED, reason="ModuleNotFoundError: harbor"),)),
                        POLICY, NOW)
    assert decided.phase == Phase.FAILED and [a.kind.value for a in decided.actions] == ["hold"]
    assert "ModuleNotFoundError: harbor" in decided.reason


def test_out_of_memory_holds_with_a_clear_reason_instead_of_resuming():
    decided = plan_cell(C, obs(rows=(row("Started", job_name=TAG, started=ago(minutes=30)),), subs=(sub(C),),
                               jobs=(job(TAG, JobState.OUT_OF_MEMORY, reason="oom-kill event"),)), POLICY, NOW)
    assert decided.phase == Phase.FAILED and [a.kind.value for a in decided.actions] == ["hold"]
    assert "ran out of memory" in decided.reason and "oom-kill event" in decided.reason


def test_orphan_done_dir_is_uploaded_without_a_row():
    legacy = facts("old-listener-tag", completed=10, model=C.model, benchmark_name=C.benchmark_name)
    decided = plan_cell(C, obs(dirs=(legacy,)), POLICY, NOW)
    assert [a.kind.value for a in decided.actions] == ["analyze", "upload"]
    assert decided.actions[1].row_id is None and decided.actions[1].facts.run_tag == "old-listener-tag"


def test_orphan_incomplete_dir_is_resumed_not_restarted():
    legacy = facts("old-listener-tag", completed=4, finished=False, model=C.model,
                   benchmark_name=C.benchmark_name)
    [resume] = plan_cell(C, obs(dirs=(legacy,)), POLICY, NOW).actions
    assert (resume.kind.value, resume.run_tag, resume.fire) == ("resume", "old-listener-tag", 2)


def test_a_dir_another_users_row_points_at_is_not_an_orphan():
    theirs = row("Started", user="bob", job_name="bobs-tag", started=ago(hours=1))
    dir_of_theirs = facts("bobs-tag", completed=4, finished=False)
    decided = plan_cell(C, obs(rows=(theirs,), dirs=(dir_of_theirs,)), POLICY, NOW)
    assert [a.kind.value for a in decided.actions] == ["skip"] and "job in progress" in decided.reason


@pytest.mark.parametrize(("written_after_end_s", "phase"), [(0.9, Phase.EVALUATED), (4, Phase.EVALUATED),
                                                           (30, Phase.SETTLING)])
def test_a_trial_written_in_the_jobs_last_second_is_not_landing_after_the_end(written_after_end_s, phase):
    """SLURM end times are whole seconds and file times come from another clock: seconds are not landing."""
    ended = ago(minutes=2)
    the_facts = facts(TAG, last_progress=ended + timedelta(seconds=written_after_end_s))
    assert plan_cell(C, ours_after(JobState.COMPLETED, the_facts, ended=ended), POLICY, NOW).phase == phase
