"""Every model a test of the core builds with `trusted` (a plan, a progress) is also checked against validation:
`trusted` skips pydantic's validation of a model assembled from valid parts, so here each one is built both ways
and must be the same. Every module of the core that took `trusted` by name is patched, whichever it is."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any, TypeVar

import pytest
from pydantic import BaseModel

import controller.core.planner  # noqa: F401  (loads every builder of a plan and a progress before modules are looked at)
from controller.core import trusted

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
    users = [module for name, module in list(sys.modules.items())
             if name.startswith("controller.core.") and getattr(module, "trusted", None) is _trusted]
    assert users, "no module of the core builds with trusted: this check would check nothing"
    for module in users:
        monkeypatch.setattr(module, "trusted", _checked)
    yield
