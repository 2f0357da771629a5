"""One pass's reads of a cluster: its queue and accounting, run dirs, usable nodes and preflight, and the launches it
still allows. A source that fails to read is kept as the error, never as "nothing there" (RULES §12)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Literal, TypeVar

from pydantic import Field

from controller.core.actor import Actor
from controller.core.observed import ObservedJob
from controller.core.planner import OVER_BUDGET, Policy, launch_of
from controller.core.ports import JobsDirMissing, ObservationError, RunDirs, Scheduler
from controller.core.preflight import Preflight
from controller.core.run_target import RunTarget
from controller.core.types import RUN_TAG_PREFIX, ClusterRef, Frozen, stem_of
from controller.core.vocabulary import Plan

log = logging.getLogger("evalctl.reconcile")
T = TypeVar("T")
RATE_WINDOW = timedelta(minutes=1)


Source = Literal["store", "queue", "run dirs"]
FIXES: dict[Source, str] = {
    "store": "check that the store (--store, $EVALCTL_STORE) is reachable and readable from here",
    "queue": "check that squeue and sacct answer here: on PATH, with the cluster's SLURM config, or through "
             "scheduler.ssh on its login node",
    "run dirs": "check that the cluster's jobsDir is mounted and readable from here",
}


class Unobserved(Frozen):
    """A source a pass could not read (RULES §12): the cells it holds are Unknown, and `evalctl` exits 3 saying so."""

    source: Source
    cluster: str = Field("", description="the cluster whose queue or run dirs it is; empty for the store")
    cause: str
    fix: str

    @classmethod
    def of(cls, source: Source, cause: ObservationError, cluster: ClusterRef | None = None) -> Unobserved:
        return cls(source=source, cluster=str(cluster or ""), cause=" ".join(str(cause).split()), fix=FIXES[source])

    def line(self) -> str:
        where = f"cluster {self.cluster}: " if self.cluster else ""
        return f"{where}{self.source} not observed: {self.cause}; {self.fix}"


class ClusterPorts:
    """The adapters of one cluster, how to build an Actor for a run on it, its submission rate, and its preflight
    (RULES §12: raises ObservationError when it cannot run; None: the cluster has none)."""

    def __init__(self, scheduler: Scheduler, run_dirs: RunDirs, actor_for: Callable[[RunTarget], Actor],
                 submissions_per_minute: int, preflight: Callable[[], Preflight] | None = None):
        self.scheduler, self.run_dirs, self.actor_for = scheduler, run_dirs, actor_for
        self.submissions_per_minute = submissions_per_minute
        self.preflight = preflight


class ClusterView:
    """One pass's reads of a cluster (queue and accounting, run dirs, the nodes its jobs may run on, its preflight),
    and the launches it still allows: the pass's cap and the cluster's rate, and room under `maxLiveJobs` (our
    queued + running jobs, from the queue).

    `launching`: whether this pass may launch there at all (it holds the cluster's launch lease, taken BEFORE the
    queue is read: another process that launched meanwhile has released it, and its jobs are in this read)."""

    def __init__(self, ports: ClusterPorts, policy: Policy, now: datetime, stems: frozenset[str],
                 launching: str | None = None):
        self.jobs = read_source(ports.scheduler.observe)
        self.dirs = read_source(functools.partial(ports.run_dirs.observe, functools.partial(own_run_dir, stems)))
        self.nodes = read_source(ports.scheduler.usable_nodes)
        self.preflight = preflight_of(ports, policy.cluster) if not isinstance(self.jobs, ObservationError) else None
        self.paced = min(rate_budget(self.jobs, ports.submissions_per_minute, now), policy.max_submissions_per_pass)
        self.max_live = policy.max_live_jobs
        self.live = 0 if isinstance(self.jobs, ObservationError) else sum(1 for job in self.jobs if job.state.active)
        self.not_launching = launching  # why this pass launches nothing on the cluster, when it does not

    @property
    def budget(self) -> int:
        return 0 if self.not_launching else max(min(self.paced, self.max_live - self.live), 0)

    @property
    def budget_note(self) -> str:
        """Why cells past the budget wait."""
        if self.not_launching:
            return self.not_launching
        if self.max_live - self.live <= self.paced:  # the ceiling binds: once this budget is spent, it is reached
            return f"cluster at maxLiveJobs ({self.max_live} live)"
        return OVER_BUDGET

    @property
    def live_job_names(self) -> frozenset[str] | None:
        """Every queued or running job on the cluster; None when the queue could not be read."""
        if isinstance(self.jobs, ObservationError):
            return None
        return frozenset(job.name for job in self.jobs if job.state.active)

    @property
    def usable_nodes(self) -> frozenset[str] | None:
        """The nodes the cluster's jobs may run on; None when not known (a read that failed is never "no nodes")."""
        return None if isinstance(self.nodes, ObservationError) else frozenset(self.nodes or ()) or None

    def spend(self, the_plan: Plan) -> None:
        launched = sum(1 for cell in the_plan.cells if launch_of(cell) is not None)
        self.paced -= launched
        self.live += launched



def own_run_dir(stems: frozenset[str], run_tag: str) -> bool:
    """A run dir some cell of the pass can own: one of its own tags, or a dir not of ours (the old listener's,
    matched by its config)."""
    return not run_tag.startswith(RUN_TAG_PREFIX) or stem_of(run_tag) in stems


def preflight_of(ports: ClusterPorts, cluster: str) -> Preflight | None:
    """The cluster's preflight (RULES §12), for every EvalRun on it; one that could not run says why (its launches
    wait). Not read when the queue was not: every cell is Unknown then, nothing launches anyway."""
    if ports.preflight is None:
        return None
    found = read_source(ports.preflight)
    return Preflight(cluster=cluster, unobserved=str(found)) if isinstance(found, ObservationError) else found


def rate_budget(jobs: tuple[ObservedJob, ...] | ObservationError, per_minute: int, now: datetime) -> int:
    """Submissions the cluster's rate still allows: its cap minus our jobs submitted in the last minute.

    The queue itself remembers what was submitted, so the rate holds across passes and processes.
    """
    if isinstance(jobs, ObservationError):
        return 0  # its cells are Unknown: nothing is launched anyway
    recent = sum(1 for job in jobs if job.submitted_at is not None and now - job.submitted_at < RATE_WINDOW)
    return max(per_minute - recent, 0)



def read_source(observe: Callable[[], T]) -> T | ObservationError:
    try:
        return observe()
    except ObservationError as exc:  # a missing jobs dir is also how every fresh cluster starts: not a warning
        (log.info if isinstance(exc, JobsDirMissing) else log.warning)("observation failed", extra={"error": str(exc)})
        return exc


