"""One reconcile pass: observe → plan → act → summarize, as a short flat sequence of named steps.

Each source is read once per pass (the scheduler and run dirs once per cluster, the store once per
EvalRun). A source that fails to read makes its cells Unknown; the planner then does nothing for
them. Acting needs the EvalRun's lease and its claims on its cells, both taken before planning, so the
plan that is printed is the plan that is executed: a second reconciler that runs at the same time only plans.
"""

from __future__ import annotations

import functools
import logging
import threading
import uuid
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import TypeVar

from pydantic import Field

from controller.core.actor import kill_point
from controller.core.cluster_view import FIXES, ClusterPorts, ClusterView, Source, Unobserved, read_source
from controller.core.gpu_hours import estimates
from controller.core.lanes import ClusterLane, LaneSeen, LaneSlots, Planned, bind, merged, plan_lane, plan_lanes
from controller.core.match import join_cells
from controller.core.notify import DeliveryState, facts, undelivered_note
from controller.core.observed import JobState, Observation, ObservedJob
from controller.core.planner import plan_deletion
from controller.core.ports import (
    JobsDirMissing,
    ObservationError,
    OutputCursor,
    Scheduler,
    StoreUnavailable,
    WriteRefused,
)
from controller.core.records import StoreSnapshot
from controller.core.run_target import RunTarget
from controller.core.status import RunStatus, summarize
from controller.core.store import CELL_OWNER_TTL, Store
from controller.core.types import RUN_TAG_PREFIX, ClusterRef, EvalRunRef, Frozen
from controller.core.vocabulary import Outcome, PassNotes, Plan, Rule
from controller.core.walltime import Learning, learned_from

log = logging.getLogger("evalctl.reconcile")
T = TypeVar("T")
LEASE_TTL = timedelta(minutes=10)


def evalrun_lease_name(evalrun: EvalRunRef) -> str:
    """The lease one acting pass of an EvalRun holds: two processes never act on it at once."""
    return f"evalrun/{evalrun}"


def launch_lease_name(cluster: ClusterRef) -> str:
    """The lease a launching pass holds on its cluster, taken before the queue is read (maxLiveJobs)."""
    return f"launch/{cluster}"


class PassResult(Frozen):
    evalrun: EvalRunRef
    plan: Plan = Field(description="the planner's output, as it planned it")
    notes: PassNotes = Field(PassNotes(), description="what the pass adds beside it: the selector's intake and the "
                                                      "notifications still undelivered")
    status: RunStatus
    outcomes: tuple[Outcome, ...] = ()
    acted: bool = False
    note: str = ""
    blocked: bool = Field(False, description="it should have acted but the store refused (a pass that failed)")
    unobserved: tuple[Unobserved, ...] = Field((), description="the sources this pass could not read")
    run_tags: tuple[str, ...] = Field((), description="the run tags of its cells' own run dirs this pass saw")


class Observed(Frozen):
    """What one EvalRun's pass saw: the store, and every cell's share of the three sources."""

    snapshot: StoreSnapshot | None = Field(description="None: the store could not be read")
    cells: tuple[Observation, ...]
    unobserved: tuple[Unobserved, ...] = ()


def other_owners(snapshot: StoreSnapshot | None, evalrun: EvalRunRef) -> dict[str, EvalRunRef]:
    """Cells another EvalRun claimed and still renews (by the store's clock): this one only watches them."""
    if snapshot is None:
        return {}
    return {o.cell_key: o.evalrun for o in snapshot.cell_owners if o.evalrun != evalrun}


class Acting(Frozen):
    """Whether this pass acts for the EvalRun, and the owners of its cells it plans with."""

    granted: bool
    owners: dict[str, EvalRunRef] = Field(description="cell key → the OTHER EvalRun that acts for it")
    note: str = ""
    blocked: bool = False


