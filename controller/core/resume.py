"""RULES §4: resume classification of a run dir, evaluated in the documented order.

One deliberate addition: "trials still landing after the job ended" is tested right after
IN_FLIGHT, not last. A killed job's sandboxes keep writing for up to an hour, and a dir that is
still changing must not be resumed, uploaded or given up on until it is quiet (RULES §3: users wait
~60 min before inspecting such a dir).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from enum import StrEnum
from typing import NamedTuple

from controller.core.observed import RunDirFacts
from controller.core.vocabulary import Rule


class DirClass(StrEnum):
    IN_FLIGHT = "IN_FLIGHT"
    SETTLING = "SETTLING"
    REJECTED = "REJECTED"
    AT_RESUME_LIMIT = "AT_RESUME_LIMIT"
    EARLY_KILL = "EARLY_KILL"
    INCOMPLETE = "INCOMPLETE"
    PARTIAL = "PARTIAL"
    PARTIAL_OK = "PARTIAL_OK"
    DONE_WITH_ERRORS = "DONE_WITH_ERRORS"
    DONE = "DONE"


class Next(StrEnum):
    WAIT = "wait"
    RESUME = "resume"
    UPLOAD = "upload"
    UPLOAD_AS_IS = "upload as is"


class Verdict(NamedTuple):
    next: Next
    reason: str
    rule: Rule


RESUME_TABLE: dict[DirClass, Verdict] = {
    DirClass.IN_FLIGHT: Verdict(Next.WAIT, "its job is queued or running", Rule.IN_FLIGHT),
    DirClass.SETTLING: Verdict(Next.WAIT, "trials still landing; waiting for the dir to settle", Rule.DIR_SETTLING),
    DirClass.REJECTED: Verdict(Next.UPLOAD_AS_IS, ".no-resume marker present", Rule.DIR_REJECTED),
    DirClass.AT_RESUME_LIMIT: Verdict(Next.UPLOAD_AS_IS, "at resume limit", Rule.DIR_AT_RESUME_LIMIT),
    DirClass.EARLY_KILL: Verdict(Next.RESUME, "killed before any trial ran", Rule.DIR_EARLY_KILL),
    DirClass.INCOMPLETE: Verdict(Next.RESUME, "incomplete and not finished", Rule.DIR_INCOMPLETE),
    DirClass.PARTIAL: Verdict(Next.RESUME, "finished partial with too many infra errors", Rule.DIR_PARTIAL),
    DirClass.PARTIAL_OK: Verdict(Next.UPLOAD, "finished partial, infra errors within threshold", Rule.DIR_PARTIAL_OK),
    DirClass.DONE_WITH_ERRORS: Verdict(Next.RESUME, "done but too many infra errors", Rule.DIR_DONE_WITH_ERRORS),
    DirClass.DONE: Verdict(Next.UPLOAD, "done", Rule.DIR_DONE),
}


def classify(
    facts: RunDirFacts,
    *,
    expected: int | None,
    seen: int,
    job_active: bool,
    job_ended_at: datetime | None,
    fires: int,
    max_total_fires: int,
    infra_error_threshold: int,
    settle: timedelta,
    now: datetime,
) -> DirClass:
    """Which line of the §4 table the dir falls on; `fires` counts the jobs that ran on the dir. `expected`: the
    trials the run must have (RULES §14: the catalog's, else Harbor's total; None: unknown); `seen`: its distinct
    (task, attempt) pairs with a result, so a re-run trial or a leftover of an earlier fire counts once."""
    if job_active:
        return DirClass.IN_FLIGHT
    if _still_landing(facts, job_ended_at, settle, now):
        return DirClass.SETTLING
    if facts.no_resume:
        return DirClass.REJECTED
    if fires >= max_total_fires and not (expected is not None and seen >= expected):
        return DirClass.AT_RESUME_LIMIT
    if not facts.has_result and facts.n_trial_dirs == 0:
        return DirClass.EARLY_KILL
    too_many_infra = facts.n_infra_errors > infra_error_threshold
    if expected is None or seen < expected:
        if facts.finished_at is None:
            return DirClass.INCOMPLETE
        return DirClass.PARTIAL if too_many_infra else DirClass.PARTIAL_OK
    if too_many_infra:
        return DirClass.AT_RESUME_LIMIT if fires >= max_total_fires else DirClass.DONE_WITH_ERRORS
    return DirClass.DONE


# SLURM reports end times in whole seconds and file times come from the file server's clock: a trial written
# in the job's last second must not read as "written after the job ended" (that would wait a whole settle).
END_TIME_RESOLUTION = timedelta(seconds=5)


def _still_landing(facts: RunDirFacts, job_ended_at: datetime | None, settle: timedelta, now: datetime) -> bool:
    if facts.last_progress_at is None or now - facts.last_progress_at >= settle:
        return False
    if job_ended_at is not None:
        return facts.last_progress_at > job_ended_at + END_TIME_RESOLUTION
    # No job we can see: a recently written, unfinished dir may belong to a job we cannot observe.
    return facts.finished_at is None
