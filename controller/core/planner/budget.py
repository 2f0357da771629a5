"""The GPU-hour budget (`spec.budget.maxGpuHours`) as the allocation counts it: what is spent and committed before
any launch, and why a launch is held."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from controller.core.gpu_hours import UNKNOWN, GpuBudget, GpuEstimate, budget_reason, cell_hours, past_gpu_budget
from controller.core.observed import Observation
from controller.core.planner.policy import Policy
from controller.core.types import Cell, EvalRunRef, run_tag_of, walltime_seconds
from controller.core.vocabulary import CellPlan


def gpu_budget(evalrun: EvalRunRef, decided: Sequence[CellPlan | Cell], observations: Sequence[Observation],
               policy: Policy, estimates: Mapping[str, GpuEstimate]) -> tuple[GpuBudget, set[str]]:
    """Before any launch: what this EvalRun's jobs have spent, plus what its live cells are still expected to
    spend (their estimate, or with none their walltime × GPUs, less what their live attempt has used); and the
    groups (benchmark, size band) whose cost a live cell without an estimate is measuring."""
    spent = committed = 0.0
    unestimated = 0
    probing: set[str] = set()
    budgeted = policy.max_gpu_hours is not None  # without a budget, what live cells still need decides nothing
    for decision, obs in zip(decided, observations, strict=True):
        if type(decision) is Cell:  # exact: see fleet.launch_of
            continue
        spent += decision.gpu_hours or 0.0
        if not budgeted or not obs.submissions or obs.jobs is None:
            continue
        ours = [s for s in obs.submissions if evalrun.known_as(s.evalrun)]
        names = {s.name for s in ours}  # another EvalRun's job of a shared cell is its budget, not this one's
        live = next((job for job in obs.jobs if job.state.active and job.name in names), None)
        if live is None:
            continue
        estimate = estimates.get(decision.cell.key, UNKNOWN)
        if estimate.hours is None:
            unestimated += 1
            probing.add(estimate.group)
        expected = prior_hours(decision.cell, policy) if estimate.hours is None else estimate.hours
        committed += max(expected - (cell_hours(ours, obs.jobs, run_tag=run_tag_of(live.name)) or 0.0), 0.0)
    return GpuBudget(max_hours=policy.max_gpu_hours, spent=spent, committed=spent + committed,
                     unestimated=unestimated), probing

def gpu_hold(gpu: GpuBudget, cost: float | None, estimate: GpuEstimate, probing: set[str]) -> str | None:
    """Why the budget holds a launch, if it does. Without an estimate, one launch per group probes the cost (while
    any budget is left); the rest of its group waits for that number."""
    if gpu.max_hours is None:
        return None
    if cost is not None:
        return budget_reason(gpu, cost) if past_gpu_budget(gpu, cost) else None
    if estimate.group in probing:
        return (f"budget: no GPU-hour estimate for {estimate.group} yet; a probe job of it is measuring the cost, "
                "and this launch waits for that number (spec.budget.maxGpuHours)")
    return budget_reason(gpu, None) if gpu.committed >= gpu.max_hours else None

def prior_hours(cell: Cell, policy: Policy) -> float:
    """The most one job of the cell can cost: its walltime × the cluster's GPUs per job."""
    return walltime_seconds(cell.time_limit) / 3600 * policy.gpus_per_job
