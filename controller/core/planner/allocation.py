"""The allocation: what is scarce, shared out among the cells' launches in cell order, in one fixed order.

1. pending: every cell is decided alone (`plan_cell`); node quarantines are capped (`within_node_cap`);
2. slots: what launches may take is counted once, before any launch (`Pool.of`): free pinggy pairs (minus those
   leased to live jobs or locked), bad nodes, a cluster back-off, the GPU-hour budget, the submission budget;
3. queued: a cluster whose preflight failed holds every launch (`preflight_held`, RULES §12); a first launch whose
   sized request exceeds maxTimeLimit becomes the choice of its shards (`shards_chosen`, RULES §17); else each
   launch, in cell order, passes `LAUNCH_GATES` top to bottom (pinggy pair → a usable node → the back-off → the
   GPU-hour budget → the submission budget); the first that stops it replaces it by its hold or wait, else it takes
   its slots and is placed (its pair, the bad nodes excluded). `suspend` then turns every mutation into a hold.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from controller.core.actions import Action, Cancel, Hold, Launch, Mutation, Quarantine, Resume, Submit, Wait
from controller.core.gpu_hours import UNKNOWN, GpuBudget, GpuEstimate, launch_cost, remaining_share
from controller.core.observed import Observation, TunnelLease
from controller.core.planner.budget import gpu_budget, gpu_hold, prior_hours
from controller.core.planner.cell import plan_cell
from controller.core.planner.fleet import UNTOUCHED, launch_of
from controller.core.planner.policy import Policy
from controller.core.preflight import Preflight
from controller.core.remedies import Quarantined, QuarantineKind, RemedyKind, ShardChoice
from controller.core.types import Cell, EvalRunRef
from controller.core.vocabulary import CellPlan, Effect, EffectKind, Rule
from controller.core.walltime import (
    Learning,
    Sized,
    WallEstimate,
    clock,
    hours_text,
    shards_needed,
    sized,
    unclamped_request,
)


@dataclass
class Pool:
    """The slots of one plan, taken by its launches in cell order."""

    policy: Policy
    now: datetime
    estimates: Mapping[str, GpuEstimate]
    holders: dict[str, str]  # pair → the submission holding it
    locked: set[str]  # pairs the pinggy server holds
    bad_nodes: tuple[str, ...]
    preflight: Action | None  # the cluster's preflight failed (hold) or could not run (wait)
    nowhere: Hold | None  # every usable node quarantined
    paused: Wait | None  # the cluster's launches back off
    over_budget: Wait
    remaining: int  # submissions left this pass
    gpu: GpuBudget
    probing: set[str]  # groups whose cost a probe launch is measuring
    walltime: Learning | None  # walltime auto: what the sized jobs ran against their estimate, the margin it gives
    untouched_waits: CellPlan | None = field(default=None)  # fresh cells past the budget: their one plan

    @classmethod
    def of(cls, evalrun: EvalRunRef, decided: Sequence[CellPlan | Cell], observations: Sequence[Observation],
           policy: Policy, now: datetime, live: Sequence[Quarantined], deciding: Sequence[Quarantined],
           leases: Sequence[TunnelLease], budget: int | None, budget_note: str,
           estimates: Mapping[str, GpuEstimate], usable_nodes: frozenset[str] | None,
           preflight: Preflight | None) -> Pool:
        """The slots before any launch. What this very plan quarantines counts for its own launches (a refire must
        not go back to the bad node)."""
        every = (*live, *deciding)
        bad_nodes = tuple(sorted({q.name for q in every if q.kind == QuarantineKind.NODE}))
        backing_off = next((q for q in every if q.kind == QuarantineKind.CLUSTER), None)
        gpu, probing = gpu_budget(evalrun, decided, observations, policy, estimates)
        return cls(policy=policy, now=now, estimates=estimates,
                   walltime=policy.walltime.learnt,
                   holders={lease.pair: lease.holder for lease in leases},
                   locked={q.name for q in every if q.kind == QuarantineKind.PAIR}, bad_nodes=bad_nodes,
                   preflight=preflight_block(preflight),
                   nowhere=no_usable_node(policy.cluster, bad_nodes, usable_nodes),
                   paused=None if backing_off is None else Wait(
                       reason=f"launches on {policy.cluster} back off until {backing_off.until:%H:%M} UTC: "
                              f"{backing_off.reason}"),
                   over_budget=Wait(reason=budget_note),
                   remaining=policy.max_submissions_per_pass if budget is None else budget, gpu=gpu, probing=probing)


@dataclass(slots=True)
class Ticket:
    """One launch asking for its slots."""

    cell_plan: CellPlan
    launch: Launch
    pair: str | None
    estimate: GpuEstimate
    cost: float | None


def pinggy_pair(pool: Pool, t: Ticket) -> Action | None:
    return no_pair(pool) if t.cell_plan.cell.needs_pinggy and t.pair is None else None


def usable_node(pool: Pool, t: Ticket) -> Action | None:
    return pool.nowhere


def back_off(pool: Pool, t: Ticket) -> Action | None:
    return pool.paused if pool.paused is not None and not answers_back_off(t.cell_plan) else None


def gpu_hours(pool: Pool, t: Ticket) -> Action | None:
    """spec.budget.maxGpuHours: a launch that would take spent + estimated hours past it is held, with the numbers."""
    held = gpu_hold(pool.gpu, t.cost, t.estimate, pool.probing)
    if held is None:
        return None
    pool.gpu = pool.gpu.model_copy(update={"held": pool.gpu.held + 1})
    return Hold(reason=held)


def submissions(pool: Pool, t: Ticket) -> Action | None:
    return pool.over_budget if pool.remaining <= 0 else None  # one Wait for all: 10,000 cells wait alike


LAUNCH_GATES: tuple[Callable[[Pool, Ticket], Action | None], ...] = (
    pinggy_pair,  # needs a pair, none free           → wait (or hold: no pairs at all)
    usable_node,  # every usable node quarantined     → hold
    back_off,     # the cluster backs off              → wait (a refire that answers it passes)
    gpu_hours,    # past spec.budget.maxGpuHours       → hold
    submissions,  # past the submission budget         → wait
)


def allocate(pool: Pool, decision: CellPlan | Cell) -> CellPlan:
    """One cell's share: its launch through `LAUNCH_GATES`, or placed with the slots it takes."""
    cell_plan = untouched_plan(pool, decision) if type(decision) is Cell else decision  # exact: see launch_of
    launch = launch_of(cell_plan)
    return cell_plan if launch is None else admit_launch(pool, cell_plan, launch)


