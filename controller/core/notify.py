"""Notifications, the pure part: what a pass knows holds (facts), which of it is new (transitions), and the words.

A transition is a subject (a cell, or the EvalRun itself) entering a state it was not in at the last pass that
knew: a cell entering Failed or Completed, the EvalRun's `Ready` or `Stalled` condition becoming True. Each entry
is an *episode*, numbered per subject and state; a message is queued once per (episode, webhook), so repeating a
pass, a restart or a second reconciler never queues it twice. What a pass does not know (an Unknown cell; the
EvalRun's conditions while any cell is Unknown, but a Stalled that holds anyway) neither opens nor closes one.

The first recording of an EvalRun is a baseline: what already holds then is recorded, not announced (turning
notifications on for a finished EvalRun of 500 cells sends nothing).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from enum import StrEnum

from pydantic import Field

from controller.core.status import RunStatus
from controller.core.types import EvalRunRef, Frozen
from controller.core.vocabulary import CellPlan, Phase, Plan

EVALRUN_SUBJECT = ""  # the subject of the EvalRun's own events (a cell's is its key)
NOTIFICATION_IDS = uuid.UUID("4c0f3e52-8f0b-4f8e-9a51-6e6f74696679")
DETAIL_MAX = 1_000
ATTENTION_IN_MESSAGE = 5


class NotifyEvent(StrEnum):
    STALLED = "Stalled"  # the EvalRun's Stalled condition became True (a cell needs a human, or actions failed)
    FAILED = "Failed"  # a cell entered Failed: a hold (a gate, refires exhausted, …) that waits for a human
    COMPLETED = "Completed"  # a cell entered Completed: its result is uploaded and verified
    READY = "Ready"  # the EvalRun's Ready condition became True: every cell Completed


CELL_EVENTS = {Phase.FAILED: NotifyEvent.FAILED, Phase.COMPLETED: NotifyEvent.COMPLETED}


class DeliveryState(StrEnum):
    PENDING = "pending"
    DELIVERED = "delivered"
    GIVEN_UP = "given_up"


class Fact(Frozen):
    """Whether one subject is in one state, as this pass knows it."""

    subject: str = Field(description="a cell key, or EVALRUN_SUBJECT")
    label: str = Field(description="what a person reads: 'org/m × bench' or 'EvalRun ns/name'")
    event: NotifyEvent
    holds: bool | None = Field(description="None: this pass does not know")
    detail: str = ""


class Episode(Frozen):
    """A subject's latest stay in a state, as recorded: its number (0: never entered) and whether it goes on."""

    subject: str
    event: NotifyEvent
    episode: int
    active: bool


class Queued(Frozen):
    """A message to queue: one webhook's copy of one transition."""

    id: str
    webhook: str
    fact: Fact
    episode: int


class Notification(Frozen):
    """A queued message as the store holds it."""

    id: str
    evalrun: EvalRunRef
    webhook: str
    subject: str
    label: str
    event: NotifyEvent
    episode: int
    detail: str
    state: DeliveryState
    attempts: int = 0
    last_error: str = ""
    claimed_by: str | None = None
    created_at: datetime


def facts(plan: Plan, status: RunStatus) -> tuple[Fact, ...]:
    """What the pass knows of every cell (Failed, Completed) and of the EvalRun (Ready, Stalled)."""
    found = []
    for cell in plan.cells:
        known = cell.phase != Phase.UNKNOWN
        for phase, event in CELL_EVENTS.items():
            holds = cell.phase == phase if known else None
            detail = cell.reason if phase == Phase.FAILED or cell.score is None else _score_detail(cell)
            found.append(Fact(subject=cell.cell.key, label=cell.cell.label, event=event, holds=holds,
                              detail=_clip(detail) if holds else ""))
    everything_known = status.counts[Phase.UNKNOWN] == 0
    label = f"EvalRun {plan.evalrun}"
    ready, stalled = status.condition("Ready"), status.condition("Stalled")
    ready_holds = ready is not None and ready.status == "True"
    found.append(Fact(subject=EVALRUN_SUBJECT, label=label, event=NotifyEvent.READY,
                      holds=True if ready_holds else False if everything_known else None,
                      detail=ready.message if ready is not None and ready_holds else ""))
    stalled_holds = stalled is not None and stalled.status == "True"
    found.append(Fact(subject=EVALRUN_SUBJECT, label=label, event=NotifyEvent.STALLED,
                      holds=True if stalled_holds else False if everything_known else None,
                      detail=_stalled_detail(status) if stalled_holds else ""))
    return tuple(found)


