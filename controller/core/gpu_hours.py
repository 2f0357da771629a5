"""GPU-hours: what an attempt cost (actual), what a cell not yet run will cost (estimated), and the budget. Pure.

Actual hours come from the scheduler (sacct's elapsed × allocated GPUs; the local scheduler's wall × gpusPerJob)
and are kept on each submission record once its job ended, so they outlive the scheduler's accounting window.
An estimate is, in order: the median actual hours of finished attempts of the same benchmark and size band in
the store's history; else the median of similar run dirs' wall time (extrapolated to all their trials) ×
gpusPerJob; else unknown. The pass computes estimates from its reads and hands them to the planner as data.
"""

from __future__ import annotations

import re
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from datetime import datetime
from enum import StrEnum
from typing import NamedTuple

from pydantic import Field

from controller.core.observed import ObservedJob, RunDirFacts, Submission
from controller.core.types import Cell, Frozen
from controller.core.walltime import WallEstimate, scaled_hours, wall_estimate

SECONDS_PER_HOUR = 3600.0


def size_in_billions(model: str, size_token: str) -> float | None:
    """Largest size token in the model name, in billions (`Qwen3-30B-A3B` → 30): the size policy's reading."""
    sizes = [float(m.group(1)) for m in re.finditer(size_token, model, re.IGNORECASE)]
    return max(sizes, default=None)


class SizeBands(Frozen):
    """The size policy's bands, as data: which models' costs are comparable."""

    size_token: str = r"(?<![\d.])(\d+(?:\.\d+)?)b(?![a-z])"
    bands: tuple[tuple[float, float], ...] = ()

    def band_of(self, model: str) -> str:
        """`0–14B`, `28–42B`; `unsized` without a size token; `40B` for a size outside every band."""
        size = size_in_billions(model, self.size_token)
        if size is None:
            return "unsized"
        band = next(((low, high) for low, high in self.bands if low <= size <= high), None)
        return f"{size:g}B" if band is None else f"{band[0]:g}–{band[1]:g}B"


class EstimateSource(StrEnum):
    HISTORY = "history"
    RUN_DIRS = "run dirs"
    UNKNOWN = "unknown"


class GpuEstimate(Frozen):
    """What one full attempt of a cell is expected to cost, and where that number comes from."""

    hours: float | None = Field(description="None: unknown")
    source: EstimateSource
    basis: str = Field(description="what it is the median of, for plan and explain")
    group: str = Field("", description="the benchmark and size band whose cost it is (e.g. 'tb2, 0–14B')")
    wall: WallEstimate | None = Field(None, description="how long the attempt runs, from the same evidence: what "
                                                        "`walltime: auto` sizes its jobs by; None: nothing to go by")


UNKNOWN = GpuEstimate(hours=None, source=EstimateSource.UNKNOWN, basis="no finished attempt or run dir to go by")


class AttemptCost(Frozen):
    """One finished attempt in the store's history: its model, benchmark and total actual GPU-hours."""

    run_tag: str
    model: str
    benchmark: str
    gpu_hours: float
    wall_hours: float | None = Field(None, description="its jobs' elapsed hours summed (None: not all recorded)")
    trials: int | None = Field(None, description="the trials it was to run (None: not known)")
    concurrency: int | None = Field(None, description="its nConcurrent (None: not known)")


class _Size(NamedTuple):
    """How many trials an attempt runs and how many at a time: evidence from an attempt of another size is scaled
    to the cell's, trials × time per trial / concurrency, where both sides say. (A tuple: one per cell a pass.)"""

    trials: int | None
    concurrency: int | None

    def scales_to(self, cell: _Size) -> bool:
        """Its hours scale with a cell's share of trials: both say how many they run."""
        return bool(cell.trials and self.trials)

    def factor(self, cell: _Size) -> float:
        trials = cell.trials / self.trials if cell.trials and self.trials else 1.0
        concurrency = self.concurrency / cell.concurrency if cell.concurrency and self.concurrency else 1.0
        return trials * concurrency


