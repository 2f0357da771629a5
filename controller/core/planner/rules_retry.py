"""RULES §13: a held cell a human asked to retry (`evalctl retry`, the `evalrun.io/retry` annotation) is released
once: one new attempt through the submission protocol (§12), whatever hold it was in. Its history stays: the old
attempts' submissions, rows, run dirs and remembered remedies are not touched; its refires count afresh from it
(`CellView.retried_from`), and a new attempt's run dir has fires of its own.
"""

from __future__ import annotations

from controller.core.planner.view import CellView
from controller.core.vocabulary import CellPlan, Hold, Phase, Rule


def released(view: CellView, decided: CellPlan) -> CellPlan:
    """`decided` as it is without a pending request, and with one that is not for a hold (shown, kept for the
    hold it may meet); a held cell with one: a new attempt instead of the hold (its other actions, a quarantine
    the failure started, go on)."""
    request = view.retry
    if request is None:
        return decided
    if not decided.held:
        return decided.model_copy(update={"retry": request})
    attempt = view.next_attempt()
    reason = f"{request.line()} → attempt {attempt} (was held: {decided.reason})"
    kept = tuple(a for a in decided.actions if not isinstance(a, Hold))
    return decided.model_copy(update={
        "phase": Phase.PENDING, "actions": (*kept, view.submit(attempt, reason)), "reason": reason,
        "rule": Rule.RETRY, "retry": request})
