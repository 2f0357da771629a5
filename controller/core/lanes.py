"""One EvalRun over several clusters (RULES §15), planned by the one-cluster planner once per lane. Pure.

1. bound: a cell that has run on a cluster (a submission recorded there, a job in its queue, a run dir in its jobs
   dir) is planned there, with that cluster's slots, before anything is placed;
2. probe: every other cell is planned once on the first cluster it may run on that was observed, with no slot
   limits: what it would do if it had a slot (most cells: nothing, their row is done; a fresh one: its first job);
3. placed: the ones whose probe launches are placed (`placement.place`) on the slots the bound cells left, and
   planned on that cluster with its slots; the others wait (or, eligible nowhere, hold) with placement's words;
4. one Plan: the lanes' cells back in the EvalRun's order, each lane's part kept for its cluster's Actor.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from pydantic import Field

from controller.core.gpu_hours import GpuBudget, GpuEstimate
from controller.core.observed import Observation, ObservedJob
from controller.core.placement import ClusterOffer, PlacementPolicy, place, queue_facts
from controller.core.planner import Policy, launch_of, plan
from controller.core.planner.allocation import noted, without_launch
from controller.core.preflight import Preflight
from controller.core.records import StoreSnapshot
from controller.core.remedies import QuarantineKind
from controller.core.types import Cell, ClusterRef, EvalRunRef, Frozen
from controller.core.vocabulary import CellPlan, Hold, Plan, Rule, Wait


class ClusterLane(Frozen):
    """One of a multi-cluster EvalRun's clusters: its resolution of the cells that may run there, with its policy
    (RULES §15). The cells' keys are the EvalRun's: a cell is the same cell on every cluster."""

    cluster: ClusterRef
    cells: tuple[Cell, ...] = Field(description="this cluster's resolution of every cell eligible there, spec order")
    policy: Policy
    ineligible: dict[str, str] = Field(default_factory=dict, description="cell key → why it cannot run here, e.g. "
                                                                         "'pinned to a' or 'needs 48:00:00; b allows "
                                                                         "at most 24:00:00'")


class LaneSlots(Frozen):
    """What one cluster's reads this pass allow its lane (from its ClusterView)."""

    budget: int
    budget_note: str
    observed: str = Field("", description="why its queue or run dirs could not be read; '' when both were")
    live_job_names: frozenset[str] | None
    usable_nodes: frozenset[str] | None
    preflight: Preflight | None
    jobs: tuple[ObservedJob, ...] = Field((), description="our jobs in its queue and accounting")


class LaneSeen(Frozen):
    """A lane and its observation of each of its cells (spec order), joined with the store's one read."""

    lane: ClusterLane
    observations: tuple[Observation, ...]
    slots: LaneSlots


class Planned(Frozen):
    """A lane's share of the EvalRun's plan: what its cluster's Actor executes."""

    lane: ClusterLane
    plan: Plan


