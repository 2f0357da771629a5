"""Conditions keep their transition time while unchanged — only a time that is one of ours (issue 18: a garbage
`lastTransitionTime` patched into status by someone else was kept for ever)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from controller.core.intake import Selection
from controller.core.planner import plan
from controller.core.remedies import Quarantined, QuarantineKind
from controller.core.status import Condition, summarize
from controller.core.vocabulary import PassNotes, Phase
from controller.core.walltime import learned
from controller.entry.kube_status import conditions_patch, status_patch
from tests.core.builders import POLICY, RUN, cell, obs
from tests.core.test_status import plan_of

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
READY = Condition(type="Ready", status="True", reason="AllCellsCompleted", message="", observed_generation=1)


def _previous(transition: object) -> dict[str, object]:
    return {"conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": transition}]}


def test_an_unchanged_condition_keeps_its_transition_time() -> None:
    [rendered] = conditions_patch([READY], _previous("2026-11-30T08:00:00Z"), NOW)
    assert rendered["lastTransitionTime"] == "2026-11-30T08:00:00Z"


@pytest.mark.parametrize("garbage", ["yesterday", "9999-01-01T00:00:00Z", 123, None, "2026-11-30T08:00:00+05:00"])
def test_a_transition_time_that_is_not_ours_is_replaced(garbage: object) -> None:
    [rendered] = conditions_patch([READY], _previous(garbage), NOW)
    assert rendered["lastTransitionTime"] == "2026-12-01T12:00:00Z"


def test_a_changed_condition_moves_its_transition_time() -> None:
    previous = {"conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": "2026-11-30T08:00:00Z"}]}
    [rendered] = conditions_patch([READY], previous, NOW)
    assert rendered["lastTransitionTime"] == "2026-12-01T12:00:00Z"


def test_the_status_counts_what_a_model_selector_took() -> None:
    taken = tuple(Selection(model=f"org/m{i}-8B", rule="newest names org/*", selected_at=NOW) for i in range(2))
    cells = [cell(model=s.model) for s in taken]
    the_plan = plan(RUN, cells, [obs() for _ in cells], POLICY, NOW)
    notes = PassNotes(selections=taken, intake="selected 2 new model(s): org/m0-8B, org/m1-8B")
    patch = status_patch(summarize(the_plan, notes=notes), None, NOW)
    assert patch["modelSelector"] == {"selected": 2, "note": "selected 2 new model(s): org/m0-8B, org/m1-8B"}
    plain = status_patch(summarize(the_plan), None, NOW)
    assert plain["modelSelector"] is None, "a merge patch's null: no selector, no key"


def test_the_status_lists_every_effect_in_force_with_its_cause_start_end_and_owner() -> None:
    back_off = Quarantined(kind=QuarantineKind.CLUSTER, scope="c1", name="c1", reason="hf-hub-rate-limit: …",
                           since=NOW, until=NOW + timedelta(minutes=10), owner="team-a/sweep")
    the_plan = plan(RUN, [cell()], [obs()], POLICY.model_copy(update={"cluster": "c1"}), NOW, quarantined=(back_off,))

    patched = status_patch(summarize(the_plan), None, NOW)

    assert patched["effects"] == [{"kind": "back-off", "subject": "c1", "cause": "hf-hub-rate-limit: …",
                                   "since": "2026-12-01T12:00:00Z", "until": "2026-12-01T12:10:00Z",
                                   "owner": "team-a/sweep"}]


def test_a_multi_cluster_status_counts_cells_per_cluster_and_says_where_an_attention_cell_is() -> None:
    the_plan = plan_of(Phase.COMPLETED, Phase.FAILED, Phase.COMPLETED)
    keys = [c.cell.key for c in the_plan.cells]
    placed = the_plan.model_copy(update={"clusters": {keys[0]: "ns/a", keys[1]: "ns/b", keys[2]: "ns/b"}})

    status = status_patch(summarize(placed), None, NOW)
    alone = status_patch(summarize(the_plan), None, NOW)

    assert status["summary"]["clusters"] == {"ns/a": 1, "ns/b": 2}
    assert [(a["model"], a["cluster"]) for a in status["attention"]] == [("org/m1", "ns/b")]
    assert alone["summary"]["clusters"] is None, "one cluster: the key is dropped (a merge patch's null)"
    assert "cluster" not in alone["attention"][0], "one cluster: its items are as before"


def test_the_status_says_how_the_sized_jobs_fared_and_drops_the_key_with_a_fixed_walltime() -> None:
    learnt = learned([(2.0, 2.8)] * 5)
    auto = POLICY.model_copy(update={"walltime": POLICY.walltime.model_copy(update={"auto": True, "learnt": learnt})})

    sized = status_patch(summarize(plan(RUN, [cell()], [obs()], auto, NOW)), None, NOW)
    fixed = status_patch(summarize(plan(RUN, [cell()], [obs()], POLICY, NOW)), None, NOW)

    assert sized["walltime"] == "walltime auto: 5 sized job(s) ran 1.40× their estimate (p90 1.40×); margin 1.75 (learnt)"
    assert fixed["walltime"] is None, "a merge patch's null: fixed walltime, no key"
