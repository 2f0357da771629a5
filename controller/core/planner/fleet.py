"""What a plan decides for the EvalRun as a whole, beside its cells: cells another EvalRun owns, leases whose job
is over, deletion; and the words shared by the allocation (`launch_of`, the untouched cell)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from controller.core.actions import Cancel, Launch, Resume, Skip, Submit
from controller.core.observed import JobState, Observation, TunnelLease
from controller.core.types import Cell, EvalRunRef
from controller.core.vocabulary import CellPlan, Phase, Plan, Rule

UNTOUCHED = Observation(rows=(), submissions=(), jobs=(), run_dirs=())


def untouched(cell: Cell, obs: Observation) -> bool:
    """Nothing seen of a cell that needs no pinggy pair: its plan depends on the budget alone."""
    if cell.needs_pinggy or obs.rows or obs.submissions or obs.jobs or obs.run_dirs or obs.outputs:
        return False
    seen = (obs.rows, obs.submissions, obs.jobs, obs.run_dirs, obs.outputs, obs.unknown_reason)
    return seen == ((), (), (), (), (), "") and (obs.memory is UNTOUCHED.memory or obs.memory == UNTOUCHED.memory)


def launch_of(cell_plan: CellPlan) -> Launch | None:
    """The cell's launch, if it has one. Its class is tested exactly, as in every per-cell pass of the allocation
    (no action class, nor Cell or CellPlan, is subclassed): an isinstance() that misses a pydantic model goes through
    its metaclass's check, 0.07 µs (0.18 µs against a union), asked several times for each of 10,000 cells."""
    for action in cell_plan.actions:
        if type(action) is Submit or type(action) is Resume:
            return action
    return None


def owned_elsewhere(cell_plan: CellPlan, owner: EvalRunRef) -> CellPlan:
    """Another EvalRun acts for this cell: keep what was observed (phase, reason, score), do nothing."""
    reason = f"owned by EvalRun {owner}"
    return cell_plan.model_copy(update={
        "actions": (Skip(reason=reason),), "row_updates": (), "remember": None,
        "reason": f"{cell_plan.reason} ({reason})", "rule": Rule.OWNED_ELSEWHERE})


def ended_leases(evalrun: EvalRunRef, leases: Sequence[TunnelLease], observations: Sequence[Observation],
                 live_job_names: frozenset[str] | None) -> tuple[TunnelLease, ...]:
    """This EvalRun's leases whose holder is no live job and will not be launched by a repair.

    A lease whose submission never reached sbatch (a crash between intent and sbatch) is kept: the repair
    reuses it. A lease whose submission no cell knows any more (the spec changed) goes once its job is over.
    A lease stamped with the bare name of a namespaced EvalRun (versions before 0.2) is this EvalRun's when
    its holder is a submission of one of its cells.
    """
    if live_job_names is None or not leases:
        return ()
    subs = {s.name: s for obs in observations for s in obs.submissions or ()}
    jobs = [job for obs in observations for job in obs.jobs or ()]
    ended = []
    for lease in leases:
        ours = lease.evalrun == evalrun or (evalrun.known_as(lease.evalrun) and lease.holder in subs)
        if not ours or lease.holder in live_job_names:
            continue
        sub = subs.get(lease.holder)
        awaiting_repair = sub is not None and sub.job_id is None and not any(
            job.name == sub.name and sub.may_have_launched(job) for job in jobs)
        if not awaiting_repair:
            ended.append(lease)
    return tuple(ended)


def plan_deletion(evalrun: EvalRunRef, cells: Sequence[Cell], observations: Sequence[Observation],
                  owners: Mapping[str, EvalRunRef]) -> Plan:
    """deletionPolicy Cancel: cancel every queued or running job of the cells this EvalRun owns; nothing else."""
    planned = []
    for cell, obs in zip(cells, observations, strict=True):
        live = [job for job in obs.jobs or () if job.state.active]
        if cell.key in owners or not live:
            continue
        cancels = tuple(Cancel(job_id=job.job_id, reason=f"EvalRun {evalrun} deleted with deletionPolicy Cancel")
                        for job in live)
        phase = Phase.RUNNING if any(job.state == JobState.RUNNING for job in live) else Phase.SUBMITTED
        planned.append(CellPlan(cell=cell, phase=phase, actions=cancels, reason="EvalRun deleted",
                                rule=Rule.DELETION_CANCEL, memory=obs.memory))
    return Plan(evalrun=evalrun, cells=tuple(planned))