def plan_lanes(evalrun: EvalRunRef, cells: Sequence[Cell], placement: PlacementPolicy, seen: Sequence[LaneSeen],
               snapshot: StoreSnapshot | None, owners: Mapping[str, EvalRunRef],
               estimates: Mapping[str, GpuEstimate], now: datetime) -> list[Planned]:
    """Each lane's plan: its bound cells, the cells placed on it this pass, and the cells it probed for. A cell
    eligible nowhere is in the first lane's cells, with its reason in every lane's `ineligible`."""
    at = [{cell.key: i for i, cell in enumerate(lane.lane.cells)} for lane in seen]
    eligible = {cell.key: [index for index, lane in enumerate(seen)
                           if cell.key in at[index] and cell.key not in lane.lane.ineligible] for cell in cells}
    where = {cell.key: _bound(cell.key, seen, at) for cell in cells}
    parts: list[list[Plan]] = [[] for _ in seen]
    remaining = []
    for index, lane in enumerate(seen):
        first = _plan(evalrun, lane, [at[index][k] for k, bound in where.items() if bound == index], lane.slots.budget,
                      snapshot, owners, estimates, now)
        parts[index].append(first)
        remaining.append(lane.slots.budget - sum(1 for c in first.cells if launch_of(c) is not None))
    probes = _probes(evalrun, cells, seen, at, eligible, where, owners, now)
    offers = [_offer(lane, remaining[index], snapshot, now) for index, lane in enumerate(seen)]
    order = {cell.key: index for index, cell in enumerate(cells)}
    wanting = sorted((c.cell.key for probe in probes.values() for c in probe.cells
                      if launch_of(c) is not None and eligible[c.cell.key]), key=order.__getitem__)
    placed = place([(key, [offers[i].cluster for i in eligible[key]]) for key in wanting], offers, placement, now)
    names = {offer.cluster: index for index, offer in enumerate(offers)}
    going: list[dict[str, str]] = [{} for _ in seen]
    for key in wanting:
        chosen = placed[key].cluster
        if chosen is not None:
            going[names[chosen]][key] = placed[key].reason
    for index, lane in enumerate(seen):
        if going[index]:
            then = _plan(evalrun, lane, [at[index][key] for key in going[index]], remaining[index], snapshot, owners,
                         estimates, now)
            parts[index].append(then.model_copy(update={"cells": tuple(
                noted(c, going[index][c.cell.key]) if launch_of(c) is not None else c for c in then.cells)}))
    for index, probe in probes.items():
        parts[index].append(probe.model_copy(update={"cells": tuple(
            _waiting(c, placed[c.cell.key].reason if c.cell.key in placed else _nowhere(c.cell.key, seen),
                     bool(eligible[c.cell.key]))
            for c in probe.cells if c.cell.key not in placed or placed[c.cell.key].cluster is None)}))
    return [Planned(lane=lane.lane, plan=merged(evalrun, lane.lane.cells, parts[index]).model_copy(update={
        "clusters": {**{key: str(lane.lane.cluster) for key, bound in where.items() if bound == index},
                     **{key: str(lane.lane.cluster) for key in going[index]}}})) for index, lane in enumerate(seen)]


def plan_lane(evalrun: EvalRunRef, lane: LaneSeen, snapshot: StoreSnapshot | None, owners: Mapping[str, EvalRunRef],
              estimates: Mapping[str, GpuEstimate], now: datetime) -> Plan:
    """A one-cluster EvalRun's plan: every cell on its cluster, with its slots."""
    return _plan(evalrun, lane, None, lane.slots.budget, snapshot, owners, estimates, now)


def merged(evalrun: EvalRunRef, cells: Sequence[Cell], plans: Sequence[Plan]) -> Plan:
    """One Plan of several: their cells in the order of `cells`; quarantines, effects and notes together."""
    order = {cell.key: index for index, cell in enumerate(cells)}
    every = sorted((c for p in plans for c in p.cells), key=lambda c: order.get(c.cell.key, len(order)))
    return Plan(evalrun=evalrun, cells=tuple(every), suspended=any(p.suspended for p in plans),
                tunnel_releases=tuple(t for p in plans for t in p.tunnel_releases),
                quarantined=tuple(dict.fromkeys(q for p in plans for q in p.quarantined)),
                estimates={k: v for p in plans for k, v in p.estimates.items()},
                gpu_budget=plans[0].gpu_budget if plans else GpuBudget(),
                effects=tuple(dict.fromkeys(e for p in plans for e in p.effects)),
                preflight="; ".join(dict.fromkeys(p.preflight for p in plans if p.preflight)),
                clusters={key: name for p in plans for key, name in p.clusters.items()})


def _bound(key: str, seen: Sequence[LaneSeen], at: Sequence[Mapping[str, int]]) -> int | None:
    """The lane a cell has run on: its newest submission's cluster, else where a job or run dir of it is; a
    submission from before clusters were recorded binds it to the first. None: it has run nowhere yet."""
    found = [(index, lane.observations[at[index][key]]) for index, lane in enumerate(seen) if key in at[index]]
    submissions = next((obs.submissions for _, obs in found if obs.submissions), ())
    if submissions:
        newest = max(submissions, key=lambda s: s.created_at).cluster
        by_name = next((index for index, lane in enumerate(seen) if str(lane.lane.cluster) == newest), None)
        if by_name is not None:
            return by_name
    evidence = next((index for index, obs in found if obs.jobs or obs.run_dirs), None)
    return evidence if evidence is not None or not submissions else 0


