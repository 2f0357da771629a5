"""The webhook sender against a real loopback HTTP server: one Slack-shaped message per transition, retries with
back-off after a 500, giving up on an endpoint that refuses, never holding up a pass, and the URL never shown."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.adapters.store.sqlite import SqliteStore
from controller.core.notify import EVALRUN_SUBJECT, DeliveryState, Fact, NotifyEvent
from controller.core.store import Store
from controller.core.types import EvalRunRef
from controller.entry.webhooks import Endpoint, Notifier, RunWebhooks
from tests.fixtures.evalctl import wait_until
from tests.fixtures.webhook import SECRET_PATH, Webhook, refusing_url, webhook_server

RUN = EvalRunRef(name="nightly")
HOOKS = {event: ("team",) for event in NotifyEvent}


def facts(ready: bool, completed: bool) -> list[Fact]:
    return [Fact(subject="c1", label="org/a-8B × tiny_a", event=NotifyEvent.COMPLETED, holds=completed,
                 detail="score 0.625" if completed else ""),
            Fact(subject=EVALRUN_SUBJECT, label=f"EvalRun {RUN}", event=NotifyEvent.READY, holds=ready,
                 detail="1/1 cells completed and uploaded" if ready else "")]


@pytest.fixture
def store_path(tmp_path: Path) -> Path:
    return tmp_path / "store.db"


@pytest.fixture
def queued(store_path: Path) -> Path:
    """A store with two messages queued: the cell's Completed and the EvalRun's Ready."""
    store = SqliteStore(store_path)
    store.record_transitions(RUN, facts(False, False), HOOKS)
    assert len(store.record_transitions(RUN, facts(True, True), HOOKS)) == 2
    store.close()
    return store_path


def notifier_on(path: Path, **options: float) -> Notifier:
    def open_store() -> Store:
        backend = SqliteStore(path)
        return Store(backend, backend)

    return Notifier(open_store, "test:1:1", poll_s=options.pop("poll_s", 0.05), **options)


@pytest.fixture
def hook() -> Iterator[Webhook]:
    with webhook_server() as server:
        yield server


def undelivered(path: Path) -> list:
    store = SqliteStore(path)
    try:
        return list(store.read_notifications(RUN))
    finally:
        store.close()


def test_each_transition_is_posted_once_with_a_slack_body(queued: Path, hook: Webhook) -> None:
    notifier = notifier_on(queued)
    try:
        notifier.offer([RunWebhooks(RUN, {"team": Endpoint(hook.url)}, max_attempts=3)])
        wait_until(lambda: not undelivered(queued), "both messages delivered")
        notifier.offer([RunWebhooks(RUN, {"team": Endpoint(hook.url)}, max_attempts=3)])
        assert notifier.flush(10)
    finally:
        notifier.close()

    texts = sorted(m.body["text"] for m in hook.messages())
    assert texts == ["EvalRun nightly is Ready: 1/1 cells completed and uploaded",
                     "org/a-8B × tiny_a (EvalRun nightly) Completed: score 0.625"]
    assert all(m.body["blocks"][0]["text"]["text"] == m.body["text"] for m in hook.messages())
    assert len({m.id for m in hook.messages()}) == 2 and len(hook.attempts()) == 2, "nothing sent twice"


def test_a_500_is_retried_after_its_back_off_and_then_delivered(queued: Path, hook: Webhook) -> None:
    hook.statuses.extend([500, 500])
    notifier = notifier_on(queued, backoff_s=0.05)
    try:
        notifier.offer([RunWebhooks(RUN, {"team": Endpoint(hook.url)}, max_attempts=3)])
        wait_until(lambda: not undelivered(queued), "both messages delivered after their 500s")
    finally:
        notifier.close()

    assert [a.status for a in hook.attempts()][:2] == [500, 500]
    assert len(hook.messages()) == 2 and len({m.id for m in hook.messages()}) == 2
    failed_first = hook.attempts()[0].id
    assert failed_first in {m.id for m in hook.messages()}, "the failed message went out on a later attempt"


def test_an_endpoint_that_refuses_is_given_up_with_a_warning_and_its_url_is_never_shown(
        queued: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    with refusing_url() as url:
        notifier = notifier_on(queued, backoff_s=0.01)
        try:
            notifier.offer([RunWebhooks(RUN, {"team": Endpoint(url)}, max_attempts=3)])
            wait_until(lambda: {n.state for n in undelivered(queued)} == {DeliveryState.GIVEN_UP},
                       "both messages given up")
        finally:
            notifier.close()

    given_up = undelivered(queued)
    assert [n.attempts for n in given_up] == [3, 3]
    assert {n.last_error for n in given_up} == {"ConnectError"}, given_up
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and r.name == "evalctl.notify"]
    assert [r.getMessage() for r in warnings] == ["webhook message given up"] * 2
    logged = "\n".join(f"{r.getMessage()} {vars(r)}" for r in caplog.records)
    stored = (queued.read_bytes() + b"".join(p.read_bytes() for p in queued.parent.glob("store.db-*")))
    for text in (logged, repr(given_up), repr(Endpoint(url))):
        assert SECRET_PATH not in text and url not in text
    assert SECRET_PATH.encode() not in stored


def test_a_pass_never_waits_for_an_endpoint_that_hangs(queued: Path, hook: Webhook) -> None:
    hook.hold = threading.Event()
    notifier = notifier_on(queued)
    try:
        notifier.offer([RunWebhooks(RUN, {"team": Endpoint(hook.url)}, max_attempts=3)])
        assert hook.in_flight.wait(10), "the sender is inside a POST the endpoint does not answer"
        # a pass meanwhile: it records and reads the outbox in the store, while the sender's claim is held
        store = SqliteStore(queued)
        again = store.record_transitions(RUN, facts(True, True), HOOKS)
        store.close()
        notifier.offer([RunWebhooks(RUN, {"team": Endpoint(hook.url)}, max_attempts=3)])
        assert len(again) == 2 and not hook.messages(), "the pass went on while the POST hung"
        hook.hold.set()
        wait_until(lambda: not undelivered(queued), "both delivered once the endpoint answers")
    finally:
        hook.hold.set()
        notifier.close()
    assert len(hook.messages()) == 2


def test_a_webhook_whose_url_is_missing_waits_and_says_where_to_set_it(
        queued: Path, caplog: pytest.LogCaptureFixture) -> None:
    notifier = notifier_on(queued)
    try:
        order = RunWebhooks(RUN, {}, max_attempts=3, missing=("webhook team: set EVALCTL_SECRET_SLACK_URL",))
        notifier.offer([order])
        notifier.offer([order])
        assert notifier.flush(10)
    finally:
        notifier.close()

    assert [n.state for n in undelivered(queued)] == [DeliveryState.PENDING] * 2
    said = [r for r in caplog.records if r.name == "evalctl.notify" and r.levelno == logging.WARNING]
    assert len(said) == 1 and "EVALCTL_SECRET_SLACK_URL" in said[0].missing, "said once, not every pass"


BODY = b"ami-id: i-0123 internal-metadata-4f1c"  # what a metadata service or an internal API would answer


def test_what_an_endpoint_answers_is_never_stored_only_its_status(queued: Path, hook: Webhook,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    """A tenant names the URL: echoing an error answer's body into status would let it read any service the
    operator reaches (issue 27)."""
    caplog.set_level(logging.DEBUG)
    hook.statuses.extend([500] * 4)
    hook.answer = BODY
    notifier = notifier_on(queued, backoff_s=0.01)
    try:
        notifier.offer([RunWebhooks(RUN, {"team": Endpoint(hook.url)}, max_attempts=2)])
        wait_until(lambda: {n.state for n in undelivered(queued)} == {DeliveryState.GIVEN_UP}, "both given up")
    finally:
        notifier.close()

    given_up = undelivered(queued)
    assert {n.last_error for n in given_up} == {"HTTP 500"}
    stored = queued.read_bytes() + b"".join(p.read_bytes() for p in queued.parent.glob("store.db-*"))
    assert b"internal-metadata" not in stored
    assert all("internal-metadata" not in f"{r.getMessage()} {vars(r)}" for r in caplog.records)


def test_a_tenants_trickling_webhook_holds_only_its_own_namespaces_sender(store_path: Path, hook: Webhook) -> None:
    """The hostile namespace's post is in flight (its server answers a byte a second, the deadline is far off)
    while the victim namespace's message is delivered: one sender per namespace."""
    from tests.fixtures.trickle import http_server

    hostile, victim = EvalRunRef(namespace="hostile", name="run"), EvalRunRef(namespace="victim", name="run")
    store = SqliteStore(store_path)
    for run in (hostile, victim):
        store.record_transitions(run, facts(False, False), HOOKS)
        store.record_transitions(run, facts(True, True), HOOKS)
    store.close()
    notifier = notifier_on(store_path, deadline_s=60)
    with http_server(trickle_every_s=1) as slow:
        try:
            notifier.offer([RunWebhooks(hostile, {"team": Endpoint(slow.url + "/hook")}, max_attempts=3)])
            assert slow.requested.wait(20), "the hostile namespace's post is in flight"
            notifier.offer([RunWebhooks(victim, {"team": Endpoint(hook.url)}, max_attempts=3)])
            wait_until(lambda: len(hook.messages()) == 2, "the victim's two messages delivered meanwhile", timeout_s=20)
            assert not slow.served.is_set()
        finally:
            notifier._stop.set()
    notifier.close()


def test_a_tenants_webhook_is_dialled_only_at_an_address_the_policy_allows_when_dialled(queued: Path,
                                                                                        hook: Webhook) -> None:
    """DNS rebinding: the pass's check saw a public address; when dialled, `localhost` is 127.0.0.1. The name is
    resolved once at the dial, that address checked and connected to, the name kept in Host (and SNI)."""
    named = hook.url.replace("127.0.0.1", "localhost")
    guarded = notifier_on(queued)
    message = undelivered(queued)[0]
    refused = guarded._post(Endpoint(named, public_only=True), message)
    guarded.close()
    assert refused.startswith("RefusedAddress: localhost reaches 127.0.0.1, a loopback address"), refused
    assert "s3cr3t" not in refused and hook.attempts() == [], "nothing dialled, no part of the URL's path said"

    allowing = notifier_on(queued, address_check=lambda address: "")
    delivered = allowing._post(Endpoint(named, public_only=True), message)
    allowing.close()
    assert delivered == ""
    [received] = hook.messages()
    assert received.headers["Host"] == f"localhost:{hook.port}", "the URL's own host, not the pinned address"