def untouched_plan(pool: Pool, cell: Cell) -> CellPlan:
    """A cell with nothing observed: past a block, 10,000 fresh cells share one plan, decided once."""
    blocked = pool.preflight or pool.nowhere or pool.paused or (pool.over_budget if pool.remaining <= 0 else None)
    if blocked is None:
        return plan_cell(cell, UNTOUCHED, pool.policy, pool.now)
    if pool.untouched_waits is None:
        fresh = plan_cell(cell, UNTOUCHED, pool.policy, pool.now)
        pool.untouched_waits = (preflight_held(fresh, blocked, pool.policy.cluster) if blocked is pool.preflight
                                else without_launch(fresh, blocked))
    return pool.untouched_waits.model_copy(update={"cell": cell})


def admit_launch(pool: Pool, cell_plan: CellPlan, launch: Launch) -> CellPlan:
    cell, policy = cell_plan.cell, pool.policy
    if pool.preflight is not None:
        return preflight_held(cell_plan, pool.preflight, policy.cluster)
    estimate = pool.estimates.get(cell.key, UNKNOWN)
    cost = launch_cost(estimate, cell_plan.run_dir, resume=isinstance(launch, Resume))
    if (sharding := shards_chosen(cell_plan, launch, estimate.wall, policy, pool.now)) is not None:
        # the GPU-hour budget judges the whole benchmark first: shards it cannot all pay must not spend part of it
        held = gpu_hours(pool, Ticket(cell_plan=cell_plan, launch=launch, pair=None, estimate=estimate, cost=cost))
        return sharding if held is None else without_launch(cell_plan, held)
    ticket = Ticket(cell_plan=cell_plan, launch=launch, pair=pair_for(launch, pool) if cell.needs_pinggy else None,
                    estimate=estimate, cost=cost)
    for gate in LAUNCH_GATES:
        instead = gate(pool, ticket)
        if instead is not None:
            return without_launch(cell_plan, instead)
    pool.remaining -= 1
    cost = ticket.cost
    if cost is None and pool.gpu.max_hours is not None:  # the first of its group: it measures the cost
        cost = prior_hours(cell, policy)
        pool.probing.add(estimate.group)
        cell_plan = noted(cell_plan, f"GPU-hour probe for {estimate.group}: no estimate yet, counted "
                                     f"as its walltime × GPUs ({cost:.3g} GPU-h) until it reports")
    pool.gpu = pool.gpu.model_copy(update={"committed": pool.gpu.committed + (cost or 0.0),
                                           "unestimated": pool.gpu.unestimated + (estimate.hours is None)})
    if ticket.pair is not None:
        pool.holders[ticket.pair] = launch.submission_name
    left = remaining_share(cell_plan.run_dir, resume=isinstance(launch, Resume))
    walltime = sized(estimate.wall, left, policy.walltime, cell.time_limit, cell.walltime_auto)
    if walltime is not None:
        cell_plan = noted(cell_plan, walltime.note)
    return placed(cell_plan, launch, ticket.pair, pool.bad_nodes, walltime)


