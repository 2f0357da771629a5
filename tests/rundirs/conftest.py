"""Shared by the run-dir tests: what a pass reads from disk."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from controller.adapters.rundirs import localfs, tree


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every file path this process tries to read (workers are other processes), in order: what `read_file` was
    asked for and did not recall (a file it found unchanged is not read), missing ones included."""
    seen: list[str] = []
    real = localfs.read_file

    def counting(path: str, cap: int, recall: Callable[[localfs.StatKey], object] | None = None) -> localfs.FileRead:
        read = real(path, cap, recall)
        if read.known is None:
            seen.append(path)
        return read

    monkeypatch.setattr(localfs, "read_file", counting)
    monkeypatch.setattr(tree, "read_file", counting)
    return seen
