"""The walltime bench's queue model: what a broken replay gets wrong (work lost or counted twice, a node running
two jobs, a backfilled job delaying the queue's head), on small fleets."""

from __future__ import annotations

from collections import defaultdict
from itertools import pairwise

import pytest

from bench.walltime import OTHERS, OURS, Cell, Job, Outcome, Policy, estimated, fleet, pick, simulate

NODES = 4


def cells() -> list[Cell]:
    """A small seeded fleet, plus cells that take every path: longer than 24 h (A resumes it), estimated far too
    low (B cuts and resumes it), and sized past 48 h (B shards it)."""
    drawn = fleet(24, seed=3)
    return [*drawn, Cell(24, 30.0, estimated(30.0)), Cell(25, 20.0, estimated(12.0)), Cell(26, 45.0, estimated(50.0))]


def replayed(policy: Policy) -> Outcome:
    return simulate(cells(), policy, NODES, background_every=6.0, seed=3)


@pytest.mark.parametrize("policy", ["fixed", "sized"])
def test_every_cell_gets_all_its_work_done_once(policy: Policy) -> None:
    outcome = replayed(policy)
    useful: dict[int | None, float] = defaultdict(float)
    for run in outcome.ours:
        useful[run.job.cell] += run.useful_hours
    assert sorted(outcome.done) == [cell.index for cell in cells()]
    for cell in cells():
        assert useful[cell.index] == pytest.approx(cell.work_hours, rel=1e-9), cell
    assert any(run.job.cut for run in outcome.ours)  # the resume path ran
    if policy == "sized":
        assert sum(1 for run in outcome.ours if run.job.cell == 26 and run.job.submit == 0) == 2  # 50 h × 1.25: 2 shards


@pytest.mark.parametrize("policy", ["fixed", "sized"])
def test_no_node_runs_two_jobs_at_once(policy: Policy) -> None:
    by_node: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for run in replayed(policy).runs:
        assert len(run.nodes) == run.job.width and all(0 <= node < NODES for node in run.nodes)
        for node in run.nodes:
            by_node[node].append((run.start, run.end))
    for intervals in by_node.values():
        ordered = sorted(intervals)
        assert all(end <= next_start for (_, end), (next_start, _) in pairwise(ordered))


def job(seq: int, width: int, request: float, priority: int = OURS) -> Job:
    return Job(seq=seq, width=width, request=request, need=request, limit=request, submit=0.0, priority=priority)


def test_backfill_starts_only_what_ends_before_the_heads_reservation() -> None:
    """2 nodes, one busy until 10 h: the 2-node head is due at 10 h; the 5 h job fits before it, the 20 h one not."""
    head, long, short = job(1, 2, 5.0, OTHERS), job(2, 1, 20.0), job(3, 1, 5.0)
    picked = pick(0.0, 1, [(10.0, 1)], [head, long, short])
    assert (picked.started, picked.head, picked.reservation) == ([short], head, 10.0)


def test_backfill_past_the_reservation_uses_only_the_nodes_the_head_leaves() -> None:
    """4 nodes, 2 busy until 10 h, a 3-node head: at 10 h one node is spare, so one 20 h job may take it, not two."""
    head, first, second, short = job(1, 3, 5.0, OTHERS), job(2, 1, 20.0), job(3, 1, 20.0), job(4, 1, 5.0)
    picked = pick(0.0, 2, [(10.0, 2)], [head, first, second, short])
    assert (picked.started, picked.reservation) == ([first, short], 10.0)


@pytest.mark.parametrize("policy", ["fixed", "sized"])
def test_the_queue_head_starts_by_its_reservation(policy: Policy) -> None:
    held = [run for run in replayed(policy).runs if run.reserved is not None]
    assert held  # other users' wide jobs waited as the head
    assert all(run.start <= run.reserved + 1e-9 for run in held if run.reserved is not None)
