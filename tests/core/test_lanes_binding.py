"""`bind` (RULES §15) reads each lane once and skips the cells nothing was observed of; whatever the lanes saw, it
binds every cell where the rule, read lane by lane for each cell, binds it. Pure."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from controller.core.lanes import ClusterLane, LaneSeen, LaneSlots, _spilled, bind
from controller.core.observed import JobState, Observation
from controller.core.remedies import CellMemory, Spill
from controller.core.types import Cell, ClusterRef
from tests.core.builders import ago, cell, facts, job, obs, spec_policy, sub

LANES = ("a", "b", "c")
SEEN = st.sampled_from(["nothing", "submitted", "submitted before clusters", "submitted elsewhere", "job",
                        "run dir", "spilled", "spilled and started"])


def observation(c: Cell, seen: str, home: str, memory: CellMemory) -> Observation:
    """What one lane saw of the cell; `memory` is the store's, on every lane alike (one store per EvalRun)."""
    record = sub(c).model_copy(update={"cluster": None if seen == "submitted before clusters" else
                                       "gone" if seen == "submitted elsewhere" else home})
    ended = job(c.run_tag(1), JobState.CANCELLED, started=ago(minutes=5) if seen == "spilled and started" else None)
    return {
        "nothing": obs(),
        "job": obs(jobs=(job(c.run_tag(1), JobState.QUEUED),)),
        "run dir": obs(dirs=(facts(c.run_tag(1)),)),
        "spilled": obs(subs=(record,), jobs=(ended,)),
    }.get(seen.removesuffix(" and started"), obs(subs=(record,))).model_copy(update={"memory": memory})


def store_memory(c: Cell, lanes: list[tuple[bool, str]], home: str) -> CellMemory:
    """The spill the store remembers for the cell when any lane saw it spilled."""
    spilled = any(listed and seen.startswith("spilled") for listed, seen in lanes)
    return CellMemory(spill=Spill(run_tag=c.run_tag(1), job_id="100", cluster=home, at=ago(minutes=2))) \
        if spilled else CellMemory()


def by_the_rule(key: str, seen: list[LaneSeen]) -> int | None:
    """The rule as RULES §15 states it, every lane read for the cell."""
    found = [(i, o) for i, lane in enumerate(seen) for c, o in zip(lane.lane.cells, lane.observations, strict=True)
             if c.key == key]
    submissions = next((o.submissions for _, o in found if o.submissions), ())
    if submissions:
        newest = max(submissions, key=lambda s: s.created_at)
        named = next((i for i, lane in enumerate(seen) if str(lane.lane.cluster) == newest.cluster), None)
        if named is not None:
            return None if _spilled(newest, dict(found).get(named)) is not None else named
        if newest.cluster is not None:
            return None  # a cluster no longer listed: not bound, and never placed (Unknown)
    evidence = next((i for i, o in found if o.jobs or o.run_dirs), None)
    return evidence if evidence is not None or not submissions else 0


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.lists(st.tuples(st.booleans(), SEEN), min_size=3, max_size=3),
                          st.sampled_from(LANES)), min_size=1, max_size=6))
def test_every_cell_is_bound_where_the_rule_read_lane_by_lane_binds_it(fleet: list) -> None:
    cells = [cell(model=f"org/M{i}-8B") for i in range(len(fleet))]
    seen = []
    for index, name in enumerate(LANES):
        here = [(c, lanes[index][1], home, store_memory(c, lanes, home))
                for c, (lanes, home) in zip(cells, fleet, strict=True) if lanes[index][0]]
        seen.append(LaneSeen(lane=ClusterLane(cluster=ClusterRef(name=name), cells=tuple(c for c, _, _, _ in here),
                                              policy=spec_policy(cluster=name)),
                             observations=tuple(observation(c, what, home, memory) for c, what, home, memory in here),
                             slots=LaneSlots(budget=1, budget_note="", live_job_names=frozenset(),
                                             usable_nodes=None, preflight=None)))

    bound = bind(cells, seen)
    assert bound.where == {c.key: by_the_rule(c.key, seen) for c in cells}
    assert set(bound.unlisted.values()) <= {"gone"}
