"""summarize(): the conditions a plan and its outcomes make, one row per situation (kstatus semantics)."""

from __future__ import annotations

import pytest

from controller.core.status import ATTENTION_LIMIT, summarize
from controller.core.vocabulary import CellPlan, Outcome, Phase, Plan, Rule, Step
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
