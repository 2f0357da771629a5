"""Placement (RULES §15): where an unbound cell's first job goes, pure."""

from __future__ import annotations

from datetime import timedelta

from controller.core.observed import JobState
from controller.core.placement import ClusterOffer, PlacementPolicy, place, queue_facts
from tests.core.builders import NOW, ago, job

SOONEST = PlacementPolicy(strategy="soonest")
ORDERED = PlacementPolicy(strategy="ordered")


def offer(name: str, free: int, **changes: object) -> ClusterOffer:
    return ClusterOffer(cluster=name, free=free, full=f"{name} at maxLiveJobs", **changes)  # type: ignore[arg-type]


def test_each_placement_takes_a_slot_so_no_cluster_gets_more_than_it_allows() -> None:
    wanting = [(f"c{i}", ["a", "b"]) for i in range(8)]

    placed = place(wanting, [offer("a", 2), offer("b", 2)], SOONEST, NOW)

    where = [placed[f"c{i}"].cluster for i in range(8)]
    assert sorted(w for w in where if w) == ["a", "a", "b", "b"]
    assert where[4:] == [None] * 4  # spec order: the first four go
    assert placed["c7"].reason == "no free slot on any cluster: a: a at maxLiveJobs; b: b at maxLiveJobs"


def test_soonest_goes_where_our_recent_jobs_waited_less() -> None:
    placed = place([("c", ["a", "b"])], [offer("a", 3, recent_wait=timedelta(minutes=40)),
                                         offer("b", 1, recent_wait=timedelta(minutes=2))], SOONEST, NOW)

    assert placed["c"].cluster == "b"
    assert placed["c"].reason == ("placed on b: 1 free slot, est. start in 2 min (soonest start); "
                                  "a: 3 free slots, est. start in 40 min")


def test_the_schedulers_estimate_for_our_queued_jobs_beats_a_short_history() -> None:
    queued_long = offer("a", 2, queued_ahead=3, expected_start=NOW + timedelta(hours=3),
                        recent_wait=timedelta(minutes=1))
    placed = place([("c", ["a", "b"])], [queued_long, offer("b", 1, recent_wait=timedelta(minutes=20))], SOONEST, NOW)

    assert placed["c"].cluster == "b"
    assert "a: 2 free slots, 3 queued ahead, est. start in 3.0 h" in placed["c"].reason


def test_a_held_cluster_gets_nothing_whatever_its_slots() -> None:
    placed = place([("c", ["a", "b"]), ("d", ["a", "b"])],
                   [offer("a", 5, held="not observed (squeue exited 1)"), offer("b", 1)], SOONEST, NOW)

    assert placed["c"].cluster == "b"
    assert placed["d"].cluster is None
    assert placed["d"].reason == ("no free slot on any cluster: a: not observed (squeue exited 1); "
                                  "b: b at maxLiveJobs")


def test_ordered_takes_the_first_eligible_cluster_with_a_slot_even_when_another_starts_sooner() -> None:
    offers = [offer("a", 1, recent_wait=timedelta(hours=5)), offer("b", 4)]

    placed = place([("c", ["a", "b"]), ("d", ["a", "b"])], offers, ORDERED, NOW)

    assert [placed["c"].cluster, placed["d"].cluster] == ["a", "b"]
    assert placed["c"].reason.startswith("placed on a: 1 free slot, est. start in 5.0 h (first eligible")


def test_a_pinned_cell_waits_for_its_cluster_while_others_take_the_free_one() -> None:
    placed = place([("pinned", ["a"]), ("free", ["a", "b"])], [offer("a", 0), offer("b", 1)], SOONEST, NOW)

    assert placed["pinned"].cluster is None
    assert placed["pinned"].reason == "no free slot on any cluster: a: a at maxLiveJobs"
    assert placed["free"].cluster == "b"


def test_ties_go_to_more_free_slots_then_the_spec_order() -> None:
    assert place([("c", ["a", "b"])], [offer("a", 1), offer("b", 2)], SOONEST, NOW)["c"].cluster == "b"
    assert place([("c", ["b", "a"])], [offer("a", 2), offer("b", 2)], SOONEST, NOW)["c"].cluster == "a"


def test_queue_facts_count_queued_jobs_their_latest_estimate_and_the_recent_median_wait() -> None:
    jobs = [
        job("q1", JobState.QUEUED, job_id="1").model_copy(update={"expected_start": NOW + timedelta(minutes=30)}),
        job("q2", JobState.QUEUED, job_id="2").model_copy(update={"expected_start": NOW + timedelta(minutes=90)}),
        job("q3", JobState.QUEUED, job_id="3"),
        job("r1", JobState.RUNNING, job_id="4", started=ago(hours=1)).model_copy(
            update={"submitted_at": ago(hours=1, minutes=10)}),
        job("r2", JobState.COMPLETED, job_id="5", started=ago(hours=3)).model_copy(
            update={"submitted_at": ago(hours=3, minutes=30)}),
        job("r3", JobState.COMPLETED, job_id="6", started=ago(hours=5)).model_copy(
            update={"submitted_at": ago(hours=5, minutes=50)}),
        job("old", JobState.COMPLETED, job_id="7", started=ago(days=3)).model_copy(
            update={"submitted_at": ago(days=4)}),  # a day's wait three days ago: not recent
    ]

    assert queue_facts(jobs, NOW) == (3, NOW + timedelta(minutes=90), timedelta(minutes=30))
    assert queue_facts([], NOW) == (0, None, None)
