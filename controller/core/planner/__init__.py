"""plan(): the whole controller decision, as a pure function of observed data.

No I/O, no clock, no randomness: `now` is an argument and every fact arrives in an Observation.
Per cell (`cell.plan_cell`), the first rule that applies decides (each names its `Rule`):
  0. a new attempt after a failed job whose intent never reached sbatch, the run dir unseen → finish it (§12);
  1. its newest job FAILED / ran out of memory and the run dir cannot be seen  → hold for a human;
  2. a source could not be read                                                 → Unknown, no action;
  3. a run dir of the cell cannot be read and no job of it is live               → Unknown, no action;
  4. a job of the cell is queued or running → watch it (`rules_in_flight`): duplicate, stale queue,
     pre-walltime, then the running job's health table (`rules_running.RUNNING_RULES`: zombie, stuck near
     complete, stuck general, …; RULES §2, §5, §8);
  5. otherwise the newest matching row decides (`rules_settled`, RULES §2); where that row is ours or missing, an
     interrupted submission is finished first, then the cell's run dir is classified (`rules_resume`, §4): a dir
     on disk is worth more than a fresh start; a remedy (`rules_remedy`, §9) or the admission gate
     (`rules_upload`, §14, §5) decides what a finished run dir becomes.
A cell held by any of them with a human's retry request pending is released instead (`rules_retry`, §13): one new
attempt.
Every cell reads one `view.CellView`, built once. Then, for the whole EvalRun (`allocation`, in this order):
cells another EvalRun owns only watch; pinggy leases whose job is over are released; node quarantines are capped;
a cluster whose preflight failed holds every launch (RULES §12); else launches share the free pinggy pairs, the
usable nodes, the back-off, the GPU-hour budget (`spec.budget.maxGpuHours`: a launch that would take spent +
estimated hours past it is held, with the numbers) and the submission budget, in cell order (cells with nothing
observed that wait past the submission budget share one plan, decided once by the same rules); `suspend` turns
every mutation into a hold.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from controller.core.actions import Hold
from controller.core.gpu_hours import GpuEstimate
from controller.core.observed import Observation, TunnelLease
from controller.core.planner.allocation import (
    EFFECT_KINDS,
    Pool,
    allocate,
    deciding,
    effects,
    suspended,
    within_node_cap,
)
from controller.core.planner.cell import plan_cell
from controller.core.planner.fleet import (
    UNTOUCHED,
    ended_leases,
    launch_of,
    owned_elsewhere,
    plan_deletion,
    untouched,
)
from controller.core.planner.gc_pause import cyclic_gc_paused
from controller.core.planner.policy import OVER_BUDGET, PAIR_LOCK, UPLOAD_NOT_VERIFIED, Policy
from controller.core.planner.rules_running import RUNNING_RULES
from controller.core.planner.shards import with_shards
from controller.core.planner.words import ADMISSION_RULES, DIAGNOSED_BY
from controller.core.preflight import Preflight
from controller.core.remedies import Quarantined
from controller.core.types import Cell, EvalRunRef
from controller.core.vocabulary import CellPlan, Plan, Rule

__all__ = [
    "ADMISSION_RULES", "DIAGNOSED_BY", "EFFECT_KINDS", "OVER_BUDGET", "PAIR_LOCK", "RUNNING_RULES", "UNTOUCHED",
    "UPLOAD_NOT_VERIFIED", "Policy", "ended_leases", "launch_of", "owned_elsewhere", "plan", "plan_cell",
    "plan_deletion",
]


def plan(evalrun: EvalRunRef, cells: Sequence[Cell], observations: Sequence[Observation], policy: Policy,
         now: datetime, budget: int | None = None, budget_note: str = OVER_BUDGET,
         tunnel_leases: Sequence[TunnelLease] = (), live_job_names: frozenset[str] | None = None,
         owners: Mapping[str, EvalRunRef] | None = None, quarantined: Sequence[Quarantined] = (),
         estimates: Mapping[str, GpuEstimate] | None = None, usable_nodes: frozenset[str] | None = None,
         preflight: Preflight | None = None) -> Plan:
    """Decide every cell (pending), count what is scarce before any launch (slots), then share it out among the
    launches in cell order (queued): `budget` launches (default the policy's per-pass cap; `budget_note`: why the
    cells past it wait), pinggy pairs (`policy.tunnel_pairs` minus those leased to live jobs or locked), the GPU-hour
    budget; see `allocation`.

    `live_job_names`: every queued or running job on the cluster (None: the queue was not read).
    `owners`: cell key → the OTHER EvalRun that acts for it; such a cell is shown, never acted on (nor are its
    shards: another EvalRun runs the cell).
    `quarantined`: nodes, pairs and cluster launches not to use now (the store's unexpired quarantines).
    `estimates`: cell key → the estimated GPU-hours of one attempt (unknown where missing), for the budget.
    `usable_nodes`: the nodes the cluster's jobs may run on (None: not known), so quarantines never take them all.
    `preflight`: what the cluster's preflight found (None: not run); failed, it holds every launch (RULES §12).
    """
    with cyclic_gc_paused():  # nothing of a plan is cyclic garbage: see gc_pause
        return _plan(evalrun, cells, observations, policy, now, budget, budget_note, tunnel_leases, live_job_names,
                     owners or {}, quarantined, estimates or {}, usable_nodes, preflight)


def _plan(evalrun: EvalRunRef, cells: Sequence[Cell], observations: Sequence[Observation], policy: Policy,
          now: datetime, budget: int | None, budget_note: str, tunnel_leases: Sequence[TunnelLease],
          live_job_names: frozenset[str] | None, owners: Mapping[str, EvalRunRef], quarantined: Sequence[Quarantined],
          estimates: Mapping[str, GpuEstimate], usable_nodes: frozenset[str] | None,
          preflight: Preflight | None) -> Plan:
    leased = {lease.holder: lease.pair for lease in tunnel_leases}
    owners = {**owners, **{c.key: owners[c.shard.parent] for c in cells if c.shard and c.shard.parent in owners}}
    decided: list[CellPlan | Cell] = [  # a Cell: nothing observed, decided with the budget (`allocation`)
        cell if (untouched(cell, obs) and cell.key not in owners) or cell.shards > 1  # a sharded cell: after its shards
        else plan_cell(cell, obs, policy, now, leased, quarantined)
        for cell, obs in zip(cells, observations, strict=True)]
    decided = with_shards(cells, observations, decided, policy, now, leased, quarantined)
    if owners:
        decided = [owned_elsewhere(c, owners[c.cell.key]) if isinstance(c, CellPlan) and c.cell.key in owners
                   else c for c in decided]
    released = ended_leases(evalrun, tunnel_leases, observations, live_job_names) if policy.may_launch else ()
    ours = tuple(q for q in quarantined if q.scope in (str(evalrun), policy.cluster))
    decided = within_node_cap(decided, ours, policy, usable_nodes)
    starting = deciding(evalrun, decided, policy, now)
    pool = Pool.of(evalrun, decided, observations, policy, now, ours, starting,
                   [lease for lease in tunnel_leases if lease not in released], budget, budget_note, estimates,
                   usable_nodes, preflight)
    planned = tuple(allocate(pool, decision) for decision in decided)
    if not policy.may_launch:
        planned = tuple(suspended(cell_plan) for cell_plan in planned)
    held = (preflight.summary if preflight is not None and isinstance(pool.preflight, Hold)
            and any(c.rule == Rule.PREFLIGHT_FAILED for c in planned) else "")
    return Plan(evalrun=evalrun, cells=planned, suspended=policy.suspend, tunnel_releases=released, quarantined=ours,
                estimates=dict(estimates), gpu_budget=pool.gpu, effects=effects(ours, starting, planned),
                preflight=held, walltime=pool.walltime)
