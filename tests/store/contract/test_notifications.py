"""The notification outbox: transitions queue one message each, however often they are recorded; a message has one
sender at a time; its attempts, back-off and giving up are the store's to keep (by the store's clock)."""

from __future__ import annotations

from controller.core.notify import EVALRUN_SUBJECT, DeliveryState, Fact, NotifyEvent
from controller.core.ports import ControllerState
from controller.core.types import EvalRunRef

RUN = EvalRunRef(namespace="lab", name="run-a")
OTHER = EvalRunRef(name="run-b")
HOOKS = {event: ("team",) for event in NotifyEvent}


def cell_fact(key: str, event: NotifyEvent, holds: bool | None) -> Fact:
    return Fact(subject=key, label=f"{key} × tb2", event=event, holds=holds, detail="score 0.5" if holds else "")


def run_fact(event: NotifyEvent, holds: bool | None) -> Fact:
    return Fact(subject=EVALRUN_SUBJECT, label=f"EvalRun {RUN}", event=event, holds=holds)


PENDING = [cell_fact("c1", NotifyEvent.COMPLETED, False), run_fact(NotifyEvent.READY, False)]
DONE = [cell_fact("c1", NotifyEvent.COMPLETED, True), run_fact(NotifyEvent.READY, True)]


def queued(state: ControllerState) -> list[str]:
    state.record_transitions(RUN, PENDING, HOOKS)
    return [n.id for n in state.record_transitions(RUN, DONE, HOOKS)]


def test_a_transition_queues_one_message_per_webhook_however_often_it_is_recorded(
        state_backend: ControllerState) -> None:
    assert state_backend.record_transitions(RUN, PENDING, HOOKS) == ()
    first = state_backend.record_transitions(RUN, DONE, HOOKS)
    again = state_backend.record_transitions(RUN, DONE, HOOKS)

    assert sorted((n.label, n.event, n.episode, n.state, n.detail) for n in first) == [
        ("EvalRun lab/run-a", NotifyEvent.READY, 1, DeliveryState.PENDING, ""),
        ("c1 × tb2", NotifyEvent.COMPLETED, 1, DeliveryState.PENDING, "score 0.5")]
    assert again == first, "recording the same transition again queues nothing"
    assert state_backend.read_notifications(RUN) == first
    assert state_backend.read_notifications(OTHER) == ()
    assert {n.evalrun for n in first} == {RUN}


def test_what_holds_at_the_first_recording_is_not_announced(state_backend: ControllerState) -> None:
    assert state_backend.record_transitions(RUN, DONE, HOOKS) == ()
    assert state_backend.record_transitions(RUN, [*DONE, cell_fact("c2", NotifyEvent.FAILED, True)], HOOKS)[0].label \
        == "c2 × tb2", "a cell first seen later is announced"


def test_a_message_has_one_sender_at_a_time(state_backend: ControllerState) -> None:
    message, _ = queued(state_backend)

    assert state_backend.claim_notification(message, "sender-a", 3600)
    assert not state_backend.claim_notification(message, "sender-b", 3600), "claimed: the other sender waits"
    assert state_backend.claim_notification(message, "sender-a", 3600), "its own claim, again"
    assert state_backend.claim_notification(message, "sender-b", 3600, take_from="sender-a"), "a dead sender's claim"
    state_backend.finish_notification(message, "sender-a", delivered=True)
    assert message in [n.id for n in state_backend.read_notifications(RUN)], "only the claim's holder finishes it"
    state_backend.finish_notification(message, "sender-b", delivered=True)

    assert message not in [n.id for n in state_backend.read_notifications(RUN)]
    assert not state_backend.claim_notification(message, "sender-c", 3600), "delivered: never sent again"


def test_an_expired_claim_is_free(state_backend: ControllerState) -> None:
    message, _ = queued(state_backend)

    assert state_backend.claim_notification(message, "sender-a", 0)
    assert state_backend.claim_notification(message, "sender-b", 3600)


def test_a_failed_attempt_waits_for_its_back_off_and_the_last_one_gives_up(state_backend: ControllerState) -> None:
    message, _ = queued(state_backend)

    state_backend.claim_notification(message, "sender", 3600)
    state_backend.finish_notification(message, "sender", delivered=False, error="HTTP 500", retry_in_s=3600)
    assert not state_backend.claim_notification(message, "sender", 3600), "not due before its back-off passed"
    [failed] = [n for n in state_backend.read_notifications(RUN) if n.id == message]
    assert (failed.state, failed.attempts, failed.last_error, failed.claimed_by) == (
        DeliveryState.PENDING, 1, "HTTP 500", None)

    state_backend.finish_notification(message, "nobody", delivered=False, error="x", retry_in_s=0)
    assert not state_backend.claim_notification(message, "sender", 3600), "an unclaimed finish changes nothing"


def test_a_due_retry_is_claimed_again_and_giving_up_is_final(state_backend: ControllerState) -> None:
    message, _ = queued(state_backend)

    state_backend.claim_notification(message, "sender", 3600)
    state_backend.finish_notification(message, "sender", delivered=False, error="ConnectError", retry_in_s=0)
    assert state_backend.claim_notification(message, "sender", 3600)
    state_backend.finish_notification(message, "sender", delivered=False, error="ConnectError")

    [given_up] = [n for n in state_backend.read_notifications(RUN) if n.id == message]
    assert (given_up.state, given_up.attempts) == (DeliveryState.GIVEN_UP, 2)
    assert not state_backend.claim_notification(message, "sender", 3600)
