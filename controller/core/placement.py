"""Placement: on which of an EvalRun's clusters an unbound cell's first job goes (RULES §15). Pure.

A cell is placed once, when it first launches; from then on it is bound to that cluster (its run dir, resumes and
refires live there). `soonest` sends it where a job is expected to start first: a free slot under the cluster's
`maxLiveJobs` and submission rate is needed at all, then the scheduler's own start estimate for our queued jobs
there, else the queue wait our recent jobs there saw, then fewer of our jobs queued ahead, more free slots, and
the spec's order. `ordered` takes the first eligible cluster with a free slot. Each placement takes a slot, so one
pass never sends more to a cluster than it allows.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Literal

from pydantic import Field

from controller.core.observed import JobState, ObservedJob
from controller.core.types import Frozen

Strategy = Literal["soonest", "ordered"]
RECENT = timedelta(hours=24)  # the queue waits a cluster's recent jobs saw: what "recent" means


class PlacementPolicy(Frozen):
    """How an EvalRun with several clusters places a cell that has not run anywhere yet."""

    strategy: Strategy = Field(description="soonest: where the job is expected to start first; ordered: the first "
                                           "eligible cluster in the spec's order")
    spill_after: timedelta | None = Field(None, description="a job still queued this long, with a free slot on "
                                                           "another cluster, is moved there; None: never")


class ClusterOffer(Frozen):
    """One cluster as placement sees it this pass."""

    cluster: str
    free: int = Field(description="launches it still allows this pass (maxLiveJobs, rate), after its bound cells'")
    full: str = Field("", description="why it has no free slot, in words (e.g. 'at maxLiveJobs (2 live)')")
    held: str = Field("", description="why nothing is placed there this pass (unobserved, preflight, back-off)")
    queued_ahead: int = Field(0, description="our jobs queued there")
    expected_start: datetime | None = Field(None, description="the scheduler's latest start estimate of those")
    recent_wait: timedelta | None = Field(None, description="median queue wait of our jobs started there recently")


class Placement(Frozen):
    cluster: str | None = Field(description="None: no eligible cluster has a free slot this pass")
    reason: str


def queue_facts(jobs: Iterable[ObservedJob], now: datetime) -> tuple[int, datetime | None, timedelta | None]:
    """Our jobs queued on a cluster, the latest start the scheduler expects for them, and the median wait of our
    jobs that started there in the last day (a cluster with no such job has no recent wait: None)."""
    queued, latest, waits = 0, None, []
    for job in jobs:
        if job.state == JobState.QUEUED:
            queued += 1
            if job.expected_start is not None and (latest is None or job.expected_start > latest):
                latest = job.expected_start
        elif job.started_at is not None and job.submitted_at is not None and now - job.started_at <= RECENT:
            waits.append(max(job.started_at - job.submitted_at, timedelta(0)))
    return queued, latest, timedelta(seconds=statistics.median(w.total_seconds() for w in waits)) if waits else None


def place(wanting: Sequence[tuple[str, Sequence[str]]], offers: Sequence[ClusterOffer], policy: PlacementPolicy,
          now: datetime) -> dict[str, Placement]:
    """Each wanting cell (key, the clusters it is eligible on, spec order) → where its first job goes this pass.
    Every cell past the last free slot shares one Placement: 10,000 fresh cells cost what the free slots cost."""
    free = {offer.cluster: offer.free if not offer.held else 0 for offer in offers}
    by_name = {offer.cluster: offer for offer in offers}
    order = {offer.cluster: index for index, offer in enumerate(offers)}
    placed: dict[str, Placement] = {}
    waiting: dict[tuple[str, ...], Placement] = {}
    for key, eligible in wanting:
        names = tuple(eligible)
        if names in waiting:  # none of them had a free slot, and slots are only ever taken
            placed[key] = waiting[names]
            continue
        open_ = [name for name in names if free.get(name, 0) > 0]
        if not open_:
            placed[key] = waiting[names] = Placement(cluster=None, reason=_nowhere(names, by_name))
            continue
        if policy.strategy == "ordered":
            chosen = min(open_, key=order.__getitem__)
        else:
            chosen = min(open_, key=lambda name: _soonest_key(by_name[name], free[name], order[name], now))
        placed[key] = Placement(cluster=chosen, reason=_placed(chosen, policy, eligible, by_name, free, now))
        free[chosen] -= 1
    return placed


def _soonest_key(offer: ClusterOffer, free: int, index: int, now: datetime) -> tuple[float, int, int, int]:
    return (_expected_wait(offer, now).total_seconds(), offer.queued_ahead, -free, index)


def _expected_wait(offer: ClusterOffer, now: datetime) -> timedelta:
    """From now until a new job there is expected to start: after the scheduler's latest estimate for our queued
    jobs there, else the recent median wait; nothing known is no wait."""
    if offer.queued_ahead and offer.expected_start is not None:
        return max(offer.expected_start - now, timedelta(0))
    return offer.recent_wait or timedelta(0)


def _placed(chosen: str, policy: PlacementPolicy, eligible: Sequence[str], offers: Mapping[str, ClusterOffer],
            free: Mapping[str, int], now: datetime) -> str:
    others = "; ".join(_said(offers[name], free[name], now) for name in eligible if name != chosen)
    how = "first eligible in the spec's order" if policy.strategy == "ordered" else "soonest start"
    return f"placed on {_said(offers[chosen], free[chosen], now)} ({how})" + (f"; {others}" if others else "")


def _nowhere(eligible: Sequence[str], offers: Mapping[str, ClusterOffer]) -> str:
    said = "; ".join(f"{name}: {_no_slot(offers[name])}" if name in offers else f"{name}: not observed"
                     for name in eligible)
    return f"no free slot on any cluster: {said}"


def _no_slot(offer: ClusterOffer) -> str:
    return offer.held or offer.full or "no free slot this pass"


def _said(offer: ClusterOffer, free: int, now: datetime) -> str:
    if offer.held or free <= 0:
        return f"{offer.cluster}: {_no_slot(offer)}"
    wait = _expected_wait(offer, now)
    start = "est. start now" if wait < timedelta(minutes=1) else f"est. start in {_minutes(wait)}"
    ahead = f", {offer.queued_ahead} queued ahead" if offer.queued_ahead else ""
    return f"{offer.cluster}: {free} free slot{'s' if free != 1 else ''}{ahead}, {start}"


def _minutes(wait: timedelta) -> str:
    minutes = round(wait.total_seconds() / 60)
    return f"{minutes} min" if minutes < 120 else f"{minutes / 60:.1f} h"