def _probes(evalrun: EvalRunRef, cells: Sequence[Cell], seen: Sequence[LaneSeen], at: Sequence[Mapping[str, int]],
            eligible: Mapping[str, list[int]], where: Mapping[str, int | None], owners: Mapping[str, EvalRunRef],
            now: datetime) -> dict[int, Plan]:
    """Each unbound cell planned as if slots were no object, on the first cluster it may run on that was observed
    (else the first it may run on: it is Unknown there; eligible nowhere: the first cluster, which lists it)."""
    chosen: dict[int, list[int]] = {}
    for cell in cells:
        if where[cell.key] is not None:
            continue
        options = eligible[cell.key] or [0]
        index = next((i for i in options if not seen[i].slots.observed), options[0])
        if cell.key in at[index]:
            chosen.setdefault(index, []).append(at[index][cell.key])
    return {index: plan(evalrun, [seen[index].lane.cells[i] for i in positions],
                        [seen[index].observations[i] for i in positions], seen[index].lane.policy, now,
                        budget=len(positions), owners=owners)
            for index, positions in chosen.items()}


def _waiting(cell_plan: CellPlan, reason: str, eligible: bool) -> CellPlan:
    """A probed cell that did not launch: its probe's plan, its launch (if any) replaced by why it waits (no free
    slot) or holds (eligible nowhere: the spec must change)."""
    if launch_of(cell_plan) is None:
        return cell_plan
    if not eligible:
        held = without_launch(cell_plan, Hold(reason=f"fix spec.clusters or spec.placement.pin: {reason}"))
        return noted(held, reason).model_copy(update={"rule": Rule.NO_ELIGIBLE_CLUSTER})
    return without_launch(cell_plan, Wait(reason=reason)).model_copy(update={"rule": Rule.NO_FREE_CLUSTER})


def _nowhere(key: str, seen: Sequence[LaneSeen]) -> str:
    why = "; ".join(f"{lane.lane.cluster}: {lane.lane.ineligible.get(key, 'not resolved there')}" for lane in seen)
    return f"may run on none of the EvalRun's clusters ({why})"


def _offer(lane: LaneSeen, free: int, snapshot: StoreSnapshot | None, now: datetime) -> ClusterOffer:
    queued, expected, waited = queue_facts(lane.slots.jobs, now)
    return ClusterOffer(cluster=str(lane.lane.cluster), free=max(free, 0), full=lane.slots.budget_note,
                        held=_held(lane, snapshot, now), queued_ahead=queued, expected_start=expected,
                        recent_wait=waited)


def _held(lane: LaneSeen, snapshot: StoreSnapshot | None, now: datetime) -> str:
    """Why nothing new goes to a cluster this pass, whatever its free slots."""
    if lane.slots.observed:
        return f"not observed ({lane.slots.observed})"
    if lane.slots.preflight is not None and not lane.slots.preflight.ok:
        return "preflight not passed"
    name = lane.lane.policy.cluster
    pause = next((q for q in snapshot.quarantined if q.kind == QuarantineKind.CLUSTER and q.scope == name
                  and q.until > now), None) if snapshot else None
    return f"launches backing off until {pause.until:%H:%M} UTC" if pause else ""


def _plan(evalrun: EvalRunRef, lane: LaneSeen, positions: Sequence[int] | None, budget: int,
          snapshot: StoreSnapshot | None, owners: Mapping[str, EvalRunRef], estimates: Mapping[str, GpuEstimate],
          now: datetime) -> Plan:
    """The lane's cells at `positions` (None: all of them) planned with its slots and `budget` launches."""
    slots = lane.slots
    cells = lane.lane.cells if positions is None else [lane.lane.cells[i] for i in positions]
    observations = lane.observations if positions is None else [lane.observations[i] for i in positions]
    return plan(evalrun, cells, observations,
                lane.lane.policy, now, budget=budget, budget_note=slots.budget_note,
                tunnel_leases=snapshot.tunnel_leases if snapshot else (), live_job_names=slots.live_job_names,
                owners=owners, quarantined=snapshot.quarantined if snapshot else (), estimates=estimates,
                usable_nodes=slots.usable_nodes, preflight=slots.preflight)
