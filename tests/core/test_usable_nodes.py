"""A pass reads the nodes a cluster's jobs may run on once per cluster and hands them to the planner; a read that
fails, or tells nothing, is "not known", never "no nodes"."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from controller.adapters.store.sqlite import SqliteStore
from controller.core import lanes
from controller.core.cluster_view import ClusterPorts
from controller.core.ports import ObservationError
from controller.core.reconcile import reconcile_pass
from controller.core.run_target import RunTarget
from controller.core.store import Store
from controller.core.types import ClusterRef
from tests.core.builders import NOW, POLICY, cell


class Nodes:
    """A cluster whose queue and run dirs are empty and whose node list is `answer` (raised if an exception)."""

    def __init__(self, answer: tuple[str, ...] | ObservationError | None):
        self.answer, self.reads = answer, 0

    def observe(self, *_: object) -> tuple[()]:
        return ()

    def usable_nodes(self) -> tuple[str, ...] | None:
        self.reads += 1
        if isinstance(self.answer, ObservationError):
            raise self.answer
        return self.answer


@pytest.mark.parametrize(("answer", "planned"), [
    (("gpu01", "gpu02"), frozenset({"gpu01", "gpu02"})),
    ((), None),
    (None, None),
    (ObservationError("sinfo exited 1: slurm_load_partitions: Unable to contact slurm controller"), None),
])
def test_each_cluster_is_asked_once_and_the_planner_gets_its_nodes_or_none(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, answer: Any, planned: frozenset[str] | None) -> None:
    seen: list[frozenset[str] | None] = []

    def planning(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs["usable_nodes"])
        return plan(*args, **kwargs)

    plan = lanes.plan
    monkeypatch.setattr(lanes, "plan", planning)
    cluster = Nodes(answer)
    ports = ClusterPorts(scheduler=cluster, run_dirs=cluster, actor_for=None,  # type: ignore[arg-type]
                         submissions_per_minute=6)
    targets = [RunTarget(evalrun=name, cluster="gpu", cells=(cell(),), policy=POLICY) for name in ("a", "b")]
    state = SqliteStore(tmp_path / "store.db")

    reconcile_pass(targets, Store(state, state), {ClusterRef(name="gpu"): ports}, NOW, act=False)
    state.close()

    assert cluster.reads == 1, "one read per cluster per pass, whatever the number of EvalRuns on it"
    assert seen == [planned, planned]
