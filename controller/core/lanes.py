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

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from itertools import compress
from operator import attrgetter, not_

from pydantic import Field

from controller.core.actions import Cancel, Hold, Wait
from controller.core.gpu_hours import GpuBudget, GpuEstimate
from controller.core.observed import JobState, Observation, ObservedJob, Submission
from controller.core.placement import ClusterOffer, PlacementPolicy, place, queue_facts
from controller.core.planner import Policy, launch_of, plan
from controller.core.planner.allocation import noted, without_launch
from controller.core.planner.gc_pause import cyclic_gc_paused
from controller.core.preflight import Preflight
from controller.core.records import StoreSnapshot
from controller.core.remedies import CellMemory, QuarantineKind, Spill
from controller.core.types import Cell, ClusterRef, EvalRunRef, Frozen
from controller.core.vocabulary import CellPlan, Phase, Plan, Rule


class ClusterLane(Frozen):
    """One of a multi-cluster EvalRun's clusters: its resolution of the cells that may run there, with its policy
    (RULES §15). The cells' keys are the EvalRun's: a cell is the same cell on every cluster."""

    cluster: ClusterRef
    cells: tuple[Cell, ...] = Field(description="this cluster's resolution of every cell eligible there, spec order")
    policy: Policy
    ineligible: dict[str, str] = Field(default_factory=dict, description="cell key → why it cannot run here, e.g. "
                                                                         "'pinned to a' or 'needs 48:00:00; b allows "
                                                                         "at most 24:00:00'")
    too_long: frozenset[str] = Field(frozenset(), description="of those, the cells whose preset's walltime exceeds the "
                                                              "cluster's maxTimeLimit")


PARTITION_DOWN = frozenset({"PartitionDown", "PartitionInactive"})  # squeue reasons: nothing starts there now


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
    estimates: dict[str, GpuEstimate] = Field(default_factory=dict, description="cell key → what one attempt of it "
                                                                              "costs and takes on this cluster")


class Planned(Frozen):
    """A lane's share of the EvalRun's plan: what its cluster's Actor executes."""

    lane: ClusterLane
    plan: Plan


def plan_lanes(evalrun: EvalRunRef, cells: Sequence[Cell], placement: PlacementPolicy, seen: Sequence[LaneSeen],
               snapshot: StoreSnapshot | None, owners: Mapping[str, EvalRunRef], now: datetime) -> list[Planned]:
    """Each lane's plan: its bound cells (a queued one spilling), the cells placed on it this pass, and the cells it
    probed for. A cell eligible nowhere is in the first lane's cells, with its reason in every lane's `ineligible`."""
    with cyclic_gc_paused():  # as plan(): its lanes' plans, copies and indexes make no cycles (see gc_pause)
        return _plan_lanes(evalrun, cells, placement, seen, snapshot, owners, now)


def _plan_lanes(evalrun: EvalRunRef, cells: Sequence[Cell], placement: PlacementPolicy, seen: Sequence[LaneSeen],
                snapshot: StoreSnapshot | None, owners: Mapping[str, EvalRunRef], now: datetime) -> list[Planned]:
    bound = bind(cells, seen)
    at, eligible, where, moved, unlisted = bound.at, bound.eligible, bound.where, bound.moved, bound.unlisted
    lanes = [_Lane(lane, at[index], moved) for index, lane in enumerate(seen)]
    parts: list[list[Plan]] = [[] for _ in seen]
    if unlisted:
        parts[0].append(_unlisted(evalrun, cells, unlisted, lanes[0]))
    remaining = []
    for index, lane in enumerate(lanes):
        first = lane.plan(evalrun, [k for k, bound in where.items() if bound == index], lane.seen.slots.budget,
                          snapshot, owners, now)
        parts[index].append(first)
        remaining.append(lane.seen.slots.budget - sum(1 for c in first.cells if launch_of(c) is not None))
    offers = cluster_offers(seen, remaining, snapshot, now)
    if placement.spill_after is not None:
        parts = [[_spilling(part, lanes[index], index, offers, eligible, placement.spill_after, now)
                  for part in plans] for index, plans in enumerate(parts)]
    probes = _probes(evalrun, [c for c in cells if c.key not in unlisted], lanes, eligible, where, owners, now)
    order = {cell.key: (cell.key not in moved, index) for index, cell in enumerate(cells)}  # a moved cell first
    wanting = sorted((c.cell.key for probe in probes.values() for c in probe.cells
                      if launch_of(c) is not None and eligible[c.cell.key]), key=order.__getitem__)
    named = {lanes: tuple(offers[i].cluster for i in lanes) for lanes in set(eligible.values())}
    placed = place([(key, named[eligible[key]]) for key in wanting], offers, placement, now)
    names = {offer.cluster: index for index, offer in enumerate(offers)}
    going: list[dict[str, str]] = [{} for _ in seen]
    for key in wanting:
        chosen = placed[key].cluster
        if chosen is not None:
            going[names[chosen]][key] = placed[key].reason
    for index, lane in enumerate(lanes):
        if going[index]:
            then = lane.plan(evalrun, list(going[index]), remaining[index], snapshot, owners, now)
            parts[index].append(then.model_copy(update={"cells": tuple(
                noted(c, going[index][c.cell.key]) if launch_of(c) is not None else c for c in then.cells)}))
    for index, probe in probes.items():
        parts[index].append(probe.model_copy(update={"cells": tuple(
            _waiting(c, placed[c.cell.key].reason if c.cell.key in placed else _nowhere(c.cell.key, seen),
                     bool(eligible[c.cell.key]), seen)
            for c in probe.cells if c.cell.key not in placed or placed[c.cell.key].cluster is None)}))
    return [Planned(lane=lane.lane, plan=merged(evalrun, lane.lane.cells, parts[index]).model_copy(update={
        "clusters": {**(unlisted if index == 0 else {}),
                     **{key: str(lane.lane.cluster) for key, bound in where.items() if bound == index},
                     **{key: str(lane.lane.cluster) for key in going[index]}}})) for index, lane in enumerate(seen)]


