"""RULES §13: a held cell a human asked to retry (`evalctl retry`, the `evalrun.io/retry` annotation) is released
once: one new attempt through the submission protocol (§12), whatever hold it was in. Its history stays: the old
attempts' submissions, rows, run dirs and remembered remedies are not touched; its refires count afresh from it
(`CellView.retried_from`), and a new attempt's run dir has fires of its own.
"""

from __future__ import annotations

from collections.abc import Callable

from controller.core.actions import Hold, Submit
from controller.core.retry import RetryRequest
from controller.core.vocabulary import CellPlan, Phase, Rule


def released(decided: CellPlan, request: RetryRequest | None, next_attempt: Callable[[], int]) -> CellPlan:
    """`decided` as it is without a pending request, and with one that is not for a hold (shown, kept for the
    hold it may meet); a held cell with one: a new attempt instead of the hold (its other actions, a quarantine
    the failure started, go on)."""
    if request is None:
        return decided
    if not decided.held:
        return decided.model_copy(update={"retry": request})
    attempt = next_attempt()
    reason = f"{request.line()} → attempt {attempt} (was held: {decided.reason})"
    kept = tuple(a for a in decided.actions if not isinstance(a, Hold))
    submit = Submit(run_tag=decided.cell.run_tag(attempt), attempt=attempt, reason=reason)
    return decided.model_copy(update={
        "phase": Phase.PENDING, "actions": (*kept, submit), "reason": reason, "rule": Rule.RETRY, "retry": request})
