"""Walltime sized from what attempts like a cell's took (`spec.walltime: auto`, RULES §16). Pure.

A fixed walltime asks every job for the cluster's `timeLimit` (or its preset's): a 4 h eval waits in the queue
as a 24 h one (backfill favours short requests), and one that needs more is cut and resumed. Sized, a job asks for
the high quantile (p90) of the wall time of finished attempts of the same benchmark and size band, × a margin, for
the share of trials it has to run (all, or those a resume has left), plus what every job pays whatever its share:
a model server's cold start and the pre-walltime cancel (`monitor.preWalltimeMinutes`: that much of any request is
never run); rounded up to a quarter hour and kept within `[minTimeLimit, maxTimeLimit]`. Without those fixed costs
a resume of a few trials asked for less than its own start and cancel, and was cut again and again
(`make bench-walltime` found a cell of 23 jobs). With no evidence yet, a job asks for the fixed walltime, and
says so. Each sized job records its estimate with its intent and how long it ran once it ended; after five, the
margin follows them (`learned`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from datetime import timedelta

from pydantic import Field

from controller.core.observed import Submission
from controller.core.types import EvalRunRef, Frozen

QUARTER_HOUR_S = 15 * 60
MARGIN = 1.25  # over the p90: a cut job is resumed (a cold start and a queue wait), a long request only waits longer
MARGIN_BOUNDS = (1.1, 2.0)  # what the learnt margin may be: never the bare estimate, never four times it
LEARN_AFTER = 5  # sized jobs ended before the margin follows what they ran
SHARDS_MAX = 64  # jobs one cell may run as: more is a typo for nConcurrent
COLD_START = timedelta(minutes=15)  # a model server's start before the first trial (a 32B on vLLM: 12–15 min)
COLD_START_HOURS = COLD_START.total_seconds() / 3600


class WallEstimate(Frozen):
    """How long one full attempt of a cell runs, from the evidence `basis` names."""

    median_hours: float
    high_hours: float = Field(description="the p90 (nearest rank) of the same evidence")
    basis: str = Field(description="what it is read from, for plan and explain")
    with_start: bool = Field(False, description="its hours hold each job's model-server start (a finished attempt's "
                                                "do; a run dir's trial time does not)")
    start_hours: float | None = Field(None, description="a job's model-server start before its first trial, measured "
                                                        "on jobs alike (the median); None: not measured")
    start_basis: str = Field("", description="what the start is measured on")
    scales: bool = Field(False, description="every attempt it is read from says how many trials it ran, as the cell "
                                            "does: an estimate of a share of them is scaled the same way (else no "
                                            "shard count can be told to fit)")


class Learning(Frozen):
    """What the ended sized jobs ran against their estimate, and the margin that follows from it."""

    jobs: int = Field(description="sized jobs that ended with both recorded")
    median_ratio: float | None = Field(description="ran / estimated, the median; None: no job yet")
    high_ratio: float | None = Field(description="ran / estimated, the p90")
    margin: float

    def summary(self) -> str:
        """For status: `walltime auto: 12 sized jobs ran 0.82× their estimate (p90 1.10×); margin 1.38 (learnt)`."""
        if self.median_ratio is None or self.high_ratio is None:
            return f"walltime auto: no sized job has ended yet; margin {self.margin:g}"
        how = "learnt" if self.jobs >= LEARN_AFTER else f"the default until {LEARN_AFTER} jobs"
        return (f"walltime auto: {self.jobs} sized job(s) ran {self.median_ratio:.2f}× their estimate (p90 "
                f"{self.high_ratio:.2f}×); margin {self.margin:.2f} ({how})")


class WalltimePolicy(Frozen):
    auto: bool = Field(description="spec.walltime auto: size each job's --time from the estimate")
    presets: bool = Field(True, description="a preset's `walltime: auto` sizes its cells' jobs (False: a placement "
                                            "probe, which sizes nothing)")
    learnt: Learning | None = Field(None, description="what the EvalRun's sized jobs taught (`learned_from`), read "
                                                      "with the store each pass; None: not read, the default margin")
    cancel_margin: timedelta = Field(description="monitor.preWalltimeMinutes: the end of a request never run")
    minimum: timedelta = Field(description="the cluster's minTimeLimit: no sized request asks for less")
    maximum: timedelta = Field(description="the cluster's maxTimeLimit (else timeLimit): none asks for more")

    @property
    def margin(self) -> float:
        """Over the p90: what the sized jobs taught, else the default."""
        return self.learnt.margin if self.learnt is not None else MARGIN


class Sized(Frozen):
    time_limit: str = Field(description="the job's --time, H:MM:SS")
    note: str = Field(description="how it was sized, for plan and explain")
    estimated_hours: float | None = Field(description="how long the job is expected to run (the p90 for its share, "
                                                      "and its server start where the estimate lacks it), recorded "
                                                      "with its intent; None: not estimated, or cut to maxTimeLimit")


def learned(estimated_and_ran: Iterable[tuple[float, float]]) -> Learning:
    """The margin from (estimated, ran) hours of ended sized jobs: the default × their p90 ratio, so a fleet whose
    jobs run longer than estimated asks for more and one that runs shorter for less, within `MARGIN_BOUNDS`; the
    default until `LEARN_AFTER` jobs say."""
    ratios = sorted(ran / estimated for estimated, ran in estimated_and_ran if estimated > 0)
    if not ratios:
        return Learning(jobs=0, median_ratio=None, high_ratio=None, margin=MARGIN)
    median, high = statistics.median(ratios), _p90(ratios)
    low_bound, high_bound = MARGIN_BOUNDS
    margin = min(max(MARGIN * high, low_bound), high_bound) if len(ratios) >= LEARN_AFTER else MARGIN
    return Learning(jobs=len(ratios), median_ratio=median, high_ratio=high, margin=margin)


def learned_from(submissions: Iterable[Submission], evalrun: EvalRunRef) -> Learning:
    """`learned` from the EvalRun's own finished attempts, each by its last job: the one that ran its trials to the
    end (a job cut at its walltime before it, or cancelled, says nothing of how long the work takes)."""
    last: dict[str, Submission] = {}
    for sub in submissions:
        if sub.finished_at is not None and evalrun.known_as(sub.evalrun) and (
                sub.run_tag not in last or sub.fire > last[sub.run_tag].fire):
            last[sub.run_tag] = sub
    return learned((sub.estimated_hours, sub.elapsed_hours) for sub in last.values()
                   if sub.estimated_hours is not None and sub.elapsed_hours is not None)


def wall_estimate(hours: Sequence[float], basis: str, *, with_start: bool = False,
                  starts: Sequence[float] = (), start_basis: str = "", scales: bool = False) -> WallEstimate | None:
    """The median and p90 of the wall hours of finished attempts (or run dirs) alike, with the median server start
    measured on `starts` (hours); None without any hours. `scales`: every one of them is of a known size."""
    if not hours:
        return None
    ordered = sorted(hours)
    return WallEstimate(median_hours=statistics.median(ordered), high_hours=_p90(ordered), basis=basis,
                        with_start=with_start, start_hours=statistics.median(starts) if starts else None,
                        start_basis=start_basis if starts else "", scales=scales)


def _p90(ordered: Sequence[float]) -> float:
    """Nearest rank: a value that was seen, never one between two."""
    return ordered[math.ceil(0.9 * len(ordered)) - 1]


def sized(estimate: WallEstimate | None, remaining: float, policy: WalltimePolicy, fixed: str,
          preset_auto: bool = False) -> Sized | None:
    """The --time of a launch that has `remaining` (0–1) of its trials to run; None: the fixed walltime (`fixed`),
    walltime not auto (neither the EvalRun's nor, with `preset_auto`, its preset's)."""
    if not (policy.auto or (preset_auto and policy.presets)):
        return None
    if estimate is None:
        return Sized(time_limit=fixed, note=f"walltime auto: no finished attempt alike yet, asks the fixed {fixed}",
                     estimated_hours=None)
    seconds, starting = unclamped_request(estimate, remaining, policy)
    low, high = policy.minimum.total_seconds(), policy.maximum.total_seconds()
    clamped = int(min(max(seconds, low), high))
    cut_short = seconds > high  # its estimate says it cannot finish: nothing to learn from it
    share = "" if remaining >= 1 else f" × {remaining:.0%} of trials left"
    bound = " (minTimeLimit)" if seconds < low else " (maxTimeLimit: resumed after it)" if cut_short else ""
    start = f" + {hours_text(starting)} server start ({estimate.start_basis or 'assumed'})" if starting else ""
    cancel = hours_text(policy.cancel_margin.total_seconds() / 3600)
    within = "" if starting else " (its server start is in the estimate)"
    return Sized(time_limit=clock(clamped), estimated_hours=None if cut_short else
                 estimate.high_hours * remaining + starting, note=(
        f"walltime auto: {clock(clamped)}{bound} = p90 {hours_text(estimate.high_hours)}{share} × "
        f"{policy.margin:.3g}{start} + {cancel} pre-walltime cancel{within}; est. "
        f"{hours_text(estimate.median_hours)} (median) from {estimate.basis}"))


def unclamped_request(estimate: WallEstimate, remaining: float, policy: WalltimePolicy) -> tuple[int, float]:
    """The request before it is clamped, in seconds rounded up to a quarter hour, and the server start it adds
    (hours; 0: the estimate holds it)."""
    start_h = estimate.start_hours if estimate.start_hours is not None else COLD_START_HOURS
    starting = start_h if not estimate.with_start or remaining < 1 else 0.0  # a resume starts its server again
    fixed_costs = starting * 3600 + policy.cancel_margin.total_seconds()
    wanted = estimate.high_hours * 3600 * remaining * policy.margin + fixed_costs
    return math.ceil(wanted / QUARTER_HOUR_S) * QUARTER_HOUR_S, starting


def shards_needed(estimate: WallEstimate | None, policy: WalltimePolicy, tasks: int) -> int | None:
    """How many shards a cell of `tasks` tasks runs as when even its sized request exceeds maxTimeLimit (RULES
    §17): the fewest whose jobs' requests fit, each sized as its shard will be (the largest share of the tasks,
    its own server start and cancel), else as many as there are tasks (at most SHARDS_MAX). None: its request
    fits, there is nothing to go by, the evidence does not scale to a share (an attempt whose trials are not
    recorded counts whole for a shard too), or no shard fits even empty (the fixed costs alone fill
    maxTimeLimit)."""
    limit = policy.maximum.total_seconds()
    if estimate is None or not estimate.scales or tasks < 2:
        return None
    if unclamped_request(estimate, 1.0, policy)[0] <= limit:
        return None
    if unclamped_request(_share(estimate, 0.0), 1.0, policy)[0] > limit:
        return None
    most = min(tasks, SHARDS_MAX)
    fits = (count for count in range(2, most)
            if unclamped_request(_share(estimate, math.ceil(tasks / count) / tasks), 1.0, policy)[0] <= limit)
    return next(fits, most)


def _share(estimate: WallEstimate, fraction: float) -> WallEstimate:
    """The estimate of a job running `fraction` of the trials from the start, as the estimates scale one
    (`scaled_hours`)."""
    start = (estimate.start_hours or 0.0) if estimate.with_start else 0.0
    return estimate.model_copy(update={"median_hours": scaled_hours(estimate.median_hours, start, fraction),
                                       "high_hours": scaled_hours(estimate.high_hours, start, fraction)})


def scaled_hours(hours: float, start: float, factor: float) -> float:
    """An attempt's hours for a job `factor` times its size: its server start (`start`, measured or 0) as it was,
    its trials' time scaled."""
    fixed = min(start, hours)
    return fixed + (hours - fixed) * factor


def clock(seconds: int) -> str:
    """`H:MM:SS`, as --time takes it (hours past 24 stay hours: SLURM reads 30:00:00 as 30 h)."""
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def hours_text(hours: float) -> str:
    minutes = round(hours * 60)
    if minutes < 1:
        return "under 1 m"
    return f"{minutes // 60} h {minutes % 60:02d} m" if minutes >= 60 else f"{minutes} m"