def shards_chosen(cell_plan: CellPlan, launch: Launch, estimate: WallEstimate | None, policy: Policy,
                  now: datetime) -> CellPlan | None:
    """RULES §17 `ShardsChosen`: the first launch of a cell that may shard, whose sized request would exceed
    maxTimeLimit, becomes the choice of its shards, remembered with the cell; the next pass runs it as them. Before
    the launch gates: a choice takes no submission or GPU-hour budget. A cell whose choice this pass did not read
    (a plan made without the store) waits rather than run unsharded."""
    cell, walltime = cell_plan.cell, policy.walltime
    if not cell.may_shard or cell.shards > 1 or cell.tasks is None or cell_plan.run_dir is not None:
        return None
    if (chosen := cell_plan.memory.shards) is not None:
        return without_launch(cell_plan, Wait(reason=f"its estimate chose {chosen.count} shards; a pass that reads "
                                                      "the controller state runs them"))
    first = type(launch) is Submit and launch.attempt == 1 and launch.intent_at is None
    if not (first and (walltime.auto or (cell.walltime_auto and walltime.presets))):
        return None
    if estimate is None or (count := shards_needed(estimate, walltime, cell.tasks)) is None:
        return None
    whole, _ = unclamped_request(estimate, 1.0, walltime)
    cause = (f"one job would ask {clock(whole)} (p90 {hours_text(estimate.high_hours)} × {walltime.margin:.3g}, "
             f"with its start and cancel), more than maxTimeLimit {clock(int(walltime.maximum.total_seconds()))}; "
             f"from {estimate.basis}")
    reason = f"runs as {count} shards of at most {-(-cell.tasks // count)} tasks, each its own job sized for its " \
             f"share: {cause}"
    choice = ShardChoice(count=count, reason=cause, at=now)
    memory = (cell_plan.remember or cell_plan.memory).model_copy(update={"shards": choice})
    return without_launch(cell_plan, Wait(reason=f"{reason}; chosen once, kept with the cell")).model_copy(
        update={"rule": Rule.SHARDS_CHOSEN, "reason": reason, "remember": memory})


def preflight_block(preflight: Preflight | None) -> Action | None:
    """What a launch on the cluster becomes while its preflight is not passed: a hold until a human fixes what it
    found, a wait while it could not run (never a launch on what could not be checked); None: launches go."""
    if preflight is None or preflight.ok:
        return None
    return Hold(reason=preflight.summary) if preflight.failures else Wait(reason=preflight.summary)