def reconcile_pass(
    targets: Sequence[RunTarget],
    store: Store,
    clusters: dict[ClusterRef, ClusterPorts],
    now: datetime,
    *,
    act: bool,
    holder: str = "",
    holder_is_dead: Callable[[str], bool] = lambda _: False,
    lease_ttl: timedelta = LEASE_TTL,
) -> list[PassResult]:
    """One pass over every target; acting needs the EvalRun's lease for `holder`, held at most `lease_ttl`
    by a reconciler that died without releasing it.

    A lease whose holder `holder_is_dead` says has died (a killed reconciler on this host) is taken over.
    The clusters' submission budgets are shared by their EvalRuns, in the order of `targets`.
    """
    views: dict[ClusterRef, ClusterView] = {}
    stems: dict[ClusterRef, set[str]] = defaultdict(set)  # the run dirs a cluster's EvalRuns here can own
    for target in targets:
        for lane in lanes_of(target):  # a cell's run dir may be on any cluster of its EvalRun
            stems[lane.cluster].update(stem for cell in target.cells for stem in cell.tag_stems)
    launcher = f"{holder}#{uuid.uuid4().hex[:12]}"  # this pass: another pass of this process is another launcher
    launch_leases: list[str] = []
    with _LAUNCHERS_GUARD:
        _LAUNCHERS.add(launcher)
    results = []
    try:
        for target in targets:
            for lane in lanes_of(target):
                if lane.cluster not in views:  # the caps are cluster fields: the same for every run on it
                    not_launching = None
                    if act and lane.policy.may_launch:
                        launch_lease = launch_lease_name(lane.cluster)
                        not_launching = _launch_lease(store, launch_lease, launcher, holder_is_dead, lease_ttl)
                        if not_launching is None:
                            launch_leases.append(launch_lease)
                    views[lane.cluster] = ClusterView(clusters[lane.cluster], lane.policy, now,
                                                      frozenset(stems[lane.cluster]), not_launching)
            results.append(_target_pass(target, store, clusters, views, now, act, holder, holder_is_dead, lease_ttl))
    finally:
        for launch_lease in launch_leases:
            _release(store, launch_lease, launcher)
        with _LAUNCHERS_GUARD:
            _LAUNCHERS.discard(launcher)
    return results


def lanes_of(target: RunTarget) -> tuple[ClusterLane, ...]:
    """Its clusters' lanes; a one-cluster EvalRun is one lane of its own cells."""
    return target.lanes or (ClusterLane.model_construct(cluster=target.cluster, cells=target.cells,
                                                        policy=target.policy, ineligible={}),)


def _target_pass(target: RunTarget, store: Store, clusters: dict[ClusterRef, ClusterPorts],
                 views: dict[ClusterRef, ClusterView], now: datetime, act: bool, holder: str,
                 holder_is_dead: Callable[[str], bool], lease_ttl: timedelta) -> PassResult:
    """One EvalRun's share of the pass: observe, take its lease, plan each lane within its cluster's budget, act."""
    read = _store_read(target, store)
    snapshot = None if isinstance(read, ObservationError) else read
    seen = [_lane_seen(lane, read, views[lane.cluster], clusters[lane.cluster].scheduler) for lane in lanes_of(target)]
    acting = _acting(target, store, snapshot, act, holder, holder_is_dead, lease_ttl)
    lease = evalrun_lease_name(target.evalrun)
    try:
        sizes = target.policy.walltime.auto or any(cell.walltime_auto for cell in target.cells)
        learnt = learned_from(snapshot.submissions, target.evalrun) \
            if snapshot is not None and sizes else None  # once: the store's, alike on every lane
        planning = [_for_planning(lane, snapshot, views[lane.lane.cluster], learnt) for lane, _ in seen]
        if target.lanes and target.placement is not None:
            planned = plan_lanes(target.evalrun, target.cells, target.placement, planning, snapshot, acting.owners,
                                 now)
        else:
            planned = [Planned(lane=lane.lane, plan=plan_lane(target.evalrun, lane, snapshot, acting.owners, now))
                       for lane in planning]
        for part in planned:
            views[part.lane.cluster].spend(part.plan)
        outcomes = tuple(outcome for part in planned for outcome in clusters[part.lane.cluster].actor_for(
            _lane_target(target, part.lane)).act(part.plan)) if acting.granted else ()
        the_plan = planned[0].plan if len(planned) == 1 else merged(target.evalrun, target.cells,
                                                                      [part.plan for part in planned])
        notes = PassNotes(selections=target.selections, intake=target.intake,
                          notifications=_notifications(target, store, the_plan, outcomes, acting.granted))
    finally:
        if acting.granted:
            _release(store, lease, holder)
    store_unobserved = (Unobserved.of("store", read),) if isinstance(read, ObservationError) else ()
    return PassResult(evalrun=target.evalrun, plan=the_plan, notes=notes, outcomes=outcomes, acted=acting.granted,
                      status=summarize(the_plan, outcomes, target.generation, notes), note=acting.note,
                      blocked=acting.blocked,
                      unobserved=(*store_unobserved, *(u for _, lane_unobserved in seen for u in lane_unobserved),
                                  *(u for part in planned for u in _unreadable(part))),
                      run_tags=tuple(sorted({d.run_tag for lane, _ in seen for o in lane.observations
                                             for d in o.run_dirs or () if d.run_tag.startswith(RUN_TAG_PREFIX)})))


