"""Servers a tenant names get a total deadline and a lane of their own: a server that trickles its answer a byte
every 0.5 s (each read well within its timeout) is given up on, and another server is served meanwhile.

Ordering is asserted with events, never durations: the deadlines are small so the tests end soon.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime

import httpx
import pytest

from controller.adapters.lanes import DeadlineExceeded, Lanes
from controller.adapters.tracker.mlflow import MlflowTracker
from controller.core.notify import DeliveryState, Notification, NotifyEvent
from controller.core.ports import ObservationError
from controller.core.types import EvalRunRef
from controller.entry.webhooks import Endpoint, Notifier
from tests.fixtures.trickle import http_server

TRICKLE_S = 0.5
DEADLINE_S = 2.0


def test_a_trickling_server_is_given_up_on_while_another_lane_is_served():
    lanes = Lanes(DEADLINE_S)
    client = httpx.Client(timeout=5)
    outcome: list[BaseException] = []
    with http_server(trickle_every_s=TRICKLE_S) as slow, http_server(trickle_every_s=None) as fast:
        def call_slow() -> None:
            try:
                lanes.call("slow", lambda: client.get(slow.url))
            except BaseException as exc:
                outcome.append(exc)

        caller = threading.Thread(target=call_slow)
        caller.start()
        assert slow.requested.wait(10)
        answer = lanes.call("fast", lambda: client.get(fast.url))
        served_while_slow_waited = caller.is_alive()
        caller.join(30)

    assert answer.status_code == 200 and served_while_slow_waited
    assert not caller.is_alive() and len(outcome) == 1 and isinstance(outcome[0], DeadlineExceeded)
    assert f"no complete answer within {DEADLINE_S:g} s" in str(outcome[0])


def test_the_next_call_in_a_held_lane_gives_up_too():
    lanes = Lanes(0.2)
    release = threading.Event()
    with pytest.raises(DeadlineExceeded):
        lanes.call("a", release.wait)
    with pytest.raises(DeadlineExceeded, match="an earlier call to the same server was still running"):
        lanes.call("a", lambda: "never")
    assert lanes.call("b", lambda: "other lanes go on") == "other lanes go on"
    release.set()


def test_a_call_s_own_errors_are_its_own():
    with pytest.raises(ZeroDivisionError):
        Lanes(5).call("a", lambda: 1 // 0)
    with pytest.raises(TimeoutError, match="its own") as caught:
        Lanes(5).call("a", lambda: (_ for _ in ()).throw(TimeoutError("its own")))
    assert not isinstance(caught.value, DeadlineExceeded)


def message() -> Notification:
    return Notification(id="n1", evalrun=EvalRunRef(namespace="hostile", name="run"), webhook="slow", subject="run",
                        label="run", event=NotifyEvent.READY, episode=1, detail="", state=DeliveryState.PENDING,
                        created_at=datetime.now(UTC))


def test_a_webhook_that_trickles_fails_at_the_deadline_and_the_next_one_is_delivered():
    notifier = Notifier(lambda: pytest.fail("no store here"), "test:1:1", deadline_s=DEADLINE_S)
    with http_server(trickle_every_s=TRICKLE_S) as slow, http_server(trickle_every_s=None) as fast:
        error = notifier._post(Endpoint(slow.url + "/hook"), message())
        delivered = notifier._post(Endpoint(fast.url + "/hook"), message())
    notifier.close()

    assert error.startswith("DeadlineExceeded: no complete answer within 2 s"), error
    assert delivered == "" and fast.served.is_set()


def test_an_mlflow_server_that_trickles_is_unreadable_at_the_deadline():
    with http_server(trickle_every_s=TRICKLE_S) as slow:
        tracker = MlflowTracker(slow.url, timeout_s=5, retries=0, deadline_s=DEADLINE_S)
        with pytest.raises(ObservationError, match=r"no complete answer within 2 s \(the deadline of one call\)"):
            tracker.read_back("experiment", "ev_tag", "alice")
        assert slow.requested.is_set()
