"""Every plan a test of the core makes is also checked against validation: `built_plan` skips pydantic's validation
of a CellPlan the planner assembled from valid parts, so here each one is built both ways and must be the same."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from controller.core.planner import view
from controller.core.vocabulary import CellPlan

_built = view.built_plan


def _checked(values: dict[str, Any]) -> CellPlan:
    validated = CellPlan(**values)
    plan = _built(dict(values))
    assert plan == validated
    assert plan.model_fields_set == validated.model_fields_set
    assert plan.model_dump() == validated.model_dump()
    assert {k: type(v) for k, v in plan.__dict__.items()} == {k: type(v) for k, v in validated.__dict__.items()}
    return plan


@pytest.fixture(autouse=True)
def _plans_as_validated(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(view, "built_plan", _checked)
    yield