def preflight_held(cell_plan: CellPlan, instead: Action, cluster: str) -> CellPlan:
    """The launch replaced (RULES §12 `PreflightFailed`): the reason says what the preflight found, the action how
    long it holds."""
    until = "its preflight passes" if isinstance(instead, Hold) else "its preflight can run"
    held = without_launch(cell_plan, instead.model_copy(update={"reason": f"no launch on {cluster} until {until}"}))
    return noted(held.model_copy(update={"rule": Rule.PREFLIGHT_FAILED}), instead.reason)


def answers_back_off(cell_plan: CellPlan) -> bool:
    """The refire of a failure that backed the cluster off: the pause it started never blocks it."""
    memory = cell_plan.remember or cell_plan.memory
    remedy = memory.remedies[-1] if memory.remedies else None
    return cell_plan.rule == Rule.REFIRE and remedy is not None and remedy.kind == RemedyKind.BACK_OFF


def within_node_cap(decided: list[CellPlan | Cell], live: Sequence[Quarantined], policy: Policy,
                    usable: frozenset[str] | None) -> list[CellPlan | Cell]:
    """New node quarantines, in cell order, while the cluster has fewer than `health.maxQuarantinedNodes` and at
    least one usable node would stay; past that the refire still goes elsewhere-or-anywhere, without excluding."""
    nodes = {q.name for q in live if q.kind == QuarantineKind.NODE and q.scope == policy.cluster}
    kept: list[CellPlan | Cell] = []
    for decision in decided:
        if type(decision) is Cell or not quarantines_node(decision):  # exact classes: see launch_of
            kept.append(decision)
            continue
        actions: list[Action] = []
        skipped = []
        for action in decision.actions:
            if not (isinstance(action, Quarantine) and action.subject == QuarantineKind.NODE) or action.name in nodes:
                actions.append(action)
            elif len(nodes) >= policy.health.max_quarantined_nodes:
                skipped.append(f"node {action.name} not quarantined: {len(nodes)} already "
                               f"(health.maxQuarantinedNodes {policy.health.max_quarantined_nodes})")
            elif usable is not None and usable <= nodes | {action.name}:
                skipped.append(f"node {action.name} not quarantined: it is the last usable node of "
                               f"{policy.cluster}")
            else:
                nodes.add(action.name)
                actions.append(action)
        kept.append(decision.model_copy(update={"actions": tuple(actions)}) if not skipped else
                    noted(decision.model_copy(update={"actions": tuple(actions)}), "; ".join(skipped)))
    return kept


def quarantines_node(cell_plan: CellPlan) -> bool:
    for action in cell_plan.actions:
        if type(action) is Quarantine and action.subject == QuarantineKind.NODE:  # exact: see launch_of
            return True
    return False


def no_usable_node(cluster: str, bad_nodes: Sequence[str], usable: frozenset[str] | None) -> Hold | None:
    """Every node the cluster's jobs may use is quarantined: a launch would only wait on BadConstraints."""
    if not usable or not usable <= set(bad_nodes):
        return None
    node = next(iter(usable)) if len(usable) == 1 else "NODE"
    return Hold(reason=f"every usable node of {cluster} is quarantined ({', '.join(sorted(usable))}): release one "
                       "(evalctl nodes release), or wait for the quarantines to end",
                release=f"evalctl nodes release {node} --cluster {cluster}")


def deciding(evalrun: EvalRunRef, decided: Sequence[CellPlan | Cell], policy: Policy,
             now: datetime) -> list[Quarantined]:
    """The quarantines this plan starts, of this EvalRun or its cluster, as the store will hold them."""
    return [q for c in decided if type(c) is CellPlan for a in c.actions if type(a) is Quarantine  # see launch_of
            if (q := as_quarantined(a, now)).scope in (str(evalrun), policy.cluster)]


def as_quarantined(action: Quarantine, now: datetime) -> Quarantined:
    return Quarantined(kind=action.subject, scope=action.scope, name=action.name, reason=action.reason,
                       until=now + timedelta(seconds=action.ttl_s), since=now, owner=action.owner)