class _Lane:
    """A lane's cells and observations by cell key; a moved cell's never-started job travels with it, so the
    cluster it goes to plans it as the cell it is (a run cut before it began: started afresh, RULES §4)."""

    def __init__(self, seen: LaneSeen, at: Mapping[str, int], moved: Mapping[str, tuple[int, ObservedJob]]):
        self.seen, self.at, self.moved = seen, at, moved

    def observation(self, key: str) -> Observation:
        obs = self.seen.observations[self.at[key]]
        if key not in self.moved or obs.jobs is None:
            return obs
        return obs.model_copy(update={"jobs": (*obs.jobs, self.moved[key][1])})

    def plan(self, evalrun: EvalRunRef, keys: Sequence[str], budget: int, snapshot: StoreSnapshot | None,
             owners: Mapping[str, EvalRunRef], now: datetime) -> Plan:
        cells = self.seen.lane.cells
        return _plan(evalrun, self.seen, [cells[self.at[k]] for k in keys], [self.observation(k) for k in keys],
                     budget, snapshot, owners, now)


def plan_lane(evalrun: EvalRunRef, lane: LaneSeen, snapshot: StoreSnapshot | None, owners: Mapping[str, EvalRunRef],
              now: datetime) -> Plan:
    """A one-cluster EvalRun's plan: every cell on its cluster, with its slots."""
    return _plan(evalrun, lane, lane.lane.cells, lane.observations, lane.slots.budget, snapshot, owners, now)


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
                walltime=next((p.walltime for p in plans if p.walltime is not None), None),  # the store's: alike
                clusters={key: name for p in plans for key, name in p.clusters.items()})


@dataclass(frozen=True)
class Binding:
    """Where each of an EvalRun's cells stands before anything is planned: the lanes it may run on and the one it
    is bound to."""

    at: list[dict[str, int]]  # per lane: cell key → its index in the lane's cells and observations
    eligible: dict[str, tuple[int, ...]]  # cell key → the lanes it may run on, in order
    where: dict[str, int | None]  # cell key → the lane it is bound to (None: unbound), in the EvalRun's order
    moved: dict[str, tuple[int, ObservedJob]]  # spilled, never started: the lane it left, its job
    unlisted: dict[str, str]  # its newest job went to this cluster, which the EvalRun no longer lists

    def home(self, key: str) -> int:
        """The lane a cell is bound to, else the first that lists it (every cell is listed by one)."""
        bound = self.where[key]
        return bound if bound is not None else next(i for i, here in enumerate(self.at) if key in here)


