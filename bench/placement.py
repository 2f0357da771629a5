"""Bench: placement over several clusters, in-process (no I/O), 10,000 cells over 5 clusters, median of 5.

Usage: python bench/placement.py [--cells 10000]
Two fleets of one EvalRun over five clusters of 20 free slots each, whose queues differ (our jobs queued there,
the scheduler's start estimate, the wait our recent jobs saw): fresh (nothing observed: every cell unbound, every
one wanting its first job) and steady (nine cells in ten bound by a submission recorded on one of the five: most
finished, some running, some queued; the tenth fresh). For each: (a) the placement decision alone, binding every
cell to the cluster it ran on plus `place()` for the cells that want a first launch; (b) the whole `plan_lanes()`
beside the one-cluster `plan()` over the same cells, so what several clusters add shows. The first of the five
runs of the decision also computes each lane cell's key (cached on the cell): its max. Prints figures; asserts
nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from controller.core.lanes import ClusterLane, LaneSeen, LaneSlots, bind, cluster_offers, plan_lanes  # noqa: E402
from controller.core.observed import JobState, Observation, ObservedJob, ObservedRow, Submission  # noqa: E402
from controller.core.placement import PlacementPolicy, place  # noqa: E402
from controller.core.planner import plan  # noqa: E402
from controller.core.planner.gc_pause import cyclic_gc_paused  # noqa: E402
from controller.core.types import Cell, ClusterRef  # noqa: E402
from tests.core.builders import NOW, POLICY, RUN, SCORED, ago, cell, job, obs, row, spec_policy, sub  # noqa: E402

CLUSTERS = tuple(ClusterRef(name=name) for name in ("alpha", "beta", "gamma", "delta", "epsilon"))
FREE = 20
PLACEMENT = PlacementPolicy(strategy="soonest", spill_after=timedelta(hours=2))


@dataclass
class Fleet:
    cells: list[Cell]
    seen: list[LaneSeen]
    one: list[Observation]  # each cell's observation on one cluster, for the one-cluster plan()
    wanting: int


def queue(index: int, bound: list[ObservedJob]) -> tuple[ObservedJob, ...]:
    """The cluster's jobs of ours: those bound cells run there, and some of other EvalRuns queued ahead (more on
    each next cluster, each later expected) and started recently (each next cluster's waited longer)."""
    ahead = tuple(job(f"other-q{index}-{n}", JobState.QUEUED, job_id=f"{index}9{n}").model_copy(
        update={"expected_start": NOW + timedelta(minutes=10 * (index + n))}) for n in range(3 * index))
    started = tuple(job(f"other-r{index}-{n}", JobState.RUNNING, job_id=f"{index}8{n}", started=ago(hours=n + 1))
                    .model_copy(update={"submitted_at": ago(hours=n + 1, minutes=5 * index + n)}) for n in range(6))
    return (*bound, *ahead, *started)


def lanes(cells: list[Cell], observed: list[list[Observation]], jobs: list[list[ObservedJob]]) -> list[LaneSeen]:
    return [LaneSeen(lane=ClusterLane(cluster=ref, cells=tuple(c.model_copy(update={"cluster": ref.name})
                                                               for c in cells),
                                      policy=spec_policy(cluster=str(ref))),
                     observations=tuple(observed[index]),
                     slots=LaneSlots(budget=FREE, budget_note=f"cluster {ref} at maxLiveJobs",
                                     live_job_names=frozenset(j.name for j in jobs[index] if j.state.active),
                                     usable_nodes=None, preflight=None, jobs=queue(index, jobs[index])))
            for index, ref in enumerate(CLUSTERS)]


def fresh(n: int) -> Fleet:
    cells = [cell(model=f"org/Model{i}-8B") for i in range(n)]
    observed = [[obs() for _ in cells] for _ in CLUSTERS]  # each lane joins its own, as a pass does
    return Fleet(cells, lanes(cells, observed, [[] for _ in CLUSTERS]), observed[0], n)


def steady(n: int) -> Fleet:
    """Cell i bound to cluster i % 5 (its submission records it); of every 20 cells, 16 finished, one running, one
    queued, two fresh. The store's rows and submissions are on every lane's observation; a job, on its own lane's.
    Each lane's observations are made together, as a pass joins one lane after the other."""
    cells = [cell(model=f"org/Model{i}-8B") for i in range(n)]
    facts: list[tuple[int, tuple[ObservedRow, ...], tuple[Submission, ...], ObservedJob | None]] = []
    for i, c in enumerate(cells):
        home, kind = i % len(CLUSTERS), i % 20
        record = sub(c, job_id=str(i)).model_copy(update={"cluster": CLUSTERS[home].name})
        if kind >= 18:
            facts.append((home, (), (), None))
        elif kind == 16:
            facts.append((home, (row("Started", job_name=c.run_tag(1), started=ago(hours=1)),), (record,),
                          job(record.name, JobState.RUNNING, job_id=str(i), started=ago(hours=1), time_left_s=36_000)))
        elif kind == 17:
            facts.append((home, (row("Pending", job_name=c.run_tag(1)),), (record,), job(
                record.name, JobState.QUEUED, job_id=str(i)).model_copy(update={
                    "submitted_at": ago(minutes=20), "expected_start": NOW + timedelta(minutes=15)})))
        else:
            facts.append((home, (row("Finished", metrics=SCORED, job_name=c.run_tag(1)),), (record,), None))
    observed = [[obs(rows=rows, subs=subs, jobs=(own,) if own and home == index else ())
                 for home, rows, subs, own in facts] for index in range(len(CLUSTERS))]
    jobs = [[own for home, _, _, own in facts if own is not None and home == index] for index in range(len(CLUSTERS))]
    one = [observed[home][i] for i, (home, _, _, _) in enumerate(facts)]
    return Fleet(cells, lanes(cells, observed, jobs), one, sum(1 for _, _, subs, _ in facts if not subs))


def decide(fleet: Fleet) -> None:
    """The placement decision alone: every cell bound (or not) from the lanes' observations, then the unbound
    cells that want a first launch placed on the clusters' offers; with the cyclic collector held off, as in
    `plan_lanes()`."""
    with cyclic_gc_paused():
        bound = bind(fleet.cells, fleet.seen)
        offers = cluster_offers(fleet.seen, [FREE] * len(CLUSTERS), None, NOW)
        named = {lanes: tuple(offers[i].cluster for i in lanes) for lanes in set(bound.eligible.values())}
        place([(key, named[lanes]) for key, lanes in bound.eligible.items() if bound.where[key] is None], offers,
              PLACEMENT, NOW)


def timed(run: Callable[[], object]) -> str:
    times = []
    for _ in range(5):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return f"median {statistics.median(times) * 1e3:.0f} ms (min {min(times) * 1e3:.0f}, max {max(times) * 1e3:.0f})"


def report(name: str, fleet: Fleet) -> None:
    print(f"{len(fleet.cells):,} {name} cells over {len(CLUSTERS)} clusters ({fleet.wanting:,} wanting a first job):")
    print(f"  placement decision (bind + place): {timed(lambda: decide(fleet))}")
    whole = timed(lambda: plan_lanes(RUN, fleet.cells, PLACEMENT, fleet.seen, None, {}, NOW))
    print(f"  plan_lanes(), whole:               {whole}")
    one = timed(lambda: plan(RUN, fleet.cells, fleet.one, POLICY, NOW, budget=FREE * len(CLUSTERS)))
    print(f"  plan(), one cluster, same cells:   {one}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cells", type=int, default=10_000)
    args = parser.parse_args()
    report("fresh", fresh(args.cells))
    report("steady", steady(args.cells))


if __name__ == "__main__":
    main()
