"""Spec errors as `FILE:LINE:COL: message`, the format editors and CI annotations understand."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class SpecError:
    """One problem in one input file; line and col are 1-based."""

    file: str
    line: int
    col: int
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}: {self.message}"


class SpecErrors(Exception):
    """Every problem found in a set of inputs, so one run of `evalctl validate` shows them all."""

    def __init__(self, errors: Iterable[SpecError]) -> None:
        self.errors = list(errors)
        super().__init__(format_errors(self.errors))


def clip(text: str, limit: int = 64) -> str:
    """Quote user input in a message at most this long: a 1 MiB key must not become a 1 MiB error line."""
    return text if len(text) <= limit else f"{text[:limit - 1]}…"


def format_errors(errors: Iterable[SpecError]) -> str:
    return "\n".join(str(error) for error in errors)
