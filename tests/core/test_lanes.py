"""One EvalRun over two clusters, planned lane by lane (RULES §15): bound cells stay, fresh ones are placed within
each cluster's slots, an unobserved cluster gets nothing new, a cell that may run nowhere is held. Pure."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from controller.core.actions import Cancel, Hold, Resume, Submit, Wait
from controller.core.gpu_hours import EstimateSource, GpuEstimate
from controller.core.lanes import ClusterLane, LaneSeen, LaneSlots, Planned, merged, plan_lanes
from controller.core.observed import JobState, Observation
from controller.core.placement import PlacementPolicy
from controller.core.planner import launch_of
from controller.core.remedies import CellMemory, Spill
from controller.core.status import gpu_summary
from controller.core.types import Cell, ClusterRef
from controller.core.vocabulary import Phase, Rule
from controller.core.walltime import WallEstimate, WalltimePolicy
from tests.core.builders import NOW, RUN, SCORED, ago, cell, job, obs, row, spec_policy, sub

A, B = ClusterRef(name="a"), ClusterRef(name="b")
SOONEST = PlacementPolicy(strategy="soonest")
UNKNOWN = Observation(rows=None, submissions=None, jobs=None, run_dirs=None, unknown_reason="squeue exited 1")


def cells(n: int) -> list[Cell]:
    return [cell(model=f"org/M{i}-8B") for i in range(n)]


def lane(ref: ClusterRef, on: list[Cell], seen: list[Observation] | None = None, *, budget: int = 2,
         observed: str = "", ineligible: dict[str, str] | None = None, too_long: frozenset[str] = frozenset()
         ) -> LaneSeen:
    here = [c.model_copy(update={"cluster": ref.name}) for c in on]
    return LaneSeen(lane=ClusterLane(cluster=ref, cells=tuple(here), policy=spec_policy(cluster=str(ref)),
                                     ineligible=ineligible or {}, too_long=too_long),
                    observations=tuple(seen or [obs() for _ in on]),
                    slots=LaneSlots(budget=budget, budget_note=f"cluster {ref} at maxLiveJobs", observed=observed,
                                    live_job_names=frozenset(), usable_nodes=None, preflight=None))


def planned(fleet: list[Cell], *lanes: LaneSeen) -> list[Planned]:
    return plan_lanes(RUN, fleet, SOONEST, list(lanes), None, {}, NOW)


def launched(part: Planned) -> list[str]:
    return [c.cell.model for c in part.plan.cells if launch_of(c) is not None]


def test_eight_fresh_cells_over_two_clusters_of_two_slots_launch_four_two_on_each() -> None:
    fleet = cells(8)

    on_a, on_b = planned(fleet, lane(A, fleet), lane(B, fleet))

    assert launched(on_a) == ["org/M0-8B", "org/M2-8B"] and launched(on_b) == ["org/M1-8B", "org/M3-8B"]
    assert all(c.cell.cluster == "b" for c in on_b.plan.cells if launch_of(c))
    first = next(c for c in on_a.plan.cells if launch_of(c))
    assert "placed on a: 2 free slots, est. start now (soonest start); b: 2 free slots, est. start now" in first.reason
    whole = merged(RUN, fleet, [on_a.plan, on_b.plan])
    assert [c.cell.model for c in whole.cells] == [c.model for c in fleet]  # one plan per cell, spec order
    assert whole.clusters == {fleet[0].key: "a", fleet[2].key: "a", fleet[1].key: "b", fleet[3].key: "b"}
    waiting = [c for c in whole.cells if not launch_of(c)]
    assert len(waiting) == 4 and {c.rule for c in waiting} == {Rule.NO_FREE_CLUSTER}
    assert waiting[0].actions == (Wait(reason="no free slot on any cluster: a: cluster a at maxLiveJobs; "
                                              "b: cluster b at maxLiveJobs"),)


def test_a_cell_bound_by_its_submission_stays_on_its_cluster_even_unobserved() -> None:
    fleet = cells(2)
    bound = sub(fleet[0]).model_copy(update={"cluster": str(B)})
    seen_a = [obs(subs=(bound,)), obs()]

    on_a, on_b = planned(fleet, lane(A, fleet, seen_a), lane(B, fleet, [UNKNOWN, UNKNOWN], observed="squeue exited 1"))

    assert [c.cell.model for c in on_b.plan.cells] == ["org/M0-8B"]
    assert on_b.plan.cells[0].phase == Phase.UNKNOWN and not launch_of(on_b.plan.cells[0])
    assert launched(on_a) == ["org/M1-8B"]  # the fresh one goes where it can be seen
    assert merged(RUN, fleet, [on_a.plan, on_b.plan]).clusters == {fleet[0].key: "b", fleet[1].key: "a"}


def test_a_job_in_a_clusters_queue_binds_its_cell_there_without_a_submission_record() -> None:
    fleet = cells(1)
    queued = job(fleet[0].run_tag(1), JobState.QUEUED)

    on_a, on_b = planned(fleet, lane(A, fleet), lane(B, fleet, [obs(jobs=(queued,))]))

    assert on_a.plan.cells == () and on_b.plan.cells[0].rule == Rule.QUEUED


def test_a_submission_from_before_clusters_were_recorded_binds_its_cell_where_its_job_is_else_to_the_first() -> None:
    fleet = cells(2)
    legacy = [obs(subs=(sub(c),)) for c in fleet]  # the store's record, read on every lane: no cluster in it
    queued = legacy[0].model_copy(update={"jobs": (job(fleet[0].run_tag(1), JobState.QUEUED),)})

    on_a, on_b = planned(fleet, lane(A, fleet, legacy), lane(B, fleet, [queued, legacy[1]]))

    assert merged(RUN, fleet, [on_a.plan, on_b.plan]).clusters == {fleet[0].key: "b", fleet[1].key: "a"}
    assert [c.rule for c in on_b.plan.cells] == [Rule.QUEUED]


def test_a_finished_row_counts_on_every_cluster_and_takes_no_slot() -> None:
    fleet = cells(3)
    done = obs(rows=(row("Finished", metrics=SCORED),))

    on_a, on_b = planned(fleet, lane(A, fleet, [done, obs(), obs()], budget=1), lane(B, fleet, budget=1))

    whole = merged(RUN, fleet, [on_a.plan, on_b.plan])
    assert whole.cells[0].phase == Phase.COMPLETED
    assert sorted(launched(on_a) + launched(on_b)) == ["org/M1-8B", "org/M2-8B"]


def test_a_cell_eligible_nowhere_is_held_and_one_eligible_only_on_b_waits_for_b() -> None:
    fleet = cells(2)
    nowhere, only_b = fleet[0].key, fleet[1].key
    reasons = {nowhere: "pinned to c"}

    on_a, on_b = planned(fleet, lane(A, fleet, ineligible={**reasons, only_b: "pinned to b"}),
                         lane(B, fleet, budget=0, ineligible=reasons))

    held = next(c for c in on_a.plan.cells if c.cell.key == nowhere)
    assert held.rule == Rule.NO_ELIGIBLE_CLUSTER
    assert held.actions == (Hold(reason="fix spec.clusters or spec.placement.pin: may run on none of the EvalRun's "
                                        "clusters (a: pinned to c; b: pinned to c)"),)
    waiting = next(c for p in (on_a, on_b) for c in p.plan.cells if c.cell.key == only_b)
    assert waiting.rule == Rule.NO_FREE_CLUSTER
    assert waiting.actions == (Wait(reason="no free slot on any cluster: b: cluster b at maxLiveJobs"),)
    assert not any(isinstance(a, Submit) for p in (on_a, on_b) for c in p.plan.cells for a in c.actions)


def test_a_cell_whose_walltime_no_cluster_gives_is_held_naming_the_maxtimelimit_to_raise() -> None:
    fleet = cells(1)
    key = fleet[0].key

    on_a, _ = planned(fleet, lane(A, fleet, ineligible={key: "pinned to b"}),
                      lane(B, fleet, ineligible={key: "needs 48:00:00; b allows at most 24:00:00"},
                           too_long=frozenset({key})))

    [held] = on_a.plan.cells
    assert held.rule == Rule.NO_ELIGIBLE_CLUSTER
    assert held.actions == (Hold(reason="fix spec.clusters or spec.placement.pin, or raise maxTimeLimit of "
                                        "EvalCluster b (if its partition allows): may run on none of the EvalRun's "
                                        "clusters (a: pinned to b; b: needs 48:00:00; b allows at most 24:00:00)"),)


SPILLING = PlacementPolicy(strategy="soonest", spill_after=timedelta(hours=1))


def queued_on_a(c: Cell, minutes: float, state: JobState = JobState.QUEUED, *,
                started: datetime | None = None) -> Observation:
    """A cell whose one job went to cluster a `minutes` ago (its intent, its Pending row)."""
    record = sub(c, created=ago(minutes=minutes)).model_copy(update={"cluster": str(A)})
    found = job(c.run_tag(1), state, started=started).model_copy(update={"submitted_at": ago(minutes=minutes)})
    return obs(rows=(row("Pending", job_name=c.run_tag(1)),), subs=(record,), jobs=(found,))


def test_a_job_queued_past_spill_after_with_a_free_slot_elsewhere_is_cancelled_the_move_remembered_first() -> None:
    fleet = cells(1)
    on_a, on_b = plan_lanes(RUN, fleet, SPILLING, [lane(A, fleet, [queued_on_a(fleet[0], 90)]),
                                                   lane(B, fleet, [obs()])], None, {}, NOW)

    [spilled] = on_a.plan.cells
    assert spilled.rule == Rule.SPILL and on_b.plan.cells == ()
    assert spilled.actions == (Cancel(job_id="100", reason=spilled.reason),)
    assert "job 100 queued 90 min on a without starting" in spilled.reason and "a free slot on b" in spilled.reason
    assert spilled.remember is not None and spilled.remember.spill == Spill(
        run_tag=fleet[0].run_tag(1), job_id="100", cluster="a", at=NOW)


@pytest.mark.parametrize(("minutes", "state", "b_slots"), [
    (30, JobState.QUEUED, 2),     # not queued long enough
    (90, JobState.RUNNING, 2),    # it started: never moved
    (90, JobState.QUEUED, 0),     # nowhere to go
])
def test_no_spill_too_soon_once_started_or_without_a_free_slot(minutes: float, state: JobState, b_slots: int) -> None:
    fleet = cells(1)
    started = ago(minutes=5) if state == JobState.RUNNING else None
    on_a, _ = plan_lanes(RUN, fleet, SPILLING, [lane(A, fleet, [queued_on_a(fleet[0], minutes, state, started=started)]),
                                                lane(B, fleet, [obs()], budget=b_slots)], None, {}, NOW)

    assert on_a.plan.cells[0].rule != Rule.SPILL
    assert not any(isinstance(a, Cancel) for a in on_a.plan.cells[0].actions)


def test_a_spilled_job_that_ended_without_starting_moves_its_cell_to_another_cluster_once() -> None:
    fleet = cells(1)
    left = queued_on_a(fleet[0], 90, JobState.CANCELLED)
    left = left.model_copy(update={"memory": CellMemory(spill=Spill(run_tag=fleet[0].run_tag(1), job_id="100",
                                                                    cluster="a", at=ago(minutes=2)))})

    store_only = left.model_copy(update={"jobs": ()})  # b's queue has no job of it; the store is the same

    on_a, on_b = plan_lanes(RUN, fleet, SPILLING, [lane(A, fleet, [left], budget=5),
                                                   lane(B, fleet, [store_only], budget=1)], None, {}, NOW)

    assert on_a.plan.cells == (), "never placed back on the cluster it left, free slots or not"
    [moved] = on_b.plan.cells
    launch = launch_of(moved)
    assert isinstance(launch, Resume) and (launch.attempt, launch.fire) == (1, 2), "the run cut before it began"
    assert "placed on b" in moved.reason
    assert merged(RUN, fleet, [on_a.plan, on_b.plan]).clusters == {fleet[0].key: "b"}


def test_a_spilled_job_that_started_after_all_keeps_its_cell_where_it_ran() -> None:
    fleet = cells(1)
    ran = queued_on_a(fleet[0], 90, JobState.CANCELLED, started=ago(minutes=10))
    ran = ran.model_copy(update={"memory": CellMemory(spill=Spill(run_tag=fleet[0].run_tag(1), job_id="100",
                                                                  cluster="a", at=ago(minutes=11)))})

    on_a, on_b = plan_lanes(RUN, fleet, SPILLING, [lane(A, fleet, [ran]), lane(B, fleet, [obs()])], None, {}, NOW)

    assert [c.cell.key for c in on_a.plan.cells] == [fleet[0].key] and on_b.plan.cells == ()


def test_gpu_hours_are_summed_per_cluster_where_each_cell_ran() -> None:
    fleet = cells(3)
    on_a, on_b = planned(fleet, lane(A, fleet, budget=2), lane(B, fleet, budget=1))
    whole = merged(RUN, fleet, [on_a.plan, on_b.plan])
    spent = whole.model_copy(update={"cells": tuple(c.model_copy(update={"gpu_hours": hours})
                                                     for c, hours in zip(whole.cells, (1.5, 2.0, 0.25), strict=True))})

    assert [whole.clusters[c.key] for c in fleet] == ["a", "a", "b"]
    assert gpu_summary(spent).by_cluster == {"a": 3.5, "b": 0.25}
    assert gpu_summary(spent).spent == 3.75


def test_a_cell_whose_job_went_to_a_cluster_no_longer_listed_is_unknown_never_started_again() -> None:
    fleet = cells(1)
    gone = sub(fleet[0]).model_copy(update={"cluster": "c"})
    seen = obs(rows=(row("Started", job_name=fleet[0].run_tag(1)),), subs=(gone,))

    on_a, on_b = planned(fleet, lane(A, fleet, [seen]), lane(B, fleet, [seen]))

    [unknown] = on_a.plan.cells
    assert unknown.phase == Phase.UNKNOWN and unknown.actions == () and on_b.plan.cells == ()
    assert "its newest job went to cluster c, which spec.clusters no longer lists" in unknown.reason
    assert merged(RUN, fleet, [on_a.plan, on_b.plan]).clusters == {fleet[0].key: "c"}


def test_each_cluster_sizes_its_launches_by_its_own_estimates_and_a_waiting_cell_names_no_walltime() -> None:
    """walltime auto (RULES §16) over two clusters: a cell's job is sized where it goes, by that cluster's evidence
    (its gpusPerJob, run dirs and jobs); a cell that waits for a slot launches nothing and says nothing of a size."""
    fleet = cells(3)
    auto = WalltimePolicy(auto=True, cancel_margin=timedelta(minutes=15), minimum=timedelta(minutes=30),
                          maximum=timedelta(hours=48))

    def sized_lane(ref: ClusterRef, hours: float) -> LaneSeen:
        seen = lane(ref, fleet, budget=1)
        guess = GpuEstimate(hours=hours, source=EstimateSource.HISTORY, basis="test", wall=WallEstimate(
            median_hours=hours, high_hours=hours, basis=f"attempts on {ref}", with_start=True))
        return seen.model_copy(update={"lane": seen.lane.model_copy(update={"policy": seen.lane.policy.model_copy(
            update={"walltime": auto})}), "estimates": {c.key: guess for c in fleet}})

    on_a, on_b = planned(fleet, sized_lane(A, 4.0), sized_lane(B, 8.0))

    asked = {c.cell.model: (c.cell.cluster, launch.time_limit) for part in (on_a, on_b) for c in part.plan.cells
             if (launch := launch_of(c)) is not None}
    assert asked == {"org/M0-8B": ("a", "5:15:00"), "org/M1-8B": ("b", "10:15:00")}
    (waiting,) = [c for part in (on_a, on_b) for c in part.plan.cells if launch_of(c) is None]
    assert waiting.rule == Rule.NO_FREE_CLUSTER and "walltime" not in waiting.reason, waiting.reason