def bind(cells: Sequence[Cell], seen: Sequence[LaneSeen]) -> Binding:
    """Each cell's eligible lanes and the lane it is bound to (`_where`). Memory, not arithmetic, is the cost at
    10,000 cells × 5 lanes (`make bench-placement`): lanes listing the same cells share one index, and each lane's
    observations are read once, in order, and only for the cells no earlier lane settled."""
    keys = [cell.key for cell in cells]
    lane_keys = [list(map(_KEY, lane.lane.cells)) for lane in seen]
    at = _indexes(lane_keys)
    allowed = [here.keys() - lane.lane.ineligible.keys() if lane.lane.ineligible else here
               for here, lane in zip(at, seen, strict=True)]
    everywhere, every_lane = _common(allowed), tuple(range(len(seen)))
    eligible = {key: every_lane if key in everywhere else
                tuple(index for index, here in enumerate(allowed) if key in here) for key in keys}
    where, moved, unlisted = _where(keys, lane_keys, seen, at)
    for key, (left, _) in moved.items():
        eligible[key] = tuple(i for i in eligible[key] if i != left) or eligible[key]
    return Binding(at=at, eligible=eligible, where=where, moved=moved, unlisted=unlisted)


def _where(keys: Sequence[str], lane_keys: Sequence[list[str]], seen: Sequence[LaneSeen],
           at: Sequence[Mapping[str, int]]
           ) -> tuple[dict[str, int | None], dict[str, tuple[int, ObservedJob]], dict[str, str]]:
    """The lane each cell has run on: its newest submission's cluster, else the first lane with a job or run dir
    of it; a submission from before clusters were recorded binds it where such evidence is, else to the first lane.
    None: it has run nowhere yet; or its newest job was spilled and accounting shows it ended without starting
    (`moved`: the lane it left, that job); or its newest job went to a cluster the EvalRun no longer lists
    (`unlisted`: that cluster). A cell whose submission names its cluster is settled: no later lane is read."""
    names: dict[str, int] = {}
    for index, lane in enumerate(seen):
        names.setdefault(str(lane.lane.cluster), index)
    where: dict[str, int | None] = dict.fromkeys(keys)
    moved: dict[str, tuple[int, ObservedJob]] = {}
    unlisted: dict[str, str] = {}
    settled: set[str] = set()
    evidence: dict[str, int] = {}
    undated: set[str] = set()
    for index, (here, lane) in enumerate(zip(lane_keys, seen, strict=True)):
        for key, obs in _binding_facts(here, lane.observations, settled).items():
            if obs.jobs or obs.run_dirs:
                evidence.setdefault(key, index)
            if not obs.submissions or key in undated:
                continue
            newest = obs.submissions[0] if len(obs.submissions) == 1 else max(obs.submissions, key=_CREATED)
            if newest.cluster is None:
                undated.add(key)
                continue
            settled.add(key)
            home = names.get(newest.cluster)
            if home is None:
                unlisted[key] = newest.cluster
            elif obs.memory.spill is None:  # the memory is the store's: the same on every lane
                where[key] = home
            elif (job := _spilled(newest, _observation(seen[home], at[home], key))) is not None:
                moved[key] = (home, job)
            else:
                where[key] = home
    for key in evidence.keys() - settled:
        where[key] = evidence[key]
    for key in undated - evidence.keys():
        where[key] = 0
    return where, moved, unlisted


def _indexes(lane_keys: Sequence[list[str]]) -> list[dict[str, int]]:
    """Each lane's cell key → index. Lanes that list the same cells in the same order (no pin, the usual case)
    share one index: comparing the key lists costs little against building the dict again."""
    at: list[dict[str, int]] = []
    for here in lane_keys:
        same = next((at[i] for i, earlier in enumerate(lane_keys[:len(at)]) if earlier == here), None)
        at.append(same if same is not None else dict(zip(here, range(len(here)), strict=True)))
    return at


def _common(allowed: Sequence[Collection[str]]) -> Collection[str]:
    """The cells every lane allows; a shared index (`_indexes`) is intersected once, not once per lane."""
    distinct = list({id(cells): cells for cells in allowed}.values())
    if len(distinct) == 1:
        return distinct[0]
    return set(distinct[0]).intersection(*distinct[1:]) if distinct else set()


_KEY = attrgetter("key")
_CREATED = attrgetter("created_at")
_FACTS = attrgetter("submissions", "jobs", "run_dirs")


def _binding_facts(keys: Sequence[str], observations: Sequence[Observation], settled: set[str]
                   ) -> dict[str, Observation]:
    """A lane's observations that can bind a cell (a submission, a job or a run dir of it), by cell key, less the
    cells already `settled`. Picked out at C speed (`map`, `compress`): 10,000 cells on a lane cost a few ms."""
    if settled:
        unsettled = list(map(not_, map(settled.__contains__, keys)))
        keys, observations = list(compress(keys, unsettled)), list(compress(observations, unsettled))
    something = list(map(any, map(_FACTS, observations)))
    return dict(zip(compress(keys, something), compress(observations, something), strict=True))


