"""One reconcile pass: observe → plan → act → summarize, as a short flat sequence of named steps.

Each source is read once per pass (the scheduler and run dirs once per cluster, the store once per
EvalRun). A source that fails to read makes its cells Unknown; the planner then does nothing for
them. Acting needs the EvalRun's lease: a second reconciler that runs at the same time only plans.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import TypeVar

from pydantic import Field

from controller.core.actor import Actor, Outcome
from controller.core.match import observe_cells
from controller.core.planner import LAUNCHING, Policy, owned_elsewhere, plan
from controller.core.ports import (
    JobsDirMissing,
    ObservationError,
    RunDirs,
    Scheduler,
    StoreSnapshot,
    StoreUnavailable,
)
from controller.core.store import CELL_OWNER_TTL, Store
from controller.core.types import Cell, Frozen, Observation, ObservedJob, Plan, RunDirFacts

log = logging.getLogger("evalctl.reconcile")
T = TypeVar("T")
LEASE_TTL = timedelta(minutes=10)
RATE_WINDOW = timedelta(minutes=1)


class RunTarget(Frozen):
    """An EvalRun ready to reconcile: its resolved cells, its policy, and the cluster it runs on."""

    evalrun: str
    cluster: str
    cells: tuple[Cell, ...]
    policy: Policy


class PassResult(Frozen):
    evalrun: str
    plan: Plan
    outcomes: tuple[Outcome, ...] = ()
    acted: bool = False
    note: str = ""
    blocked: bool = Field(False, description="it should have acted but the store refused (a pass that failed)")


class ClusterPorts:
    """The adapters of one cluster, how to build an Actor for a run on it, and its submission rate."""

    def __init__(self, scheduler: Scheduler, run_dirs: RunDirs, actor_for: Callable[[RunTarget], Actor],
                 submissions_per_minute: int):
        self.scheduler, self.run_dirs, self.actor_for = scheduler, run_dirs, actor_for
        self.submissions_per_minute = submissions_per_minute


def reconcile_pass(
    targets: Sequence[RunTarget],
    store: Store,
    clusters: dict[str, ClusterPorts],
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
    """
    jobs: dict[str, tuple[ObservedJob, ...] | ObservationError] = {}
    dirs: dict[str, tuple[RunDirFacts, ...] | ObservationError] = {}
    budgets: dict[str, int] = {}  # per-cluster submission budget, shared by the EvalRuns on it
    results = []
    for target in targets:
        ports = clusters[target.cluster]
        if target.cluster not in jobs:
            jobs[target.cluster] = _read(ports.scheduler.observe)
            dirs[target.cluster] = _read(ports.run_dirs.observe)
            budgets[target.cluster] = min(rate_budget(jobs[target.cluster], ports.submissions_per_minute, now),
                                          target.policy.max_submissions_per_pass)  # a cluster field: same for all
        snapshot = _read(functools.partial(store.observe, target.evalrun, _models(target), _benchmarks(target),
                                           _keys(target)))
        observations = _observe(target, snapshot, jobs[target.cluster], dirs[target.cluster])
        budget = budgets[target.cluster]
        leases = snapshot.tunnel_leases if isinstance(snapshot, StoreSnapshot) else ()
        cluster_jobs = jobs[target.cluster]
        live = None if isinstance(cluster_jobs, ObservationError) else frozenset(
            job.name for job in cluster_jobs if job.state.active)
        the_plan = plan(target.evalrun, target.cells, observations, target.policy, now, budget=budget,
                        tunnel_leases=leases, live_job_names=live, owners=_other_owners(target, snapshot))
        budgets[target.cluster] -= sum(1 for c in the_plan.cells for a in c.actions if a.kind in LAUNCHING)
        if not act or the_plan.suspended:
            results.append(PassResult(evalrun=target.evalrun, plan=the_plan, note="suspended" if act else "plan"))
            continue
        lease = f"evalrun/{target.evalrun}"
        try:
            if not _take_lease(store, lease, holder, holder_is_dead, lease_ttl.total_seconds()):
                results.append(PassResult(evalrun=target.evalrun, plan=the_plan,
                                          note="another reconciler holds the lease; planned only"))
                continue
            the_plan = _keep_claimed(the_plan, store.state.claim_cells(target.evalrun, _keys(target),
                                                                        CELL_OWNER_TTL.total_seconds()))
        except StoreUnavailable as exc:  # nothing was done: the next pass tries again
            log.warning("store unavailable", extra={"error": str(exc)})
            results.append(PassResult(evalrun=target.evalrun, plan=the_plan, note=f"planned only: {exc}",
                                      blocked=True))
            continue
        try:
            outcomes = ports.actor_for(target).act(the_plan)
        finally:
            _release(store, lease, holder)
        results.append(PassResult(evalrun=target.evalrun, plan=the_plan, outcomes=tuple(outcomes), acted=True))
    return results


