"""RULES §12 `PreflightFailed`: a cluster whose preflight failed launches nothing — submits, resumes, the cancel that
only clears the way for one — and says why; its other decisions stand. One that could not run makes launches wait;
a passed one changes nothing. The pass reads the preflight once per cluster and never when the queue was not read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from controller.adapters.store.sqlite import SqliteStore
from controller.core import lanes
from controller.core.actions import ActionKind
from controller.core.cluster_view import ClusterPorts
from controller.core.observed import JobState
from controller.core.planner import plan
from controller.core.ports import ObservationError
from controller.core.preflight import Preflight, PreflightFailure
from controller.core.reconcile import reconcile_pass
from controller.core.run_target import RunTarget
from controller.core.status import summarize
from controller.core.store import Store
from controller.core.types import ClusterRef, submission_name
from controller.core.vocabulary import Rule
from tests.core.builders import NOW, POLICY, RUN, ago, cell, facts, job, obs, row, sub

FRESH = cell(model="org/fresh-8B")
STALE_QUEUED = cell(model="org/queued-8B")
RESUMABLE = cell(model="org/resume-8B")
RUNNING = cell(model="org/running-8B")
CELLS = (FRESH, STALE_QUEUED, RESUMABLE, RUNNING)
POLICY_HERE = POLICY.model_copy(update={"cluster": "hpc1"})
FAILED = Preflight(cluster="hpc1", failures=(
    PreflightFailure(field="partition", message="partition gpu-a100 does not exist on hpc1 (sinfo lists: debug, gpu); "
                                                "set spec.partition to one of them"),))


def observations() -> list[Any]:
    queued, running = STALE_QUEUED.run_tag(1), RUNNING.run_tag(1)
    incomplete = facts(RESUMABLE.run_tag(1), total=10, completed=4, finished=False)
    return [
        obs(),
        obs(subs=(sub(STALE_QUEUED, row_id="row-q", created=ago(hours=7)),),
            rows=(row("Pending", row_id="row-q", submitted=ago(hours=7)),),
            jobs=(job(submission_name(queued, 1), JobState.QUEUED, job_id="7"),)),
        obs(subs=(sub(RESUMABLE, row_id="row-r"),), rows=(row("Started", row_id="row-r", started=ago(hours=30)),),
            dirs=(incomplete,)),
        obs(subs=(sub(RUNNING, row_id="row-x"),), rows=(row("Started", row_id="row-x", started=ago(hours=1)),),
            jobs=(job(submission_name(running, 1), JobState.RUNNING, job_id="9", started=ago(hours=1),
                      time_left_s=60),)),
    ]


def kinds(planned: Any) -> list[set[ActionKind]]:
    return [{action.kind for action in c.actions} for c in planned.cells]


def test_without_a_failed_preflight_these_cells_launch_and_cancel() -> None:
    """The baseline the hold is measured against: the same cells submit, cancel-then-start, resume, and the
    running job near its walltime is cancelled."""
    planned = plan(RUN, CELLS, observations(), POLICY_HERE, NOW, preflight=Preflight(cluster="hpc1"))
    assert kinds(planned) == [{ActionKind.SUBMIT}, {ActionKind.CANCEL, ActionKind.SUBMIT}, {ActionKind.RESUME},
                              {ActionKind.CANCEL}]
    assert planned.preflight == "" and all(c.rule != Rule.PREFLIGHT_FAILED for c in planned.cells)


def test_a_failed_preflight_holds_every_launch_with_its_reason_and_keeps_the_rest() -> None:
    planned = plan(RUN, CELLS, observations(), POLICY_HERE, NOW, preflight=FAILED)

    fresh, queued, resumable, running = planned.cells
    for held in (fresh, queued, resumable):
        assert held.rule == Rule.PREFLIGHT_FAILED and held.rule.value == "PreflightFailed"
        assert [a.kind for a in held.actions] == [ActionKind.HOLD], held.actions
        assert "partition gpu-a100 does not exist on hpc1 (sinfo lists: debug, gpu)" in held.reason
        assert held.actions[0].reason == "no launch on hpc1 until its preflight passes"
    assert running.rule == Rule.PRE_WALLTIME and [a.kind for a in running.actions] == [ActionKind.CANCEL], \
        "a live job is still watched and cancelled by its own rules"
    assert planned.preflight.startswith("the preflight of hpc1 failed: partition gpu-a100")

    status = summarize(planned)
    stalled = status.condition("Stalled")
    assert stalled is not None and stalled.reason == "PreflightFailed" and "gpu-a100" in stalled.message
    ready = status.condition("Ready")
    assert ready is not None and ready.reason == "PreflightFailed"


def test_fresh_cells_past_the_first_share_the_held_plan() -> None:
    many = tuple(cell(model=f"org/m{i}-8B") for i in range(50))
    planned = plan(RUN, many, [obs() for _ in many], POLICY_HERE, NOW, preflight=FAILED)
    assert {c.rule for c in planned.cells} == {Rule.PREFLIGHT_FAILED}
    assert [c.cell.model for c in planned.cells] == [c.model for c in many]
    assert all(a.kind == ActionKind.HOLD for c in planned.cells for a in c.actions)


def test_a_preflight_that_could_not_run_makes_launches_wait_not_hold() -> None:
    unknown = Preflight(cluster="hpc1", unobserved="sinfo failed on hpc1: Unable to contact slurm controller")
    planned = plan(RUN, CELLS, observations(), POLICY_HERE, NOW, preflight=unknown)
    fresh = planned.cells[0]
    assert fresh.rule == Rule.PREFLIGHT_FAILED and [a.kind for a in fresh.actions] == [ActionKind.WAIT]
    assert "could not run: sinfo failed" in fresh.reason
    assert planned.preflight == "", "nothing for a human to fix yet: no Stalled condition"
    assert summarize(planned).condition("Stalled") is None


def test_suspend_still_wins_over_nothing_and_a_hold_stays_a_hold() -> None:
    planned = plan(RUN, (FRESH,), [obs()], POLICY_HERE.model_copy(update={"suspend": True}), NOW, preflight=FAILED)
    assert [a.kind for a in planned.cells[0].actions] == [ActionKind.HOLD]


class Cluster:
    """A cluster whose queue and run dirs are empty (or whose queue read fails), counting its preflights."""

    def __init__(self, preflight: Preflight | ObservationError, queue: ObservationError | None = None):
        self.answer, self.queue, self.preflights = preflight, queue, 0

    def observe(self, *_: object) -> tuple[()]:
        if self.queue is not None:
            raise self.queue
        return ()

    def usable_nodes(self) -> None:
        return None

    def preflight(self) -> Preflight:
        self.preflights += 1
        if isinstance(self.answer, ObservationError):
            raise self.answer
        return self.answer


@pytest.mark.parametrize(("answer", "queue", "reads", "planned"), [
    (FAILED, None, 1, FAILED),
    (ObservationError("ssh to hpc1 failed (exit 255)"), None, 1,
     Preflight(cluster="hpc1", unobserved="ssh to hpc1 failed (exit 255)")),
    (FAILED, ObservationError("squeue exited 1"), 0, None),
])
def test_a_pass_reads_the_preflight_once_per_cluster_and_not_without_a_queue(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, answer: Any, queue: Any, reads: int,
        planned: Preflight | None) -> None:
    seen: list[Preflight | None] = []

    def planning(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs["preflight"])
        return real(*args, **kwargs)

    real = lanes.plan
    monkeypatch.setattr(lanes, "plan", planning)
    cluster = Cluster(answer, queue)
    ports = ClusterPorts(scheduler=cluster, run_dirs=cluster, actor_for=None,  # type: ignore[arg-type]
                         submissions_per_minute=6, preflight=cluster.preflight)
    targets = [RunTarget(evalrun=name, cluster="hpc1", cells=(cell(),), policy=POLICY_HERE) for name in ("a", "b")]
    state = SqliteStore(tmp_path / "store.db")

    reconcile_pass(targets, Store(state, state), {ClusterRef(name="hpc1"): ports}, NOW, act=False)
    state.close()

    assert cluster.preflights == reads
    assert seen == [planned, planned]


def test_a_suspended_evalrun_first_on_the_cluster_does_not_spare_the_next_one_its_preflight(
        tmp_path: Path) -> None:
    cluster = Cluster(FAILED)
    ports = ClusterPorts(scheduler=cluster, run_dirs=cluster, actor_for=None,  # type: ignore[arg-type]
                         submissions_per_minute=6, preflight=cluster.preflight)
    suspended = RunTarget(evalrun="a", cluster="hpc1", cells=(cell(),),
                          policy=POLICY_HERE.model_copy(update={"suspend": True}))
    active = RunTarget(evalrun="b", cluster="hpc1", cells=(cell(),), policy=POLICY_HERE)
    state = SqliteStore(tmp_path / "store.db")

    _, second = reconcile_pass([suspended, active], Store(state, state), {ClusterRef(name="hpc1"): ports}, NOW,
                               act=False)
    state.close()

    assert cluster.preflights == 1
    assert second.plan.cells[0].rule == Rule.PREFLIGHT_FAILED and second.plan.preflight