def _observation(lane: LaneSeen, at: Mapping[str, int], key: str) -> Observation | None:
    index = at.get(key)
    return lane.observations[index] if index is not None else None


def _unlisted(evalrun: EvalRunRef, cells: Sequence[Cell], unlisted: Mapping[str, str], first: _Lane) -> Plan:
    """Cells whose newest job went to a cluster the EvalRun no longer lists: not observed (RULES §12), never
    started again elsewhere while that job may still run."""
    planned = []
    for cell in cells:
        if cell.key not in unlisted:
            continue
        obs = first.observation(cell.key) if cell.key in first.at else None
        reason = (f"not observed: its newest job went to cluster {unlisted[cell.key]}, which spec.clusters no longer "
                  "lists; add it back to follow that job, or cancel the job there")
        planned.append(CellPlan(cell=cell, phase=Phase.UNKNOWN, actions=(), reason=reason,
                                rule=Rule.OBSERVATION_FAILED, memory=obs.memory if obs else CellMemory()))
    return Plan(evalrun=evalrun, cells=tuple(planned))


def _spilled(newest: Submission, obs: Observation | None) -> ObservedJob | None:
    """The newest submission's job when it was spilled and has ended without starting (accounting says so)."""
    spill = obs.memory.spill if obs is not None else None
    if obs is None or spill is None or spill.job_id != newest.job_id or spill.run_tag != newest.run_tag:
        return None
    job = next((j for j in obs.jobs or () if j.job_id == spill.job_id), None)
    return job if job is not None and not job.state.active and job.started_at is None else None


def _spilling(part: Plan, lane: _Lane, index: int, offers: Sequence[ClusterOffer],
              eligible: Mapping[str, Sequence[int]], after: timedelta, now: datetime) -> Plan:
    """Its bound cells whose job is still queued past `after`, never started, with a free slot on another cluster
    the cell may run on: cancelled, the move remembered first (RULES §15). A job that started is never moved."""
    cells = []
    for cell_plan in part.cells:
        spill = _spill(cell_plan, lane.observation(cell_plan.cell.key), lane, index, offers,
                       eligible[cell_plan.cell.key], after, now) if cell_plan.rule == Rule.QUEUED else None
        cells.append(spill or cell_plan)
    return part.model_copy(update={"cells": tuple(cells)})


def _spill(cell_plan: CellPlan, obs: Observation, lane: _Lane, index: int, offers: Sequence[ClusterOffer],
           eligible: Sequence[int], after: timedelta, now: datetime) -> CellPlan | None:
    job = next((j for j in obs.jobs or () if j.state == JobState.QUEUED), None)
    if job is None or job.started_at is not None or job.submitted_at is None or now - job.submitted_at < after \
            or obs.run_dirs or not obs.submissions:
        return None
    newest = max(obs.submissions, key=lambda s: s.created_at)
    free = [offers[i].cluster for i in eligible if i != index and offers[i].free > 0 and not offers[i].held]
    if newest.job_id != job.job_id or not free:
        return None
    here = str(lane.seen.lane.cluster)
    reason = (f"spill: job {job.job_id} queued {_minutes(now - job.submitted_at)} on {here} without starting "
              f"(placement.spillAfterMinutes {_minutes(after)}); a free slot on {', '.join(free)}: cancel, then "
              "placed anew once accounting shows it never started")
    memory = (cell_plan.remember or cell_plan.memory).model_copy(update={"spill": Spill(
        run_tag=newest.run_tag, job_id=job.job_id, cluster=here, at=now)})
    return cell_plan.model_copy(update={"actions": (Cancel(job_id=job.job_id, reason=reason),), "reason": reason,
                                        "rule": Rule.SPILL, "remember": memory})


def _minutes(span: timedelta) -> str:
    return f"{span.total_seconds() / 60:.0f} min"