def live_jobs_of(target: RunTarget, store: Store, ports: ClusterPorts) -> list[ObservedJob]:
    """Queued and running jobs of the cells `target` owns (what `deletionPolicy: Cancel` cancels).

    Raises ObservationError when the queue or the store cannot be read: never "no jobs" by default.
    """
    jobs = ports.scheduler.observe()
    snapshot = store.observe(target.evalrun, _models(target), _benchmarks(target), _keys(target))
    others = _other_owners(target, snapshot)
    observed = observe_cells(target.cells, snapshot, jobs, ())
    return [job for cell, seen in zip(target.cells, observed, strict=True) if cell.key not in others
            for job in seen.jobs or () if job.state.active]


def rate_budget(jobs: tuple[ObservedJob, ...] | ObservationError, per_minute: int, now: datetime) -> int:
    """Submissions the cluster's rate still allows: its cap minus our jobs submitted in the last minute.

    The queue itself remembers what was submitted, so the rate holds across passes and processes.
    """
    if isinstance(jobs, ObservationError):
        return 0  # its cells are Unknown: nothing is launched anyway
    recent = sum(1 for job in jobs if job.submitted_at is not None and now - job.submitted_at < RATE_WINDOW)
    return max(per_minute - recent, 0)


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


def _read(observe: Callable[[], T]) -> T | ObservationError:
    try:
        return observe()
    except ObservationError as exc:  # a missing jobs dir is also how every fresh cluster starts: not a warning
        (log.info if isinstance(exc, JobsDirMissing) else log.warning)("observation failed", extra={"error": str(exc)})
        return exc


def _observe(target: RunTarget, snapshot: StoreSnapshot | ObservationError,
             jobs: tuple[ObservedJob, ...] | ObservationError,
             dirs: tuple[RunDirFacts, ...] | ObservationError) -> list[Observation]:
    missing = str(dirs) if isinstance(dirs, JobsDirMissing) else ""
    failures = [str(x) for x in (snapshot, jobs, dirs) if isinstance(x, ObservationError) and str(x) != missing]
    return observe_cells(
        target.cells,
        snapshot if isinstance(snapshot, StoreSnapshot) else None,
        None if isinstance(jobs, ObservationError) else jobs,
        () if missing else None if isinstance(dirs, ObservationError) else dirs,
        unknown_reason="; ".join(failures),
        jobs_dir_missing=missing,
    )


def _other_owners(target: RunTarget, snapshot: StoreSnapshot | ObservationError) -> dict[str, str]:
    """Cells another EvalRun claimed and still renews (by the store's clock): this one only watches them."""
    if not isinstance(snapshot, StoreSnapshot):
        return {}
    return {o.cell_key: o.evalrun for o in snapshot.cell_owners if o.evalrun != target.evalrun}


def _keep_claimed(the_plan: Plan, owners: dict[str, str]) -> Plan:
    """Cells whose claim another EvalRun won since this pass observed them (a race) are not acted on."""
    cells = tuple(owned_elsewhere(c, owners[c.cell.key])
                  if owners.get(c.cell.key, the_plan.evalrun) != the_plan.evalrun else c for c in the_plan.cells)
    return the_plan.model_copy(update={"cells": cells})


def _keys(target: RunTarget) -> list[str]:
    return [c.key for c in target.cells]


def _models(target: RunTarget) -> list[str]:
    return sorted({c.model for c in target.cells})


def _benchmarks(target: RunTarget) -> list[str]:
    return sorted({c.benchmark_name for c in target.cells})