def pair_for(launch: Launch, pool: Pool) -> str | None:
    """The pair this submission already holds (a repaired submission), else the first free one that is not locked."""
    pairs, holders = pool.policy.tunnel_pairs, pool.holders
    own = next((pair for pair, held_by in holders.items() if held_by == launch.submission_name and pair in pairs),
               None)
    return own or next((pair for pair in pairs if pair not in holders and pair not in pool.locked), None)


def no_pair(pool: Pool) -> Action:
    pairs = pool.policy.tunnel_pairs
    if not pairs:
        return Hold(reason="installed-agent harness needs a pinggy pair; add spec.pinggy.pairs to the EvalRun")
    busy = sum(1 for pair in pairs if pair in pool.holders)
    held = sum(1 for pair in pairs if pair in pool.locked and pair not in pool.holders)
    return Wait(reason=f"waiting for a free pinggy pair ({busy} of {len(pairs)} in use by running jobs"
                       + (f", {held} locked on the pinggy server" if held else "") + ")")


def without_launch(cell_plan: CellPlan, instead: Action) -> CellPlan:
    """Keep the cell's phase; replace its launch (and the cancel that only made room for it) by `instead`."""
    kept = [a for a in cell_plan.actions if not isinstance(a, Submit | Resume)
            and not (isinstance(a, Cancel) and a.clears_way_for_launch)]
    return cell_plan.model_copy(update={"actions": (*kept, instead)})


def placed(cell_plan: CellPlan, launch: Launch, pair: str | None, bad_nodes: tuple[str, ...],
           walltime: Sized | None) -> CellPlan:
    """The launch with the pinggy pair it was given, the cluster's bad nodes excluded and its sized --time."""
    launched = launch.model_copy(update={
        "tunnel": pair or launch.tunnel, "exclude_nodes": bad_nodes,
        "time_limit": walltime.time_limit if walltime else None,
        "estimated_hours": walltime.estimated_hours if walltime else None})
    actions = tuple(launched if a is launch else a for a in cell_plan.actions)
    return cell_plan.model_copy(update={"actions": actions})


def suspended(cell_plan: CellPlan) -> CellPlan:
    """`spec.suspend`: the plan as it would be, every mutation a hold and no bookkeeping written (nor a choice of
    shards: the estimate when it resumes chooses)."""
    if cell_plan.rule == Rule.SHARDS_CHOSEN:
        chosen = Hold(reason=f"suspended; would choose: {cell_plan.reason}")
        return cell_plan.model_copy(update={"actions": (chosen,), "row_updates": (), "remember": None})
    held = tuple(Hold(reason=f"suspended; would {a.render()}") if isinstance(a, Mutation) else a
                 for a in cell_plan.actions)
    return cell_plan.model_copy(update={"actions": held, "row_updates": ()})


def noted(cell_plan: CellPlan, note: str) -> CellPlan:
    return cell_plan.model_copy(update={"reason": f"{cell_plan.reason}; {note}"})


EFFECT_KINDS: dict[QuarantineKind, EffectKind] = {
    QuarantineKind.CLUSTER: "back-off", QuarantineKind.NODE: "node", QuarantineKind.PAIR: "pinggy-pair"}


def effects(live: Sequence[Quarantined], deciding: Sequence[Quarantined],
            planned: Sequence[CellPlan]) -> tuple[Effect, ...]:
    """The remedies in force for `status` and `explain`: the store's quarantines, the ones this plan starts, and
    refires waiting out their back-off."""
    found: dict[tuple[str, str], Effect] = {}
    for q in (*live, *deciding):
        found.setdefault((q.kind.value, q.name), Effect(
            kind=EFFECT_KINDS[q.kind], subject=q.name, cause=q.reason, since=q.since, until=q.until,
            owner=q.owner))
    refires = tuple(Effect(kind="refire", subject=c.cell.label, cause=remedy.diagnosis, since=remedy.at,
                           until=c.refire_due, owner=str(c.cell.evalrun))
                    for c in planned if c.refire_due is not None
                    for remedy in (c.remember or c.memory).remedies[-1:])
    return (*found.values(), *refires)