def transitions(evalrun: EvalRunRef, recorded: Mapping[tuple[str, NotifyEvent], Episode], found: Sequence[Fact],
                webhooks: Mapping[NotifyEvent, Sequence[str]]) -> tuple[list[Episode], list[Queued]]:
    """The episodes to write and the messages to queue, from what was recorded and what the pass found.

    A fact that holds opens the next episode unless the current one goes on; one that no longer holds closes it.
    The EvalRun's own episodes are written even before it ever entered a state (episode 0): they are how a later
    recording knows it is not the first, the baseline, whose transitions are recorded but not announced."""
    baseline = not any(subject == EVALRUN_SUBJECT for subject, _ in recorded)
    changed: list[Episode] = []
    queued: list[Queued] = []
    for fact in found:
        current = recorded.get((fact.subject, fact.event))
        if fact.holds and (current is None or not current.active):
            episode = (current.episode if current else 0) + 1
            changed.append(Episode(subject=fact.subject, event=fact.event, episode=episode, active=True))
            if not baseline:
                queued += [Queued(id=notification_id(evalrun, name, fact, episode), webhook=name, fact=fact,
                                  episode=episode) for name in webhooks.get(fact.event, ())]
        elif fact.holds is False and current is not None and current.active:
            changed.append(current.model_copy(update={"active": False}))
        elif current is None and fact.subject == EVALRUN_SUBJECT and not fact.holds:
            changed.append(Episode(subject=fact.subject, event=fact.event, episode=0, active=False))
    return changed, queued


def notification_id(evalrun: EvalRunRef, webhook: str, fact: Fact, episode: int) -> str:
    """Deterministic: the same transition queued twice (a repeated pass, two reconcilers) is one message."""
    return str(uuid.uuid5(NOTIFICATION_IDS, "\x1f".join((str(evalrun), webhook, fact.subject, fact.event,
                                                         str(episode)))))


def headline(notification: Notification) -> str:
    """The message's one line: what entered which state, and why."""
    what = {NotifyEvent.STALLED: "is Stalled", NotifyEvent.FAILED: "Failed",
            NotifyEvent.COMPLETED: "Completed", NotifyEvent.READY: "is Ready"}[notification.event]
    where = "" if notification.subject == EVALRUN_SUBJECT else f" (EvalRun {notification.evalrun})"
    detail = f": {notification.detail}" if notification.detail else ""
    return f"{notification.label}{where} {what}{detail}"


def undelivered_note(notifications: Sequence[Notification]) -> str:
    """What status says about messages not (yet) delivered, per webhook; "" when every one went out."""
    parts = []
    for webhook in sorted({n.webhook for n in notifications}):
        mine = [n for n in notifications if n.webhook == webhook]
        given_up = [n for n in mine if n.state == DeliveryState.GIVEN_UP]
        retrying = [n for n in mine if n.state == DeliveryState.PENDING and n.attempts]
        waiting = len(mine) - len(given_up) - len(retrying)
        said = [f"{len(given_up)} given up after {max(n.attempts for n in given_up)} attempt(s)"] if given_up else []
        said += [f"{len(retrying)} retrying"] if retrying else []
        said += [f"{waiting} waiting"] if waiting else []
        last = next((n.last_error for n in reversed(mine) if n.last_error), "")
        parts.append(f"webhook {webhook}: {', '.join(said)}" + (f" (last error: {last})" if last else ""))
    return "; ".join(parts)


def _score_detail(cell: CellPlan) -> str:
    """'score 0.412 (provisional, n=36)': never a score without how far it can be trusted (RULES §14)."""
    return f"score {cell.score:.4g}" + (f" ({cell.trust_note})" if cell.trust_note else "")


def _stalled_detail(status: RunStatus) -> str:
    stalled = status.condition("Stalled")
    lines = [stalled.message if stalled else ""]
    lines += [f"{a.model} × {a.benchmark}: {a.phase.value}: {a.reason}" for a in status.attention
              if a.phase in (Phase.FAILED, Phase.STALLED)][:ATTENTION_IN_MESSAGE]
    return _clip("; ".join(line for line in lines if line))


def _clip(text: str) -> str:
    return text if len(text) <= DETAIL_MAX else text[:DETAIL_MAX - 1] + "…"
