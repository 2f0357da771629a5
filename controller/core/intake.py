"""Which models a `modelSelector` adds to its EvalRun: the rule `query_unevaled_models.py` ran by hand, as data.

Pure. Candidates are the results DB's registered models; the rule filters them (globs, size band, age, exclude),
newest first, and keeps those still unevaluated, up to the limit less what the EvalRun selected before.
Selection is sticky: what was selected is recorded in the controller state and stays a cell, so a model that
leaves the window, or that someone else evaluates meanwhile, is never dropped half-way (the planner then sees
the other user's row and starts nothing).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from functools import cached_property

from pydantic import Field

from controller.core.observed import Observation
from controller.core.types import Frozen


class RegisteredModel(Frozen):
    """A row of the results DB's `models` table, as the selector reads it."""

    name: str
    created_at: datetime | None = Field(None, description="models.creation_time (None: unknown, never 'recent')")


class Candidate(Frozen):
    name: str
    created_at: datetime | None
    size_b: float | None = Field(description="billions of parameters as the size policy reads the name")


class Selection(Frozen):
    """One model a selector took, as the controller state records it."""

    model: str
    rule: str = Field(description="the rule that took it, in words: shown by plan, status and explain")
    selected_at: datetime


class SelectorRule(Frozen):
    name_patterns: tuple[str, ...] = ("*",)
    min_b: float | None = None
    max_b: float | None = None
    created_within: timedelta | None = None
    unevaluated: bool = True
    exclude: tuple[str, ...] = ()
    limit: int

    @cached_property
    def included(self) -> re.Pattern[str]:
        return _globs(self.name_patterns)

    @cached_property
    def excluded(self) -> re.Pattern[str] | None:
        return _globs(self.exclude) if self.exclude else None

    def admits(self, candidate: Candidate, now: datetime) -> bool:
        """Name, size and age; whether it is evaluated is read separately (it costs a DB read)."""
        if not self.included.match(candidate.name) or (self.excluded and self.excluded.match(candidate.name)):
            return False
        if self.min_b is not None or self.max_b is not None:
            if candidate.size_b is None:
                return False
            if not (self.min_b or 0) <= candidate.size_b <= (self.max_b if self.max_b is not None else float("inf")):
                return False
        if self.created_within is not None:
            return candidate.created_at is not None and now - candidate.created_at <= self.created_within
        return True

    def describe(self) -> str:
        parts = [f"names {', '.join(self.name_patterns)}"]
        if self.min_b is not None or self.max_b is not None:
            parts.append(f"{self.min_b or 0:g}–{self.max_b:g}B" if self.max_b is not None else f"≥{self.min_b:g}B")
        if self.created_within is not None:
            parts.append(f"registered within {_span(self.created_within)}")
        if self.unevaluated:
            parts.append("unevaluated")
        return "newest " + ", ".join(parts)


def admitted(rule: SelectorRule, candidates: Iterable[Candidate], taken: set[str], now: datetime) -> list[Candidate]:
    """The candidates the rule admits that are not taken yet (listed or selected before), newest first."""
    seen: set[str] = set()
    chosen = []
    for candidate in candidates:
        if candidate.name in taken or candidate.name in seen or not rule.admits(candidate, now):
            continue
        seen.add(candidate.name)
        chosen.append(candidate)
    floor = datetime.min.replace(tzinfo=now.tzinfo)
    by_name = sorted(chosen, key=lambda c: c.name)  # ties in age: by name (sorted is stable)
    return sorted(by_name, key=lambda c: c.created_at or floor, reverse=True)


def selections(rule: SelectorRule, chosen: Sequence[Candidate], now: datetime) -> list[Selection]:
    """The records of what this pass takes: each names the rule in words, for plan, status and explain."""
    return [Selection(model=c.name, rule=rule.describe(), selected_at=now) for c in chosen]


def unevaluated_models(models_of_cells: Sequence[str], observations: Sequence[Observation]) -> set[str]:
    """Models with at least one cell that has no Finished row with metrics (whoever wrote it).

    `observations`: the cells' rows as `join_cells` matched them (families and config), in the cells' order."""
    unevaluated: set[str] = set()
    for model, observation in zip(models_of_cells, observations, strict=True):
        scored = any(row.job_status == "Finished" and row.has_metrics for row in observation.rows or ())
        if not scored:
            unevaluated.add(model)
    return unevaluated


def _globs(patterns: Iterable[str]) -> re.Pattern[str]:
    """Shell globs, case ignored as Hugging Face ignores it in repo ids."""
    return re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in patterns), re.IGNORECASE)


def _span(delta: timedelta) -> str:
    hours = delta.total_seconds() / 3600
    return f"{hours / 24:g}d" if hours % 24 == 0 else f"{hours:g}h"