def estimates(cells: Sequence[Cell], history: Iterable[AttemptCost], run_dirs: Iterable[RunDirFacts],
              bands: SizeBands, gpus_per_job: int, jobs: Sequence[ObservedJob] = ()) -> dict[str, GpuEstimate]:
    """Cell key → estimate, for every cell (a cell already run shows its actual hours instead, in the plan). The
    wall time of an attempt in the history is its jobs' elapsed hours, else its GPU-hours over gpusPerJob (never
    from zero: a site whose accounting does not count GPUs says 0); else the run dirs say it. A model server's start
    is measured per size band on the run dirs whose first job is in `jobs`: from that job's start to the dir's
    first trial. Evidence from an attempt of another size (trials, concurrency) is scaled to the cell's."""
    by_history: dict[tuple[str, str], list[AttemptCost]] = defaultdict(list)
    for cost in history:
        by_history[(cost.benchmark, bands.band_of(cost.model))].append(cost)
    by_dirs: dict[tuple[str, str], list[tuple[float, _Size]]] = defaultdict(list)  # wall hours, of what size
    starts: dict[str, list[float]] = defaultdict(list)  # size band → server starts, hours
    first_jobs = {job.name: job for job in jobs if job.started_at is not None}
    for facts in run_dirs:
        hours = _dir_wall_hours(facts)
        if facts.benchmark_name and facts.model:
            if hours is not None:
                size = _Size(trials=max(facts.n_total or facts.n_completed, facts.n_completed), concurrency=None)
                by_dirs[(facts.benchmark_name, bands.band_of(facts.model))].append((hours, size))
            if (start := _server_start(facts, first_jobs.get(facts.run_tag))) is not None:
                starts[bands.band_of(facts.model)].append(start)
    found: dict[tuple[str, str, _Size], GpuEstimate] = {}
    band_of: dict[str, str] = {}  # a model's band is read once, however many benchmarks it has
    result = {}
    for cell in cells:
        if cell.model not in band_of:
            band_of[cell.model] = bands.band_of(cell.model)
        group = (cell.benchmark_name, band_of[cell.model])
        size = _Size(trials=cell.trials, concurrency=cell.n_concurrent)
        if (key := (*group, size)) not in found:
            found[key] = _estimate(group, size, by_history.get(group), by_dirs.get(group), starts.get(group[1], []),
                                   gpus_per_job)
        result[cell.key] = found[key]
    return result


def _estimate(group: tuple[str, str], size: _Size, history: list[AttemptCost] | None,
              dirs: list[tuple[float, _Size]] | None, starts: list[float], gpus_per_job: int) -> GpuEstimate:
    """`history`: finished attempts; `dirs`: wall hours of run dirs (extrapolated to all their trials); `starts`:
    server starts measured on jobs of the size band, hours. Each scaled to a cell of `size`."""
    benchmark, band = group
    name = f"{benchmark}, {band}"
    measured = f"measured, median of {len(starts)} job(s) of {band}"
    start = statistics.median(starts) if starts else 0.0
    dir_factors = [of.factor(size) for _, of in dirs or ()]
    dir_hours = [hours * factor for (hours, _), factor in zip(dirs or (), dir_factors, strict=True)]  # no start in it
    dirs_note = _scaling_note(dir_factors, size)
    from_dirs = wall_estimate(dir_hours, f"{len(dir_hours)} run dir(s) of {name} (trials' wall time){dirs_note}",
                              starts=starts, start_basis=measured,
                              scales=all(of.scales_to(size) for _, of in dirs or ()))
    if history:
        of_size = {cost.run_tag: _Size(trials=cost.trials, concurrency=cost.concurrency) for cost in history}
        sizes = {tag: of.factor(size) for tag, of in of_size.items()}
        note = _scaling_note(list(sizes.values()), size)
        walls = [(c, scaled_hours(c.wall_hours, start, sizes[c.run_tag])) for c in history if c.wall_hours] or \
            [(c, scaled_hours(c.gpu_hours / gpus_per_job, start, sizes[c.run_tag]))
             for c in history if c.gpu_hours > 0 and gpus_per_job > 0]
        wall = wall_estimate([hours for _, hours in walls], f"{len(walls)} finished attempt(s) of {name}{note}",
                             with_start=True, starts=starts, start_basis=measured,
                             scales=all(of_size[c.run_tag].scales_to(size) for c, _ in walls)) or from_dirs
        hours = [scaled_hours(c.gpu_hours, start * gpus_per_job, sizes[c.run_tag]) for c in history]
        return GpuEstimate(hours=statistics.median(hours), source=EstimateSource.HISTORY, group=name, wall=wall,
                           basis=f"median of {len(hours)} finished attempt(s) of {name}{note}")
    if dirs:
        return GpuEstimate(hours=statistics.median(dir_hours) * gpus_per_job, source=EstimateSource.RUN_DIRS,
                           group=name, wall=from_dirs, basis=f"median wall time of {len(dir_hours)} run dir(s) of "
                                                              f"{name}, × gpusPerJob{dirs_note}")
    return UNKNOWN.model_copy(update={"group": name})


def _scaling_note(factors: Sequence[float], size: _Size) -> str:
    """`, scaled to 267 trials at 8 at a time` when some evidence was of another size."""
    if all(factor == 1.0 for factor in factors):
        return ""
    trials = f" {size.trials} trials" if size.trials else " the cell's size"
    return f", scaled to{trials} at {size.concurrency} at a time" if size.concurrency else f", scaled to{trials}"


def _server_start(facts: RunDirFacts, first_job: ObservedJob | None) -> float | None:
    """Hours from a run dir's first job's start to its first trial: the model server starting (a start past a
    day is no start but a dir written again later, and is not counted)."""
    if first_job is None or first_job.started_at is None or facts.started_at is None:
        return None
    hours = (facts.started_at - first_job.started_at).total_seconds() / SECONDS_PER_HOUR
    return hours if 0 <= hours < 24 else None


