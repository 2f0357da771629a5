"""Retry requests (RULES §13): recorded once, read with the state of their cell, consumed by the first new attempt
of the cell in the transaction that records its intent, and never by a resume or a repeated intent."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from controller.core.observed import Submission
from controller.core.ports import ControllerState
from controller.core.retry import RetryRequest, pending_request, request_id, retried_from
from controller.core.types import EvalRunRef

T0 = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
HOUR = 3600.0
RUN = EvalRunRef(namespace="lab", name="run-a")


def request(ident: str, cell_key: str = "cell-a", minutes: int = 0) -> RetryRequest:
    return RetryRequest(id=ident, cell_key=cell_key, evalrun=RUN, requested_by="alice",
                        requested_at=T0 + timedelta(minutes=minutes), reason="script path fixed")


def attempt(n: int, fire: int = 1, cell_key: str = "cell-a") -> Submission:
    return Submission(name=f"ev_x_{n}_f{fire}", run_tag=f"ev_x_{n}", evalrun=RUN, cell_key=cell_key, attempt=n,
                      fire=fire, created_at=T0 + timedelta(hours=1))


def retries(state: ControllerState, *cell_keys: str) -> tuple[RetryRequest, ...]:
    return state.read_state(RUN, list(cell_keys), HOUR).retries


def test_a_request_is_recorded_once_and_read_with_its_cell(state_backend: ControllerState) -> None:
    assert state_backend.request_retry(request("r1"))
    assert not state_backend.request_retry(request("r1").model_copy(update={"reason": "again"}))
    state_backend.request_retry(request("r2", cell_key="cell-b"))

    (found,) = retries(state_backend, "cell-a")
    assert found == request("r1"), "who, when and why read back as recorded; the second recording changed nothing"
    assert found.pending and pending_request([found]) == found
    assert [r.id for r in retries(state_backend, "cell-a", "cell-b")] == ["r1", "r2"]


def test_the_first_new_attempt_consumes_every_pending_request_of_its_cell(state_backend: ControllerState) -> None:
    state_backend.request_retry(request("r1"))
    state_backend.request_retry(request("r2", minutes=1))
    state_backend.request_retry(request("other", cell_key="cell-b"))

    state_backend.record_submission(attempt(2))

    consumed = {r.id: r for r in retries(state_backend, "cell-a", "cell-b")}
    assert {i: (r.consumed_by, r.consumed_attempt) for i, r in consumed.items()} == {
        "r1": ("ev_x_2_f1", 2), "r2": ("ev_x_2_f1", 2), "other": (None, None)}
    assert consumed["r1"].consumed_at is not None
    assert retried_from(tuple(consumed.values())) == 2


def test_a_resume_or_a_repeated_intent_consumes_nothing(state_backend: ControllerState) -> None:
    state_backend.record_submission(attempt(1))
    state_backend.request_retry(request("r1"))

    state_backend.record_submission(attempt(1))  # the crash repair records the same intent again
    state_backend.record_submission(attempt(1, fire=2))  # a resume of the same attempt is no new attempt

    (still,) = retries(state_backend, "cell-a")
    assert still.pending
    state_backend.record_submission(attempt(2))
    assert not retries(state_backend, "cell-a")[0].pending


def test_a_later_request_waits_for_a_later_attempt(state_backend: ControllerState) -> None:
    state_backend.request_retry(request("r1"))
    state_backend.record_submission(attempt(2))
    state_backend.request_retry(request("r2", minutes=90))

    found = retries(state_backend, "cell-a")
    assert [(r.id, r.pending) for r in found] == [("r1", False), ("r2", True)]
    assert pending_request(found) == found[1] and retried_from(found) == 2


def test_a_token_names_one_request_per_cell() -> None:
    assert request_id(RUN, "cell-a", "t1") == request_id(RUN, "cell-a", "t1")
    assert len({request_id(RUN, "cell-a", "t1"), request_id(RUN, "cell-a", "t2"),
                request_id(RUN, "cell-b", "t1")}) == 3
