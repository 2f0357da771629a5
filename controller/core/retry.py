"""A human's lever on a held cell (RULES §13): a retry request, and what the planner reads of a cell's requests.

A request is recorded by `evalctl retry` or the operator's `evalrun.io/retry` annotation and read with the
controller state. It is *pending* until the first new attempt of its cell (a submission of fire 1) is recorded
after it: the store marks it consumed in the same transaction as that attempt's intent, so a crash either leaves
it pending (nothing was recorded: the next pass releases the hold again) or consumed with its attempt's intent
(the submission protocol finishes that one attempt). Never twice, never lost (RULES §12).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from datetime import datetime

from pydantic import Field

from controller.core.types import Cell, EvalRunRef, Frozen


class RetryRequest(Frozen):
    """One request to release a cell's hold once: who asked, when, why; and the attempt that consumed it."""

    id: str = Field(description="unique; the operator derives it from the annotation's token, so a retried "
                                "recording is a no-op")
    cell_key: str
    evalrun: EvalRunRef = Field(description="the EvalRun it was asked through")
    requested_by: str = Field(description="the OS user of `evalctl retry`, or the annotation that asked")
    requested_at: datetime
    reason: str = ""
    consumed_by: str | None = Field(None, description="the submission of the new attempt that released it")
    consumed_attempt: int | None = Field(None, description="that submission's attempt number")
    consumed_at: datetime | None = None

    @property
    def pending(self) -> bool:
        return self.consumed_by is None

    def line(self) -> str:
        why = f": {self.reason}" if self.reason else ""
        return f"retry requested by {self.requested_by} at {self.requested_at:%Y-%m-%d %H:%M} UTC{why}"


def request_id(evalrun: EvalRunRef, cell_key: str, token: str) -> str:
    """The id of the request `token` makes for a cell: the same token twice is one request."""
    return hashlib.sha256(f"{evalrun}\0{cell_key}\0{token}".encode()).hexdigest()[:32]


def pending_request(requests: Sequence[RetryRequest]) -> RetryRequest | None:
    """The oldest request not consumed yet (one new attempt consumes every pending request of the cell)."""
    waiting = [r for r in requests if r.pending]
    return min(waiting, key=lambda r: (r.requested_at, r.id)) if waiting else None


def retried_from(requests: Sequence[RetryRequest]) -> int:
    """The attempt the newest consumed request started (0: never retried). Refires count from it: a retry gives the
    cell fresh bounds, the attempts before it stay in its history."""
    return max((r.consumed_attempt or 0 for r in requests if not r.pending), default=0)


def retry_command(spec_args: Sequence[str], cell: Cell) -> str:
    """The exact command that releases a held cell (what `status` and `explain` print); `spec_args`: the words that
    name its specs and store, as the command that prints it was given them (`-f FILE`, `--store URL`)."""
    return f"evalctl retry {' '.join(_quoted(a) for a in spec_args)} {_quoted(cell.model)} " \
           f"{_quoted(cell.benchmark)} --reason \"...\""


def _quoted(word: str) -> str:
    safe = all(c.isalnum() or c in "-_./:=@+" for c in word)
    return word if safe and word else "'" + word.replace("'", "'\"'\"'") + "'"
