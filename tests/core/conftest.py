"""Every model a test of the core builds with `trusted` (a plan, a progress) is also checked against validation:
`trusted` skips pydantic's validation of a model assembled from valid parts, so here each one is built both ways
and must be the same."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, TypeVar

import pytest
from pydantic import BaseModel

from controller.core import progress, trusted
from controller.core.planner import view

Model = TypeVar("Model", bound=BaseModel)

_trusted = trusted.trusted


def _checked(cls: type[Model], values: dict[str, Any], fields_set: set[str]) -> Model:
    validated = cls(**values)
    built = _trusted(cls, dict(values), fields_set)
    assert built == validated
    assert built.model_fields_set == validated.model_fields_set
    assert built.model_dump() == validated.model_dump()
    assert {k: type(v) for k, v in built.__dict__.items()} == {k: type(v) for k, v in validated.__dict__.items()}
    return built


@pytest.fixture(autouse=True)
def _trusted_as_validated(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for module in (view, progress):
        monkeypatch.setattr(module, "trusted", _checked)
    yield