def _probes(evalrun: EvalRunRef, cells: Sequence[Cell], lanes: Sequence[_Lane], eligible: Mapping[str, Sequence[int]],
            where: Mapping[str, int | None], owners: Mapping[str, EvalRunRef], now: datetime) -> dict[int, Plan]:
    """Each unbound cell planned as if slots were no object, on the first cluster it may run on that was observed
    (else the first it may run on: it is Unknown there; eligible nowhere: the first cluster, which lists it)."""
    chosen: dict[int, list[str]] = {}
    for cell in cells:
        if where[cell.key] is not None:
            continue
        options = eligible[cell.key] or (0,)
        index = next((i for i in options if not lanes[i].seen.slots.observed), options[0])
        if cell.key in lanes[index].at:
            chosen.setdefault(index, []).append(cell.key)
    return {index: plan(evalrun, [lanes[index].seen.lane.cells[lanes[index].at[k]] for k in keys],
                        [lanes[index].observation(k) for k in keys], _unsized(lanes[index].seen.lane.policy), now,
                        budget=len(keys), owners=owners)
            for index, keys in chosen.items()}


def _unsized(policy: Policy) -> Policy:
    """A probe asks where a cell may go, not for how long: the lane it goes to sizes its job (RULES §16)."""
    if not policy.walltime.auto and not policy.walltime.presets:
        return policy
    return policy.model_copy(update={"walltime": policy.walltime.model_copy(update={"auto": False, "presets": False})})


def _waiting(cell_plan: CellPlan, reason: str, eligible: bool, seen: Sequence[LaneSeen]) -> CellPlan:
    """A probed cell that did not launch: its probe's plan, its launch (if any) replaced by why it waits (no free
    slot) or holds (eligible nowhere: the spec must change)."""
    if launch_of(cell_plan) is None:
        return cell_plan
    if not eligible:
        held = without_launch(cell_plan, Hold(reason=f"{_spec_fix(cell_plan.cell.key, seen)}: {reason}"))
        return noted(held, reason).model_copy(update={"rule": Rule.NO_ELIGIBLE_CLUSTER})
    return without_launch(cell_plan, Wait(reason=reason)).model_copy(update={"rule": Rule.NO_FREE_CLUSTER})


def _spec_fix(key: str, seen: Sequence[LaneSeen]) -> str:
    """What change to the spec lets a cell eligible nowhere run: the EvalRun's clusters or pins, or, where a
    cluster's walltime is what keeps it out, that EvalCluster's maxTimeLimit."""
    short = [str(lane.lane.cluster) for lane in seen if key in lane.lane.too_long]
    raise_limit = f", or raise maxTimeLimit of EvalCluster {', '.join(short)} (if its partition allows)" if short \
        else ""
    return f"fix spec.clusters or spec.placement.pin{raise_limit}"


def _nowhere(key: str, seen: Sequence[LaneSeen]) -> str:
    why = "; ".join(f"{lane.lane.cluster}: {lane.lane.ineligible.get(key, 'not resolved there')}" for lane in seen)
    return f"may run on none of the EvalRun's clusters ({why})"


def cluster_offers(seen: Sequence[LaneSeen], free: Sequence[int], snapshot: StoreSnapshot | None,
                   now: datetime) -> list[ClusterOffer]:
    """Each lane's cluster as placement sees it, with `free` launches left after its bound cells'."""
    return [_offer(lane, slots, snapshot, now) for lane, slots in zip(seen, free, strict=True)]


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
    blocked = next((job.reason for job in lane.slots.jobs if job.state == JobState.QUEUED
                    and job.reason in PARTITION_DOWN), None)
    if blocked is not None:
        return f"partition not taking jobs (our queued jobs there wait: {blocked})"
    name = lane.lane.policy.cluster
    pause = next((q for q in snapshot.quarantined if q.kind == QuarantineKind.CLUSTER and q.scope == name
                  and q.until > now), None) if snapshot else None
    return f"launches backing off until {pause.until:%H:%M} UTC" if pause else ""


def _plan(evalrun: EvalRunRef, lane: LaneSeen, cells: Sequence[Cell], observations: Sequence[Observation],
          budget: int, snapshot: StoreSnapshot | None, owners: Mapping[str, EvalRunRef], now: datetime) -> Plan:
    """`cells` of the lane planned with its slots, its estimates and `budget` launches."""
    slots = lane.slots
    return plan(evalrun, cells, observations, lane.lane.policy, now, budget=budget, budget_note=slots.budget_note,
                tunnel_leases=snapshot.tunnel_leases if snapshot else (), live_job_names=slots.live_job_names,
                owners=owners, quarantined=snapshot.quarantined if snapshot else (), estimates=lane.estimates,
                usable_nodes=slots.usable_nodes, preflight=slots.preflight)
