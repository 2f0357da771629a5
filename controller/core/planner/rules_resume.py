"""RULES §4 and §12: a run dir with no job queued or running. An interrupted submission is finished first (the
same one, never a new one); then the dir is classified, and `DIR_RULES`, read top to bottom, decide: a remedy, a
failed start, a dir still settling, a resume, or the upload gate (`rules_upload`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from controller.core.actions import Hold, Launch, Resume, Submit, Wait
from controller.core.observed import JobState, ObservedJob, ObservedRow, RunDirFacts, Submission
from controller.core.planner.rules_remedy import remediate, remedy_for
from controller.core.planner.rules_upload import upload
from controller.core.planner.view import CellView
from controller.core.planner.words import progress
from controller.core.remedies import Remedy
from controller.core.resume import RESUME_TABLE, DirClass, Next, Verdict
from controller.core.vocabulary import CellPlan, Phase, Rule


@dataclass(slots=True)
class DirCase:
    """A run dir as the §4 rules read it: its last job, its class and that class's verdict, a remedy if any."""

    view: CellView
    facts: RunDirFacts
    row_id: str | None
    why: str
    job: ObservedJob | None
    cls: DirClass
    verdict: Verdict
    remedy: Remedy | None


def remedied(case: DirCase) -> CellPlan | None:
    """A remedy decided when it was cancelled, a catalogued start failure, a dead launch (RULES §9)."""
    return None if case.remedy is None else remediate(case.view, case.facts, case.job, case.remedy)


def failed_at_start(case: DirCase) -> CellPlan | None:
    """Its job failed before any trial ran (RULES §13): a human looks."""
    job = case.job
    if job is None or job.state not in (JobState.FAILED, JobState.OUT_OF_MEMORY) or case.cls != DirClass.EARLY_KILL:
        return None
    what = "ran out of memory" if job.state == JobState.OUT_OF_MEMORY else "failed before any trial ran"
    reason = f"job {job.job_id} {what}" + (f": {job.reason}" if job.reason else "")
    return case.view.result(Phase.FAILED, [Hold(reason=reason)], reason, Rule.JOB_FAILED_AT_START, facts=case.facts)


def settling(case: DirCase) -> CellPlan | None:
    if case.verdict.next != Next.WAIT:
        return None
    reason = f"{case.verdict.reason} ({progress(case.facts)})"
    return case.view.result(Phase.SETTLING, [Wait(reason=reason)], reason, case.verdict.rule, facts=case.facts)


def settling_after_cancel(case: DirCase) -> CellPlan | None:
    """A dir the monitor cancelled: its sandboxes may still write for `settle`."""
    view, job, facts = case.view, case.job, case.facts
    cancelled_at = job.ended_at if job is not None and view.memory.upload_as_is == facts.run_tag else None
    if cancelled_at is None or view.now - cancelled_at >= view.policy.settle:
        return None
    reason = f"cancelled at {cancelled_at:%H:%M:%S}; its sandboxes may write until " \
             f"{cancelled_at + view.policy.settle:%H:%M:%S} ({progress(facts)}): upload after that"
    return view.result(Phase.SETTLING, [Wait(reason=reason)], reason, Rule.SETTLE_AFTER_CANCEL, facts=facts)


def monitor_cancelled(case: DirCase) -> CellPlan | None:
    """A dir the monitor cancelled to upload as it is: never resumed."""
    if case.verdict.next != Next.RESUME or case.view.memory.upload_as_is != case.facts.run_tag:
        return None
    return upload(case.view, case.facts, case.row_id, case.cls, Rule.MONITOR_CANCELLED)


def resume(case: DirCase) -> CellPlan | None:
    if case.verdict.next != Next.RESUME:
        return None
    view, facts, verdict = case.view, case.facts, case.verdict
    fires = view.fires(facts)
    reason = f"{case.why}; {case.cls}: {verdict.reason} ({progress(facts)}) → resume, fire {fires + 1} of " \
             f"{view.policy.max_total_fires}"
    action = Resume(reason=reason, run_tag=facts.run_tag, attempt=view.attempt_of(facts.run_tag),
                    fire=fires + 1, row_id=case.row_id)
    return view.result(Phase.PENDING, [action], reason, verdict.rule, facts=facts)


DIR_RULES: tuple[Callable[[DirCase], CellPlan | None], ...] = (
    remedied,               # a remedied attempt                      → hold, or refire after the back-off
    failed_at_start,        # FAILED / OOM before any trial           → hold
    settling,               # trials may still write                  → wait
    settling_after_cancel,  # cancelled by the monitor, settle window → wait
    monitor_cancelled,      # cancelled by the monitor                → upload as is
    resume,                 # trials left, fires left                 → resume
)


def from_dir(view: CellView, facts: RunDirFacts, row: ObservedRow | None, why: str) -> CellPlan:
    """The first of `DIR_RULES` that decides; past them all the dir goes through the upload gate."""
    job = view.last_job(facts.run_tag)
    cls = view.classify(facts, job)
    case = DirCase(view=view, facts=facts, row_id=row.id if row is not None else None, why=why, job=job, cls=cls,
                   verdict=RESUME_TABLE[cls], remedy=remedy_for(view, facts, job, cls))
    for rule in DIR_RULES:
        decided = rule(case)
        if decided is not None:
            return decided
    return upload(view, facts, case.row_id, cls, case.verdict.rule)


def finish_interrupted(view: CellView, last: Submission, row: ObservedRow | None) -> CellPlan | None:
    """An intent with no job id and no job of its name: the process stopped before sbatch. Finish that same
    submission (steps 2–3), writing its row if the crash came before it (RULES §12)."""
    if last.job_id is not None or any(last.may_have_launched(j) for j in view.jobs_named(last.name)):
        return None
    action = repair(last, row.id if row is not None else last.row_id)
    return view.result(Phase.PENDING, [action], INTERRUPTED, Rule.SUBMISSION_REPAIR)


INTERRUPTED = "submission interrupted before sbatch"


def repair(last: Submission, row_id: str | None) -> Launch:
    """The same submission again, under its name and intent time: the protocol's find step adopts its job if one
    started after all."""
    reason = f"intent {last.name} recorded but no job has that name: finish the submission"
    return (Submit(run_tag=last.run_tag, attempt=last.attempt, row_id=row_id, intent_at=last.created_at,
                   reason=reason) if last.fire == 1 else
            Resume(run_tag=last.run_tag, attempt=last.attempt, fire=last.fire, row_id=row_id,
                   intent_at=last.created_at, reason=reason))


def own_row_without_live_job(view: CellView, row: ObservedRow) -> CellPlan:
    """Our Pending/Started row and nothing of ours in the queue: the job ended, died or never started."""
    tag = row.job_name or ""
    last = next((s for s in reversed(view.subs) if s.run_tag == tag), None)
    if last is not None and (repair := finish_interrupted(view, last, row=row)) is not None:
        return repair
    facts = view.dirs.get(tag) or RunDirFacts(run_tag=tag, path="")
    return from_dir(view, facts, row=row, why=f"our {row.job_status} row, no job queued or running")
