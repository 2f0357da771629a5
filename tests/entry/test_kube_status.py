"""Conditions keep their transition time while unchanged — only a time that is one of ours (issue 18: a garbage
`lastTransitionTime` patched into status by someone else was kept for ever)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from controller.core.status import Condition
from controller.entry.kube_status import conditions_patch

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
