"""How far a cell's run is, and when it will be done: what `status` shows in place of a score. Pure.

The ETA comes from the cell's own trial throughput, nothing else: trials completed (a result.json) over the time
since its run dir started, so a run that stalls sees its rate fall and its ETA grow rather than count down to a
false "1 min". It assumes the remaining trials go as fast as the finished ones (the same tasks, the same
n_concurrent). Over a resumed dir the time between fires counts too, so the ETA errs long, never short. No ETA
when it cannot be known: nothing completed yet, no expected total, no start time, or nothing left to run (a job
whose trials are all done but that has not exited says nothing about when it will).
"""

from __future__ import annotations

import math
from datetime import datetime

from pydantic import Field

from controller.core.admission import distinct_trials, trial_pairs
from controller.core.observed import RunDirFacts
from controller.core.trusted import every_field, trusted
from controller.core.types import Frozen


class Progress(Frozen):
    scored: int = Field(description="(task, attempt) pairs measured: a trial with a reward that is the model's, "
                                     "a task's re-runs counted once")
    total: int | None = Field(description="trials expected; None when nothing says")
    eta_minutes: int | None = Field(None, description="minutes until every trial is done, rounded up; None: unknown")


_PROGRESS_FIELDS = every_field(Progress)


def eta_minutes(facts: RunDirFacts, now: datetime, n_attempts: int) -> int | None:
    """Remaining trials at the rate completed trials came in since the run started, in whole minutes (≥ 1). A task's
    re-runs beyond nAttempts count once: they leave no fewer trials to run."""
    return _eta(facts, now, distinct_trials(facts, n_attempts))


def _eta(facts: RunDirFacts, now: datetime, completed: int) -> int | None:
    total, started = facts.n_total, facts.started_at
    if total is None or started is None or completed <= 0:
        return None
    remaining = total - completed
    elapsed_s = (now - started).total_seconds()
    if remaining <= 0 or elapsed_s <= 0:
        return None
    return max(1, math.ceil(remaining * elapsed_s / completed / 60))


def progress_of(facts: RunDirFacts | None, n_attempts: int, eta_at: datetime | None) -> Progress | None:
    """Measured of expected trials, a task's re-runs counted once; an ETA reckoned at `eta_at`, given only while a
    job works on them."""
    if facts is None or facts.unreadable:
        return None
    completed, measured = trial_pairs(facts, n_attempts)
    return trusted(Progress, {"scored": measured, "total": facts.n_total,
                              "eta_minutes": _eta(facts, eta_at, completed) if eta_at is not None else None},
                   _PROGRESS_FIELDS)
