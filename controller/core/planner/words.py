"""How the rules say things: progress, durations, a job's failure; and which `Rule` names a cause."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from controller.core.admission import Refusal
from controller.core.health import diagnose, no_output_summary
from controller.core.observed import JobState, ObservedJob, ObservedRow, RunDirFacts
from controller.core.planner.policy import Policy
from controller.core.remedies import FailureStage, RemedyCause
from controller.core.vocabulary import Rule

ADMISSION_RULES: dict[Refusal, Rule] = {
    Refusal.IDENTITY: Rule.ADMISSION_IDENTITY, Refusal.INVALID_REWARD: Rule.ADMISSION_INVALID_REWARD,
    Refusal.NO_TRAFFIC: Rule.ADMISSION_NO_TRAFFIC, Refusal.NO_TOTAL: Rule.ADMISSION_NO_TOTAL,
    Refusal.INCOMPLETE: Rule.ADMISSION_INCOMPLETE, Refusal.INFRA_SHARE: Rule.ADMISSION_INFRA_SHARE,
    Refusal.NOTHING_SCORED: Rule.ADMISSION_NOTHING_SCORED,
}

DIAGNOSED_BY: dict[RemedyCause, Rule] = {
    RemedyCause.DEAD_LAUNCH: Rule.DEAD_LAUNCH, RemedyCause.LAUNCH_STALLED: Rule.LAUNCH_STALLED,
    RemedyCause.PINGGY_NOT_WIRED: Rule.PINGGY_NOT_WIRED, RemedyCause.PINGGY_LOCKED: Rule.PINGGY_LOCKED,
    RemedyCause.KNOWN_FAILURE: Rule.KNOWN_FAILURE,
}


def progress(facts: RunDirFacts | None) -> str:
    if facts is None:
        return "no run dir yet"
    if facts.unreadable:
        return f"run dir cannot be read: {facts.unreadable}"
    total = facts.n_total
    return f"{facts.n_scored} scored, {facts.n_completed}/{'?' if total is None else total} completed, " \
           f"{facts.n_infra_errors} infra errors"


def metric(row: ObservedRow, name: str) -> float | None:
    """The first metric of that name: what every reader shows of a row naming one twice (`repeated_names`)."""
    for m in row.metrics or ():
        if m.name == name:
            return m.value
    return None


def job_order(job_id: str) -> int:
    return int(job_id) if job_id.isdigit() else -1


def newest_job(jobs: Sequence[ObservedJob] | None) -> ObservedJob | None:
    """The newest by job id (numeric ids in order; others first)."""
    if not jobs:
        return None
    if len(jobs) == 1:
        return jobs[0]
    return max(jobs, key=lambda j: (job_order(j.job_id), j.job_id))


def failed_job(jobs: Sequence[ObservedJob] | None) -> ObservedJob | None:
    """The newest job, if it ended FAILED or OUT_OF_MEMORY and nothing of the cell is queued or running."""
    newest = newest_job(jobs)
    if newest is None or any(j.state.active for j in jobs or ()):
        return None
    return newest if newest.state in (JobState.FAILED, JobState.OUT_OF_MEMORY) else None


def failure(job: ObservedJob, policy: Policy) -> str:
    what = "ran out of memory" if job.state == JobState.OUT_OF_MEMORY else "failed"
    found = diagnose(job.log_tail or job.reason, policy.health.failure_modes, FailureStage.START)
    return what + (f": {found}" if found else f": {job.reason}" if job.reason else "")


def dead_launch(facts: RunDirFacts) -> str:
    return (f"dead launch: {no_output_summary(facts)}, 0 real trials — served model unreachable? "
            "(check the vLLM server and the api_base the trials call)")


def last_job_note(jobs: Sequence[ObservedJob] | None) -> str:
    """What the scheduler said of the newest job, when it was read: often the cause (a failed start)."""
    job = newest_job(jobs)
    if job is None:
        return ""
    return f"; last job {job.job_id} {job.state.value}" + (f": {job.reason}" if job.reason else "")


def minutes(delta: timedelta) -> str:
    return f"{delta.total_seconds() / 60:.0f} min"


def flagged(overlong: str | None) -> str:
    """What a reason adds for an overlong run that is uploaded: the flag is never silent."""
    return "" if overlong is None else f"; flagged is_overlong: {overlong}"


def when(moment: datetime | None) -> str:
    return f"{moment:%Y-%m-%d %H:%M}" if moment is not None else "an unknown time"