def _lane_target(target: RunTarget, lane: ClusterLane) -> RunTarget:
    """The EvalRun as one lane's Actor sees it: that cluster, its cells and policy."""
    if not target.lanes:
        return target
    return target.model_copy(update={"cluster": lane.cluster, "cells": lane.cells, "policy": lane.policy,
                                     "lanes": ()})


def _for_planning(seen: LaneSeen, snapshot: StoreSnapshot | None, view: ClusterView,
                  learnt: Learning | None) -> LaneSeen:
    """A lane with what planning it needs beyond its observations: its cells' estimates from its own cluster's
    evidence (gpusPerJob, run dirs and jobs are the cluster's), and what the EvalRun's sized jobs taught (RULES
    §16)."""
    lane, policy = seen.lane, seen.lane.policy
    if learnt is not None:
        lane = lane.model_copy(update={"policy": policy.model_copy(update={
            "walltime": policy.walltime.model_copy(update={"learnt": learnt})})})
    found = estimates(lane.cells, snapshot.gpu_history if snapshot else (),
                      () if isinstance(view.dirs, ObservationError) else view.dirs, policy.size_bands,
                      policy.gpus_per_job, () if isinstance(view.jobs, ObservationError) else view.jobs)
    return seen.model_copy(update={"lane": lane, "estimates": found})


def _unreadable(part: Planned) -> tuple[Unobserved, ...]:
    """The run dirs that could not be read, each a cause (rule RunDirUnreadable: its cell is Unknown)."""
    return tuple(Unobserved(source="run dirs", cluster=str(part.lane.cluster),
                            cause=c.reason.removeprefix("not observed: "), fix=FIXES["run dirs"])
                 for c in part.plan.cells if c.rule == Rule.RUN_DIR_UNREADABLE)


def _notifications(target: RunTarget, store: Store, the_plan: Plan, outcomes: Sequence[Outcome], acting: bool) -> str:
    """An acting pass records its transitions and queues their messages while it holds the EvalRun's lease, so
    passes record in the order they observed; every pass reads what is still undelivered, for status (in words).
    Sending is not the pass's: the entry layer's notifier does it. A store that refuses costs this pass's note,
    never the pass: a transition that still holds is recorded by the next one."""
    if not target.notify:
        return ""
    try:
        if acting:
            found = facts(the_plan, summarize(the_plan, outcomes, target.generation))
            undelivered = store.state.record_transitions(target.evalrun, found, target.notify)
            if any(n.state == DeliveryState.PENDING and not n.attempts and n.claimed_by is None for n in undelivered):
                kill_point("notify-recorded")  # fault injection: queued, and no sender has it yet
        else:
            undelivered = store.state.read_notifications(target.evalrun)
    except (StoreUnavailable, ObservationError, WriteRefused) as exc:
        log.warning("notifications not recorded", extra={"evalrun": str(target.evalrun), "error": str(exc)})
        return f"notifications not recorded this pass: {exc}"
    return undelivered_note(undelivered)


def release_pass(target: RunTarget, store: Store, clusters: Mapping[ClusterRef, ClusterPorts]) -> list[Outcome]:
    """The EvalRun is being deleted. With `policy.cancels_on_delete`, cancel the live jobs of the cells it owns, as
    a plan each of its clusters' Actor executes there; then drop its claims on its cells.

    Raises ObservationError when a queue or the store cannot be read (never "no jobs" by default; every queue is read
    before any cancel) and RuntimeError when a cancel failed, so the caller tries again before letting the EvalRun go.
    """
    outcomes: list[Outcome] = []
    if target.policy.cancels_on_delete:
        jobs = [(lane, clusters[lane.cluster].scheduler.observe()) for lane in lanes_of(target)]
        snapshot = store.observe(target.evalrun, _models(target), _benchmarks(target), _read_keys(target))
        others = other_owners(snapshot, target.evalrun)
        for lane, queue in jobs:
            the_plan = plan_deletion(target.evalrun, lane.cells, join_cells(lane.cells, snapshot, queue, ()), others)
            outcomes += clusters[lane.cluster].actor_for(_lane_target(target, lane)).act(the_plan)
        failed = [f"{o.cell}: {o.message}" for o in outcomes if not o.ok]
        if failed:
            raise RuntimeError(f"could not cancel every job: {'; '.join(failed)}")
    store.state.claim_cells(target.evalrun, [], CELL_OWNER_TTL.total_seconds())
    return outcomes