def _dir_wall_hours(facts: RunDirFacts) -> float | None:
    """A run dir's wall time from its first trial's start to its last result, scaled up to all its trials (one
    still running whose total nothing says cannot be: its time so far is no attempt's)."""
    end = facts.finished_at or facts.last_progress_at
    if facts.started_at is None or end is None or facts.n_completed == 0 or facts.unreadable:
        return None
    if facts.n_total is None and facts.finished_at is None:
        return None
    seconds = (end - facts.started_at).total_seconds()
    if seconds <= 0:
        return None
    total = max(facts.n_total or facts.n_completed, facts.n_completed)
    return seconds * total / facts.n_completed / SECONDS_PER_HOUR


def job_gpu_hours(started: datetime | None, ended: datetime | None, now: datetime, gpus: int) -> float | None:
    """Wall time × GPUs; so far for a job still running; None before it started."""
    if started is None:
        return None
    return max(((ended or now) - started).total_seconds(), 0.0) * gpus / SECONDS_PER_HOUR


def submission_hours(submission: Submission, jobs: Sequence[ObservedJob]) -> float | None:
    """A submission's GPU-hours: as recorded, else what the scheduler says of its job now."""
    if submission.gpu_hours is not None:
        return submission.gpu_hours
    job = job_of(submission, jobs)
    return job.gpu_hours if job is not None else None


def job_of(submission: Submission, jobs: Sequence[ObservedJob]) -> ObservedJob | None:
    """The job a submission launched: by its recorded id, else the newest of its name it may have launched."""
    if not jobs:
        return None
    if submission.job_id is not None:  # and its name: job ids are per cluster, and a spilled cell's run on two
        return next((job for job in jobs if job.job_id == submission.job_id and job.name == submission.name), None)
    named = [job for job in jobs if job.name == submission.name and submission.may_have_launched(job)]
    return named[-1] if named else None


def total(hours: Iterable[float | None]) -> float | None:
    """The sum of what is known; None when nothing is."""
    known = [h for h in hours if h is not None]
    return sum(known) if known else None


class GpuBudget(Frozen):
    """An EvalRun's GPU-hours against `spec.budget.maxGpuHours`, as one plan counted them."""

    max_hours: float | None = Field(None, description="spec.budget.maxGpuHours; None: no budget")
    spent: float = Field(0.0, description="actual GPU-hours of every job of its cells (so far, for running ones)")
    committed: float = Field(0.0, description="spent + the estimated rest of live cells + the launches of this plan")
    held: int = Field(0, description="launches held by the budget")
    unestimated: int = Field(0, description="launches and live cells with no estimate (with a budget, probes "
                                            "counted at their walltime × GPUs)")


def launch_cost(estimate: GpuEstimate, facts: RunDirFacts | None, resume: bool) -> float | None:
    """What a launch is expected to add: a new attempt its cell's estimate; a resume the share of trials left."""
    return None if estimate.hours is None else estimate.hours * remaining_share(facts, resume=resume)


def remaining_share(facts: RunDirFacts | None, *, resume: bool) -> float:
    """The share of its trials a launch has to run: all of them for a new attempt; for a resume those left and
    those that ended in an infrastructure error, which `harbor jobs resume` runs again (RULES §3)."""
    if not resume or facts is None or not facts.n_total:
        return 1.0
    return min((max(facts.n_total - facts.n_completed, 0) + facts.n_infra_errors) / facts.n_total, 1.0)


def past_gpu_budget(budget: GpuBudget, cost: float) -> bool:
    """Would this launch take the EvalRun past its budget?"""
    return budget.max_hours is not None and budget.committed + cost > budget.max_hours


def budget_reason(budget: GpuBudget, cost: float | None) -> str:
    """e.g. `budget: 412 of 400 GPU-h (spent 380, est. 32 for this launch; spec.budget.maxGpuHours)`."""
    assert budget.max_hours is not None
    after = budget.committed + (cost or 0.0)
    this = "no estimate for this launch" if cost is None else f"est. {_h(cost)} for this launch"
    return (f"budget: {_h(after)} of {budget.max_hours:g} GPU-h (spent {_h(budget.spent)}, {this}; "
            "raise spec.budget.maxGpuHours to launch it)")


def _h(hours: float) -> str:
    return f"{hours:.0f}" if hours >= 10 else f"{hours:.2g}"


def cell_hours(submissions: Sequence[Submission], jobs: Sequence[ObservedJob],
               run_tag: str | None = None) -> float | None:
    """Actual GPU-hours of a cell's submissions (of one attempt, with `run_tag`), known ones summed."""
    if all(j.gpu_hours is None for j in jobs) and all(s.gpu_hours is None for s in submissions):
        return None  # nothing to sum (a scheduler that does not say): no per-submission look-ups
    return total(submission_hours(s, jobs) for s in submissions if run_tag is None or s.run_tag == run_tag)
