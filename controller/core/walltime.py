"""Walltime sized from what attempts like a cell's took (`spec.walltime: auto`, RULES §16). Pure.

A fixed walltime asks every job for the cluster's `timeLimit` (or its preset's): a 4 h eval waits in the queue
as a 24 h one (backfill favours short requests), and one that needs more is cut and resumed. Sized, a job asks for
the high quantile (p90) of the wall time of finished attempts of the same benchmark and size band, × a margin, for
the share of trials it has to run (all, or those a resume has left), plus what every job pays whatever its share:
a model server's cold start and the pre-walltime cancel (`monitor.preWalltimeMinutes`: that much of any request is
never run); rounded up to a quarter hour and kept within `[minTimeLimit, maxTimeLimit]`. Without those fixed costs
a resume of a few trials asked for less than its own start and cancel, and was cut again and again
(`make bench-walltime` found a cell of 23 jobs). With no evidence yet, a job asks for the fixed walltime, and
says so.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import timedelta

from pydantic import Field

from controller.core.types import Frozen

QUARTER_HOUR_S = 15 * 60
MARGIN = 1.25  # over the p90: a cut job is resumed (a cold start and a queue wait), a long request only waits longer
COLD_START = timedelta(minutes=15)  # a model server's start before the first trial (a 32B on vLLM: 12–15 min)


class WallEstimate(Frozen):
    """How long one full attempt of a cell runs, from the evidence `basis` names."""

    median_hours: float
    high_hours: float = Field(description="the p90 (nearest rank) of the same evidence")
    basis: str = Field(description="what it is read from, for plan and explain")


class WalltimePolicy(Frozen):
    auto: bool = Field(description="spec.walltime auto: size each job's --time from the estimate")
    cancel_margin: timedelta = Field(description="monitor.preWalltimeMinutes: the end of a request never run")
    minimum: timedelta = Field(description="the cluster's minTimeLimit: no sized request asks for less")
    maximum: timedelta = Field(description="the cluster's maxTimeLimit (else timeLimit): none asks for more")


class Sized(Frozen):
    time_limit: str = Field(description="the job's --time, H:MM:SS")
    note: str = Field(description="how it was sized, for plan and explain")


def wall_estimate(hours: Sequence[float], basis: str) -> WallEstimate | None:
    """The median and p90 of the wall hours of finished attempts (or run dirs) alike; None without any."""
    if not hours:
        return None
    ordered = sorted(hours)
    middle = len(ordered) // 2
    median = ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
    return WallEstimate(median_hours=median, high_hours=ordered[math.ceil(0.9 * len(ordered)) - 1], basis=basis)


def sized(estimate: WallEstimate | None, remaining: float, policy: WalltimePolicy, fixed: str) -> Sized | None:
    """The --time of a launch that has `remaining` (0–1) of its trials to run; None: the fixed walltime (`fixed`),
    walltime not auto."""
    if not policy.auto:
        return None
    if estimate is None:
        return Sized(time_limit=fixed, note=f"walltime auto: no finished attempt alike yet, asks the fixed {fixed}")
    fixed_costs = (COLD_START + policy.cancel_margin).total_seconds()
    wanted = estimate.high_hours * 3600 * remaining * MARGIN + fixed_costs
    seconds = math.ceil(wanted / QUARTER_HOUR_S) * QUARTER_HOUR_S
    low, high = policy.minimum.total_seconds(), policy.maximum.total_seconds()
    clamped = int(min(max(seconds, low), high))
    share = "" if remaining >= 1 else f" × {remaining:.0%} of trials left"
    bound = (" (minTimeLimit)" if clamped == low and wanted < low else
             " (maxTimeLimit: resumed after it)" if clamped == high and seconds > high else "")
    return Sized(time_limit=clock(clamped), note=(
        f"walltime auto: {clock(clamped)}{bound} = p90 {hours_text(estimate.high_hours)}{share} × {MARGIN:g} + "
        f"{hours_text(fixed_costs / 3600)} start and pre-walltime cancel, est. {hours_text(estimate.median_hours)} "
        f"(median) from {estimate.basis}"))


def clock(seconds: int) -> str:
    """`H:MM:SS`, as --time takes it (hours past 24 stay hours: SLURM reads 30:00:00 as 30 h)."""
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def hours_text(hours: float) -> str:
    minutes = round(hours * 60)
    if minutes < 1:
        return "under 1 m"
    return f"{minutes // 60} h {minutes % 60:02d} m" if minutes >= 60 else f"{minutes} m"
