"""RULES §2: should a cell be (re)started, judged from the newest matching row.

The table is data; `row_case` only decides which line of it a row falls on.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from enum import StrEnum
from typing import NamedTuple

from controller.core.observed import ObservedRow, RowStatus
from controller.core.vocabulary import Rule


class RowCase(StrEnum):
    NONE = "none"
    FINISHED = "finished with metrics"
    METRICS_CLEARED = "finished, metrics cleared"
    STARTED_FRESH = "started, young"
    STARTED_STALE = "started, stale"
    PENDING_FRESH = "pending, young"
    PENDING_STALE = "pending, stale"
    UNRECOGNISED = "unrecognised job_status"


class Dedup(NamedTuple):
    start: bool
    reason: str
    rule: Rule


# "cancel its SLURM job, then start" of a stale Pending row is Rule.QUEUED_STALE: only a job we see can be cancelled.
DEDUP_TABLE: dict[RowCase, Dedup] = {
    RowCase.NONE: Dedup(start=True, reason="no existing job", rule=Rule.NO_EXISTING_JOB),
    RowCase.FINISHED: Dedup(start=False, reason="job finished", rule=Rule.JOB_FINISHED),
    RowCase.METRICS_CLEARED: Dedup(start=True, reason="finished but metrics cleared", rule=Rule.METRICS_CLEARED),
    RowCase.STARTED_FRESH: Dedup(start=False, reason="job in progress", rule=Rule.STARTED_FRESH),
    RowCase.STARTED_STALE: Dedup(start=True, reason="stale started", rule=Rule.STARTED_STALE),
    RowCase.PENDING_FRESH: Dedup(start=False, reason="job pending", rule=Rule.PENDING_FRESH),
    RowCase.PENDING_STALE: Dedup(start=True, reason="stale pending", rule=Rule.PENDING_STALE),
    # Not in the old listener: a status we cannot read is not evidence that nothing runs.
    RowCase.UNRECOGNISED: Dedup(start=False, reason="unrecognised job_status; a human decides",
                                rule=Rule.UNRECOGNISED_STATUS),
}


def row_case(
    row: ObservedRow | None, *, stale_started: timedelta, stale_pending: timedelta, now: datetime
) -> RowCase:
    """Which line of the §2 table `row` falls on.

    Staleness of a Pending row is measured from `submitted_at` (the old listener used the always-null
    `started_at`, which made every Pending row stale); a Finished row is never stale.
    """
    if row is None:
        return RowCase.NONE
    if row.job_status == RowStatus.FINISHED:
        return RowCase.FINISHED if row.has_metrics else RowCase.METRICS_CLEARED
    if row.job_status == RowStatus.STARTED:
        fresh = row.started_at is not None and now - row.started_at < stale_started
        return RowCase.STARTED_FRESH if fresh else RowCase.STARTED_STALE
    if row.job_status == RowStatus.PENDING:
        fresh = row.submitted_at is not None and now - row.submitted_at < stale_pending
        return RowCase.PENDING_FRESH if fresh else RowCase.PENDING_STALE
    return RowCase.UNRECOGNISED


def newest(rows: tuple[ObservedRow, ...]) -> ObservedRow | None:
    """The row that decides: the newest by `created_at` (rows without one count as oldest)."""
    if len(rows) <= 1:
        return rows[0] if rows else None
    return max(rows, key=lambda r: (r.created_at is not None, r.created_at or datetime.min, r.id))