def observe(target: RunTarget, store: Store, views: Mapping[ClusterRef, ClusterView],
            clusters: Mapping[ClusterRef, ClusterPorts]) -> Observed:
    """The store (one read for the EvalRun) joined with its clusters' reads: one Observation per cell of the target,
    from the cluster it is bound to (several clusters, RULES §15; an unbound cell: the first that lists it), with
    what its running jobs printed since the last pass (one more read, from the offsets the cells remember)."""
    read = _store_read(target, store)
    seen = [_lane_seen(lane, read, views[lane.cluster], clusters[lane.cluster].scheduler) for lane in lanes_of(target)]
    store_unobserved = (Unobserved.of("store", read),) if isinstance(read, ObservationError) else ()
    if target.lanes:
        binding = bind(target.cells, [lane for lane, _ in seen])
        homes = [binding.home(cell.key) for cell in target.cells]
        cells = tuple(seen[home][0].observations[binding.at[home][cell.key]]
                      for home, cell in zip(homes, target.cells, strict=True))
    else:
        cells = seen[0][0].observations
    return Observed(snapshot=None if isinstance(read, ObservationError) else read, cells=cells,
                    unobserved=(*store_unobserved, *(u for _, lane_unobserved in seen for u in lane_unobserved)))


def _store_read(target: RunTarget, store: Store) -> StoreSnapshot | ObservationError:
    """The store's one read for the EvalRun (its selections could not be read: Unknown, as a failed read)."""
    return ObservationError(target.unknown) if target.unknown else read_source(functools.partial(
        store.observe, target.evalrun, _models(target), _benchmarks(target), _read_keys(target)))


def _lane_seen(lane: ClusterLane, read: StoreSnapshot | ObservationError, view: ClusterView,
               scheduler: Scheduler) -> tuple[LaneSeen, tuple[Unobserved, ...]]:
    """The store's read joined with one cluster's reads, and the cluster's sources that could not be read."""
    snapshot = None if isinstance(read, ObservationError) else read
    missing = str(view.dirs) if isinstance(view.dirs, JobsDirMissing) else ""
    failures = [str(x) for x in (read, view.jobs, view.dirs) if isinstance(x, ObservationError) and str(x) != missing]
    cells = join_cells(
        lane.cells,
        snapshot,
        None if isinstance(view.jobs, ObservationError) else view.jobs,
        () if missing else None if isinstance(view.dirs, ObservationError) else view.dirs,
        unknown_reason="; ".join(failures),
        jobs_dir_missing=missing,
    )
    sources: tuple[tuple[Source, object], ...] = (("queue", view.jobs), ("run dirs", view.dirs))
    unobserved = tuple(Unobserved.of(source, error, lane.cluster)  # a missing jobs dir was seen missing: its cells
                       for source, error in sources  # say so, it is no source that failed
                       if isinstance(error, ObservationError) and not isinstance(error, JobsDirMissing))
    cluster_failures = "; ".join(str(x) for x in (view.jobs, view.dirs)
                                 if isinstance(x, ObservationError) and str(x) != missing)
    slots = LaneSlots(budget=view.budget, budget_note=view.budget_note, observed=cluster_failures,
                      live_job_names=view.live_job_names, usable_nodes=view.usable_nodes, preflight=view.preflight,
                      jobs=() if isinstance(view.jobs, ObservationError) else view.jobs)
    return LaneSeen.model_construct(lane=lane, observations=_with_outputs(cells, scheduler), slots=slots), unobserved


def _with_outputs(cells: Sequence[Observation], scheduler: Scheduler) -> tuple[Observation, ...]:
    """Each running job's new output, read on from where the cell's memory says its last reading ended."""
    cursors = [OutputCursor(job_id=job.job_id, name=job.name, offset=_offset(obs, job))
               for obs in cells for job in obs.jobs or () if job.state == JobState.RUNNING]
    if not cursors:
        return tuple(cells)
    read = read_source(functools.partial(scheduler.read_output, cursors))
    if isinstance(read, ObservationError):  # the health rules that need output wait; the others go on
        return tuple(obs.model_copy(update={"outputs": None}) for obs in cells)
    by_job = {output.job_id: output for output in read}
    return tuple(obs.model_copy(update={"outputs": tuple(by_job[job.job_id] for job in obs.jobs or ()
                                                         if job.job_id in by_job)}) for obs in cells)


