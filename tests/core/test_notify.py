"""Which transitions a sequence of passes announces: facts() from plans, transitions() against what was recorded."""

from __future__ import annotations

from datetime import UTC, datetime

from controller.core.notify import (
    EVALRUN_SUBJECT,
    DeliveryState,
    Episode,
    Notification,
    NotifyEvent,
    facts,
    headline,
    transitions,
    undelivered_note,
)
from controller.core.status import summarize
from controller.core.types import EvalRunRef
from controller.core.vocabulary import CellPlan, Phase, Plan, Rule
from tests.core.builders import cell

RUN = EvalRunRef(name="run1")
T0 = datetime(2026, 1, 1, tzinfo=UTC)
C, P, R, F, U = Phase.COMPLETED, Phase.PENDING, Phase.RUNNING, Phase.FAILED, Phase.UNKNOWN
EVERY = {event: ("team",) for event in NotifyEvent}


def plan_of(*phases: Phase) -> Plan:
    cells = tuple(CellPlan(cell=cell(model=f"org/m{i}"), phase=phase, actions=(), reason=f"held: why {i}",
                           rule=Rule.IN_FLIGHT, score=0.5 if phase == C else None) for i, phase in enumerate(phases))
    return Plan(evalrun=RUN, cells=cells)


class Recorder:
    """What a store does with transitions(): keep the episodes, collect the queued messages (ids unique)."""

    def __init__(self, webhooks: dict[NotifyEvent, tuple[str, ...]] = EVERY) -> None:
        self.episodes: dict[tuple[str, NotifyEvent], Episode] = {}
        self.queued: dict[str, tuple[str, NotifyEvent, int]] = {}
        self.webhooks = webhooks

    def see(self, *phases: Phase) -> list[tuple[str, NotifyEvent]]:
        """One pass over cells in these phases; the (label, event) of each message it queues anew."""
        plan = plan_of(*phases)
        changed, queued = transitions(RUN, self.episodes, facts(plan, summarize(plan)), self.webhooks)
        self.episodes.update({(e.subject, e.event): e for e in changed})
        new = [q for q in queued if q.id not in self.queued]
        self.queued.update({q.id: (q.fact.label, q.fact.event, q.episode) for q in queued})
        return [(q.fact.label.split(" × ")[0], q.fact.event) for q in new]


def test_the_first_recording_is_a_baseline_and_later_entries_are_announced_once() -> None:
    notes = Recorder()
    assert notes.see(C, F) == [], "already so when notifications began: recorded, not announced"
    assert notes.see(C, F) == []
    assert notes.see(C, C) == [("org/m1", NotifyEvent.COMPLETED), ("EvalRun run1", NotifyEvent.READY)]
    assert notes.see(C, C) == [], "a state that goes on is not a new transition"


def test_a_fresh_evalrun_announces_each_cell_and_ready_once() -> None:
    notes = Recorder()
    assert notes.see(P, P) == []
    assert notes.see(R, F) == [("org/m1", NotifyEvent.FAILED), ("EvalRun run1", NotifyEvent.STALLED)]
    assert notes.see(C, F) == [("org/m0", NotifyEvent.COMPLETED)]
    assert notes.see(C, R) == [], "a refire leaves Failed and Stalled: nothing to say"
    assert notes.see(C, C) == [("org/m1", NotifyEvent.COMPLETED), ("EvalRun run1", NotifyEvent.READY)]


def test_leaving_and_entering_again_is_a_second_episode_with_its_own_message() -> None:
    notes = Recorder()
    notes.see(P)
    assert notes.see(F) == [("org/m0", NotifyEvent.FAILED), ("EvalRun run1", NotifyEvent.STALLED)]
    notes.see(R)
    assert notes.see(F) == [("org/m0", NotifyEvent.FAILED), ("EvalRun run1", NotifyEvent.STALLED)]
    assert sorted(episode for _, event, episode in notes.queued.values() if event == NotifyEvent.FAILED) == [1, 2]


def test_an_unknown_pass_neither_closes_nor_opens_an_episode() -> None:
    notes = Recorder()
    notes.see(P, P)
    assert notes.see(C, C)[-1] == ("EvalRun run1", NotifyEvent.READY)
    assert notes.see(C, U) == [], "the store could not be read: Ready is unknown, not False"
    assert notes.see(C, C) == [], "so Ready coming back is the same episode"
    assert notes.episodes[(EVALRUN_SUBJECT, NotifyEvent.READY)].episode == 1


def test_a_stalled_evalrun_is_known_even_while_some_cells_are_unknown() -> None:
    notes = Recorder()
    notes.see(P, P)
    assert notes.see(F, U) == [("org/m0", NotifyEvent.FAILED), ("EvalRun run1", NotifyEvent.STALLED)]


def test_only_the_webhooks_that_want_an_event_get_it_and_each_gets_its_own_copy() -> None:
    notes = Recorder({NotifyEvent.READY: ("team", "oncall"), NotifyEvent.FAILED: ("oncall",)})
    notes.see(P, P)
    notes.see(F, C)
    notes.see(C, C)
    sent = sorted((label.split(" × ")[0], event) for label, event, _ in notes.queued.values())
    assert sent == [("EvalRun run1", NotifyEvent.READY), ("EvalRun run1", NotifyEvent.READY),
                    ("org/m0", NotifyEvent.FAILED)]


def test_messages_say_what_happened_and_status_says_what_did_not_go_out() -> None:
    failed = Notification(id="n1", evalrun=RUN, webhook="team", subject="k", label="org/m0 × tb2",
                          event=NotifyEvent.FAILED, episode=1, detail="held: infra errors 40% > 20%",
                          state=DeliveryState.GIVEN_UP, attempts=8, last_error="HTTP 500", created_at=T0)
    waiting = failed.model_copy(update={"id": "n2", "state": DeliveryState.PENDING, "attempts": 0, "last_error": ""})

    assert headline(failed) == "org/m0 × tb2 (EvalRun run1) Failed: held: infra errors 40% > 20%"
    assert undelivered_note([failed, waiting]) == ("webhook team: 1 given up after 8 attempt(s), 1 waiting "
                                                   "(last error: HTTP 500)")
    assert undelivered_note([]) == ""


def test_a_completed_message_says_how_far_its_score_can_be_trusted() -> None:
    """A provisional or partial score never goes out as a bare number (RULES §14)."""
    flagged = plan_of(C, C, C)
    cells = (flagged.cells[0].model_copy(update={"n_scored": 36, "provisional": True}),
             flagged.cells[1].model_copy(update={"n_scored": 267, "provisional": False, "partial": True}),
             flagged.cells[2].model_copy(update={"n_scored": 267, "provisional": False}))
    found = facts(flagged.model_copy(update={"cells": cells}), summarize(flagged))

    details = [f.detail for f in found if f.event == NotifyEvent.COMPLETED]
    assert details == ["score 0.5 (provisional, n=36)", "score 0.5 (partial)", "score 0.5"]
