"""summarize(): the conditions a plan and its outcomes make, one row per situation (kstatus semantics)."""

from __future__ import annotations

import pytest

from controller.core.actions import Hold, Step
from controller.core.status import ATTENTION_LIMIT, summarize
from controller.core.vocabulary import CellPlan, Outcome, Phase, Plan, Rule
from tests.core.builders import cell


def plan_of(*phases: Phase, suspended: bool = False) -> Plan:
    cells = tuple(CellPlan(cell=cell(model=f"org/m{i}"), phase=phase, actions=(), reason=f"why {i}",
                           rule=Rule.IN_FLIGHT) for i, phase in enumerate(phases))
    return Plan(evalrun="run1", cells=cells, suspended=suspended)


C, P, R, F, U, S = (Phase.COMPLETED, Phase.PENDING, Phase.RUNNING, Phase.FAILED, Phase.UNKNOWN, Phase.STALLED)

ROWS = [
    # phases,            suspended, Ready (status, reason),          Reconciling,        Stalled
    ((C, C),             False, ("True", "AllCellsCompleted"),       None,               None),
    ((C, R),             False, ("False", "InProgress"),             "Progressing",      None),
    ((C, P),             True,  ("False", "Suspended"),              None,               None),
    ((C, F),             False, ("False", "CellsNeedAttention"),     None,               "CellsNeedAttention"),
    ((R, S),             False, ("False", "CellsNeedAttention"),     "Progressing",      "CellsNeedAttention"),
    ((C, U),             False, ("False", "ObservationFailed"),      "ObservationFailed", None),
    ((U, R),             False, ("False", "ObservationFailed"),      "Progressing",      None),
]


@pytest.mark.parametrize(("phases", "suspended", "ready", "reconciling", "stalled"), ROWS)
def test_conditions(phases, suspended, ready, reconciling, stalled):
    status = summarize(plan_of(*phases, suspended=suspended), generation=7)
    got = status.condition("Ready")
    assert got is not None and (got.status, got.reason) == ready and got.observed_generation == 7
    for kind, expected in (("Reconciling", reconciling), ("Stalled", stalled)):
        found = status.condition(kind)
        assert (found.reason if found else None) == expected, kind
        assert found is None or found.status == "True", "kstatus: present only while True"


def test_counts_include_every_phase_and_the_columns_add_up():
    status = summarize(plan_of(C, C, R, Phase.SUBMITTED, F, P))
    assert set(status.counts) == set(Phase) and status.counts[Phase.SETTLING] == 0
    assert (status.total, status.done, status.running, status.failed) == (6, 2, 2, 1)
    assert not status.settled and summarize(plan_of(C, F)).settled


def test_a_failed_action_stalls_and_puts_its_cell_on_the_attention_list():
    the_plan = plan_of(R, R)
    outcome = Outcome(cell=the_plan.cells[1].cell.label, key=the_plan.cells[1].cell.key, action=Step.SUBMIT, ok=False,
                      message="sbatch: error")
    status = summarize(the_plan, [outcome])
    stalled = status.condition("Stalled")
    assert stalled is not None and stalled.reason == "ActionsFailed" and status.failed_actions == 1
    assert [(a.model, a.reason) for a in status.attention] == [("org/m1", "submit failed: sbatch: error")]


def test_the_attention_list_is_bounded_and_says_how_many_it_left_out():
    status = summarize(plan_of(*([F] * (ATTENTION_LIMIT + 5))))
    assert len(status.attention) == ATTENTION_LIMIT and status.attention_omitted == 5
    assert status.attention[0].reason == "why 0"


def _held_launch(i: int = 9) -> CellPlan:
    """A Pending cell whose launch the GPU budget holds: its phase does not say it is held, its plan does."""
    return CellPlan(cell=cell(model=f"org/m{i}"), phase=P, actions=(Hold(reason="budget: 412 of 400 GPU-h"),),
                    reason="no existing job", rule=Rule.NO_EXISTING_JOB)


def test_a_launch_held_in_pending_needs_attention_with_its_hold_and_settles_the_run() -> None:
    done = plan_of(C)
    status = summarize(done.model_copy(update={"cells": (*done.cells, _held_launch())}))

    assert [(a.model, a.phase, a.reason) for a in status.attention] == [("org/m9", P, "budget: 412 of 400 GPU-h")]
    ready, stalled = status.condition("Ready"), status.condition("Stalled")
    assert ready is not None and ready.reason == "CellsNeedAttention"
    assert stalled is not None and stalled.message == "1 held"
    assert (status.held, status.held_unsettled) == (1, 1) and status.settled, "only a human moves it"


def test_a_held_launch_beside_a_running_cell_is_not_settled() -> None:
    running = plan_of(R)
    assert not summarize(running.model_copy(update={"cells": (*running.cells, _held_launch())})).settled


def test_a_suspended_evalrun_is_suspended_not_stalled_by_the_holds_suspend_makes() -> None:
    suspended = plan_of(C, suspended=True)
    status = summarize(suspended.model_copy(update={"cells": (*suspended.cells, _held_launch())}))

    ready = status.condition("Ready")
    assert ready is not None and ready.reason == "Suspended" and status.condition("Stalled") is None
    assert [a.model for a in status.attention] == ["org/m9"]