def _offset(obs: Observation, job: ObservedJob) -> int:
    reading = obs.memory.output
    return reading.offset if reading is not None and reading.job_id == job.job_id else 0


def _acting(target: RunTarget, store: Store, snapshot: StoreSnapshot | None, act: bool, holder: str,
            holder_is_dead: Callable[[str], bool], lease_ttl: timedelta) -> Acting:
    """Take the EvalRun's lease and claim its cells, or say why this pass only plans."""
    watching = other_owners(snapshot, target.evalrun)
    if not act:
        return Acting(granted=False, owners=watching, note="plan")
    if not target.policy.may_launch:
        return Acting(granted=False, owners=watching, note="suspended")
    if target.unknown:  # its cells are not all known: claiming the ones it knows would give up the others
        return Acting(granted=False, owners=watching, note=f"planned only: {target.unknown}", blocked=True)
    lease = evalrun_lease_name(target.evalrun)
    try:
        if not _take_lease(store, lease, holder, holder_is_dead, lease_ttl.total_seconds()):
            return Acting(granted=False, owners=watching, note="another reconciler holds the lease; planned only")
        try:
            owners = store.state.claim_cells(target.evalrun, _keys(target), CELL_OWNER_TTL.total_seconds())
        except BaseException:
            _release(store, lease, holder)
            raise
    except StoreUnavailable as exc:  # nothing was done: the next pass tries again
        log.warning("store unavailable", extra={"error": str(exc)})
        return Acting(granted=False, owners=watching, note=f"planned only: {exc}", blocked=True)
    # A cell another EvalRun won since this pass observed it (a race) is watched, not acted on.
    return Acting(granted=True, owners={key: owner for key, owner in owners.items() if owner != target.evalrun})


def _launch_lease(store: Store, lease: str, launcher: str, holder_is_dead: Callable[[str], bool],
                  lease_ttl: timedelta) -> str | None:
    """Take the cluster's launch lease for this pass; None when taken, else why this pass launches nothing there.
    Launches on one cluster are one pass's at a time, so the ceiling and the rate hold across processes.

    A lease left by an ended pass of this very process (its release failed: the store was down) is taken over, as
    is one of a dead process: else a `--loop` would wait out the lease's TTL after every store outage."""
    holder = launcher.partition("#")[0]

    def ended(other: str) -> bool:
        owner = other.partition("#")[0]
        with _LAUNCHERS_GUARD:
            return (owner == holder and other not in _LAUNCHERS) or holder_is_dead(owner)

    try:
        if _take_lease(store, lease, launcher, ended, lease_ttl.total_seconds()):
            return None
    except StoreUnavailable as exc:
        return f"no launch this pass: {exc}"
    return "another pass is launching on this cluster; next pass"


_LAUNCHERS: set[str] = set()  # the passes of this process under way (`holder#nonce`), for `_launch_lease`
_LAUNCHERS_GUARD = threading.Lock()


def _take_lease(store: Store, lease: str, holder: str, holder_is_dead: Callable[[str], bool], ttl: float) -> bool:
    if store.state.try_lease(lease, holder, ttl):
        return True
    other = store.state.lease_holder(lease)
    if other is None or not holder_is_dead(other):
        return other is None and store.state.try_lease(lease, holder, ttl)
    log.warning("taking over the lease of a dead reconciler", extra={"lease": lease, "holder": other})
    store.state.release_lease(lease, other)
    return store.state.try_lease(lease, holder, ttl)


def _release(store: Store, lease: str, holder: str) -> None:
    try:
        store.state.release_lease(lease, holder)
    except StoreUnavailable as exc:  # it expires after LEASE_TTL, or this holder renews it next pass
        log.warning("could not release the lease", extra={"lease": lease, "error": str(exc)})


def _keys(target: RunTarget) -> list[str]:
    """The cells it claims, and a sharded cell's unsharded key (RULES §17): another EvalRun listing the cell with
    shards set otherwise (or walltime fixed) would take that key once it is let go, and run the benchmark whole
    beside these shards."""
    return [c.key for c in target.cells] + [c.former_key for c in target.cells if c.shards > 1 and c.former_key]


def _read_keys(target: RunTarget) -> list[str]:
    """The cells whose history it reads: their keys, and the former keys of earlier versions."""
    return list(dict.fromkeys([*_keys(target), *(c.former_key for c in target.cells if c.former_key)]))


def _models(target: RunTarget) -> list[str]:
    return sorted({c.model for c in target.cells})


def _benchmarks(target: RunTarget) -> list[str]:
    return sorted({c.benchmark_name for c in target.cells})
