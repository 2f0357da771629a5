"""Shared by the run-dir tests: what a pass reads from disk."""

from __future__ import annotations

import pytest

from controller.adapters.rundirs import tree


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every file path this process reads from disk (workers are other processes), in order."""
    seen: list[str] = []
    real = tree.read_local

    def counting(path: str, cap: int) -> tuple[tree.Content | None, float | None]:
        seen.append(path)
        return real(path, cap)

    monkeypatch.setattr(tree, "read_local", counting)
    return seen
