"""Sending what passes queued (spec.notify): webhooks with a Slack-compatible body, from threads of their own.

A pass records transitions and queues their messages in the store (core/reconcile.py); it never waits for an
endpoint. After each pass the entry layer hands the notifier its EvalRuns' webhooks (URLs read from their
secretRefs just then) and wakes it. A sender thread per namespace, on a store of its own, reads its EvalRuns'
undelivered messages, claims one at a time (a compare-and-set in the store: two senders never both hold one), posts
it within a total deadline in a lane of its namespace and server (adapters/lanes.py: a server that trickles its
answer holds a thread of its own, never the sender), and records the outcome: delivered; or failed, due again after
a doubling back-off; or given up after `maxAttempts`, with a warning and a status note. A store or endpoint that is
down costs that thread a round, never a pass; a tenant's slow webhooks cost its own namespace's rounds only.

A webhook URL is a credential (Slack's carries its token in the path): it is held in an `Endpoint` whose repr hides
it, never logged, stored or put in a message; error texts are masked with it, and httpx's own request logs (which
print URLs) are kept quiet.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx

from controller.adapters.dialing import AddressCheck, RefusedAddress, dial_address
from controller.adapters.lanes import DeadlineExceeded, Lanes
from controller.adapters.secrets import SecretMask, mask_text
from controller.api.loader import SpecSet
from controller.api.tenancy import OperatorPolicy
from controller.api.urls import address_problem, under_prefix
from controller.core.actor import kill_point
from controller.core.notify import DeliveryState, Notification, headline
from controller.core.store import Store
from controller.core.types import EvalRunRef
from controller.entry.secrets import SecretSource

log = logging.getLogger("evalctl.notify")
for _noisy in ("httpx", "httpcore"):  # they log every request with its URL at INFO/DEBUG
    logging.getLogger(_noisy).setLevel(logging.WARNING)

TIMEOUT_S = 5.0  # one read of a POST, connect included
DEADLINE_S = 10.0  # one POST in all: a server trickling its answer is given up on, that round's rest of its run too
BACKOFF_S = 5.0  # after the first failure; doubling
BACKOFF_MAX_S = 600.0
CLAIM_S = 60.0  # far longer than a POST: a claim outlives only a sender that died holding it
POLL_S = 5.0  # how often the thread looks again for messages whose back-off has passed
FLUSH_S = 15.0  # how long `reconcile --once` / `--until-done` wait for the last messages before exiting
ID_HEADER = "X-EvalRun-Notification-Id"  # the same for every attempt: a receiver may drop a repeat


class Endpoint:
    """A webhook's URL, which `repr` never shows. `public_only`: a tenant's URL, dialled only at an address that
    passes the operator's policy when it is dialled (adapters/dialing.py)."""

    __slots__ = ("public_only", "url")

    def __init__(self, url: str, public_only: bool = False) -> None:
        self.url = url
        self.public_only = public_only

    def __repr__(self) -> str:
        return "Endpoint(***)"

    def mask(self) -> SecretMask:
        """Hides the URL and its path and query (an error may quote either), and every CLI secret."""
        parts = urlsplit(self.url)
        return SecretMask(values=[self.url, parts.path + (f"?{parts.query}" if parts.query else ""), parts.query])


@dataclass(frozen=True)
class RunWebhooks:
    """One EvalRun's webhooks as a pass hands them over: name → endpoint (one whose secret is missing is absent)."""

    evalrun: EvalRunRef
    endpoints: Mapping[str, Endpoint]
    max_attempts: int
    missing: tuple[str, ...] = field(default=(), compare=False)  # where to set each missing URL (never a value)


def webhooks_of(specs: SpecSet, secrets: SecretSource, policy: OperatorPolicy | None = None) -> list[RunWebhooks]:
    """The webhooks of every EvalRun with any, their URLs read now from `secrets`. With the operator's `policy`, a
    namespaced EvalRun's URL not under an `--allowed-webhook-url` is dialled only at a public address."""
    found = []
    for run in specs.evalruns:
        notify = run.run.spec.notify
        if not notify.webhooks:
            continue
        endpoints, missing = {}, []
        for hook in notify.webhooks:
            url = secrets.get(hook.secret_ref)
            if url:
                checked = policy is not None and run.ref.namespace is not None and not under_prefix(
                    url, policy.allowed_webhook_urls)
                endpoints[hook.name] = Endpoint(url, public_only=checked)
            else:
                missing.append(f"webhook {hook.name}: {secrets.where(hook.secret_ref)}")
        found.append(RunWebhooks(run.ref, endpoints, notify.max_attempts, tuple(missing)))
    return found


def slack_body(notification: Notification) -> dict[str, Any]:
    """Slack's incoming-webhook JSON: `text` (also what notifications show) and one mrkdwn section. What leaves for
    another service is masked once more (this process's secrets, token shapes), whatever its sources did."""
    text = _escaped(mask_text(headline(notification)))
    return {"text": text, "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": text}}]}


@dataclass
class _Sender:
    """One namespace's sender thread and its rounds (guarded by the notifier's condition)."""

    namespace: str
    wake: threading.Event = field(default_factory=threading.Event)
    started: int = 0
    finished: int = 0
    thread: threading.Thread | None = None


class Notifier:
    """Delivers queued messages on a thread per namespace, each started by the first `offer` of its namespace."""

    def __init__(self, open_store: Callable[[], Store], holder: str, *,
                 holder_is_dead: Callable[[str], bool] = lambda _: False, timeout_s: float = TIMEOUT_S,
                 backoff_s: float = BACKOFF_S, backoff_max_s: float = BACKOFF_MAX_S, poll_s: float = POLL_S,
                 claim_s: float = CLAIM_S, deadline_s: float = DEADLINE_S,
                 address_check: AddressCheck = address_problem) -> None:
        """`address_check`: where a `public_only` endpoint may be dialled (the operator's URL policy)."""
        self._open_store, self.holder, self._holder_is_dead = open_store, holder, holder_is_dead
        self._address_check = address_check
        self.backoff_s, self.backoff_max_s, self.poll_s, self.claim_s = backoff_s, backoff_max_s, poll_s, claim_s
        self._client = httpx.Client(timeout=timeout_s, follow_redirects=False)
        self._lanes = Lanes(deadline_s)
        self._orders: dict[EvalRunRef, RunWebhooks] = {}  # the latest per EvalRun: the queue is bounded by them
        self._said_missing: dict[EvalRunRef, tuple[str, ...]] = {}
        self._changed = threading.Condition()
        self._stop = threading.Event()
        self._senders: dict[str, _Sender] = {}

    def offer(self, runs: Iterable[RunWebhooks]) -> None:
        """Hand over the EvalRuns' webhooks and wake the senders; returns at once."""
        with self._changed:
            for run in runs:
                self._orders[run.evalrun] = run
                if run.missing and self._said_missing.get(run.evalrun) != run.missing:
                    log.warning("webhook URL not set; its messages wait", extra={
                        "evalrun": str(run.evalrun), "missing": "; ".join(run.missing)})
                self._said_missing[run.evalrun] = run.missing
            for namespace in sorted({_namespace(evalrun) for evalrun in self._orders} - self._senders.keys()):
                sender = self._senders[namespace] = _Sender(namespace)
                sender.thread = threading.Thread(target=self._work, args=(sender,), daemon=True,
                                                 name=f"evalctl-notify-{namespace[:40]}")
                sender.thread.start()
            senders = list(self._senders.values())
        for sender in senders:
            sender.wake.set()

    def flush(self, timeout_s: float = FLUSH_S) -> bool:
        """Wait until every sender has finished a round that starts after this call (at most `timeout_s` in all);
        False: one had not."""
        with self._changed:
            wanted = {sender.namespace: sender.started + 1 for sender in self._senders.values()}
            senders = list(self._senders.values())
        for sender in senders:
            sender.wake.set()
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while any(self._senders[namespace].finished < round_number for namespace, round_number in wanted.items()):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(left)
        return True

    def close(self) -> None:
        """Stop the senders after their current message (undelivered ones wait in the store for the next process)."""
        self._stop.set()
        with self._changed:
            senders = list(self._senders.values())
        for sender in senders:
            sender.wake.set()
        deadline = time.monotonic() + self._lanes.deadline_s + 1
        for sender in senders:
            if sender.thread is not None:
                sender.thread.join(max(deadline - time.monotonic(), 0))
        self._client.close()

    # ------------------------------------------------------------------ the threads

    def _work(self, sender: _Sender) -> None:
        store: Store | None = None
        try:
            while not self._stop.is_set():
                sender.wake.wait(self.poll_s)
                sender.wake.clear()
                with self._changed:
                    sender.started += 1
                    round_number = sender.started
                    orders = [order for evalrun, order in self._orders.items()
                              if _namespace(evalrun) == sender.namespace]
                try:
                    store = store or self._open_store()
                    for order in orders:
                        self._deliver(store, order)
                except Exception as exc:  # the store is down, or anything else: this round is lost, not the process
                    log.warning("notifications not sent this round; retried", extra={"error": _masked(exc, orders)})
                    _close(store)
                    store = None
                finally:
                    with self._changed:
                        sender.finished = round_number
                        self._changed.notify_all()
        finally:
            _close(store)

    def _deliver(self, store: Store, order: RunWebhooks) -> None:
        for message in store.state.read_notifications(order.evalrun):
            endpoint = order.endpoints.get(message.webhook)
            if self._stop.is_set() or message.state != DeliveryState.PENDING or endpoint is None:
                continue
            dead = message.claimed_by not in (None, self.holder) and self._holder_is_dead(message.claimed_by or "")
            if not store.state.claim_notification(message.id, self.holder, self.claim_s,
                                                  take_from=message.claimed_by if dead else None):
                continue  # not due yet, or another sender has it
            kill_point("notify-claimed")  # fault injection: claimed, not sent
            error = self._post(endpoint, message, _namespace(order.evalrun))
            self._record(store, order, message, error)
            if error.startswith(DeadlineExceeded.__name__):
                return  # its server is slow: the run's other messages wait for the next round, the other runs do not

    def _post(self, endpoint: Endpoint, message: Notification, namespace: str = "") -> str:
        """'' when the webhook took it (2xx), else why not, masked."""
        server = urlsplit(endpoint.url)
        headers = {ID_HEADER: message.id, "X-EvalRun-Event": message.event.value}

        def post() -> httpx.Response:
            if not endpoint.public_only:
                return self._client.post(endpoint.url, json=slack_body(message), headers=headers)
            host, port = server.hostname or "", server.port or (443 if server.scheme == "https" else 80)
            address = dial_address(host, port, self._address_check)  # resolved once, here, and checked
            pinned = server._replace(netloc=f"[{address}]:{port}" if ":" in address else f"{address}:{port}")
            return self._client.post(pinned.geturl(), json=slack_body(message),
                                     headers={**headers, "Host": server.netloc.rpartition("@")[2]},
                                     extensions={"sni_hostname": host})

        try:
            response = self._lanes.call(f"{namespace} {server.hostname}:{server.port}", post)
        except DeadlineExceeded as exc:  # our own words: no answer within the deadline
            return f"{type(exc).__name__}: {exc}"
        except RefusedAddress as exc:  # the host's own name and the policy: no part of the URL's path
            return f"{type(exc).__name__}: {exc}"
        except OSError as exc:  # the name did not resolve when dialled
            return type(exc).__name__
        except httpx.HTTPError as exc:  # refused, timed out, TLS, …: its text may quote the URL or what came back
            log.debug("webhook post failed", extra={"webhook": message.webhook,
                                                    "error": endpoint.mask()(f"{type(exc).__name__}: {exc}")})
            return type(exc).__name__
        return "" if response.is_success else f"HTTP {response.status_code}"  # never its body: the URL is a tenant's

    def _record(self, store: Store, order: RunWebhooks, message: Notification, error: str) -> None:
        where = {"evalrun": str(order.evalrun), "webhook": message.webhook, "event": message.event.value,
                 "subject": message.label}
        if not error:
            store.state.finish_notification(message.id, self.holder, delivered=True)
            log.info("webhook message delivered", extra=where)
            return
        attempts = message.attempts + 1
        if attempts >= order.max_attempts:
            store.state.finish_notification(message.id, self.holder, delivered=False, error=error)
            log.warning("webhook message given up", extra={**where, "attempts": attempts, "error": error})
            return
        retry_in = min(self.backoff_s * 2 ** (attempts - 1), self.backoff_max_s)
        store.state.finish_notification(message.id, self.holder, delivered=False, error=error, retry_in_s=retry_in)
        log.info("webhook message failed; retried", extra={**where, "attempts": attempts, "error": error,
                                                            "retry_in_s": retry_in})


def _namespace(evalrun: EvalRunRef) -> str:
    return evalrun.namespace or ""


def _escaped(text: str) -> str:
    """Slack reads &, < and > as markup (links, mentions): as text they are escaped."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _masked(exc: BaseException, orders: Iterable[RunWebhooks]) -> str:
    text = f"{type(exc).__name__}: {exc}"
    for order in orders:
        for endpoint in order.endpoints.values():
            text = endpoint.mask()(text)
    return text


def _close(store: Store | None) -> None:
    if store is not None:
        try:
            store.close()
        except Exception as exc:  # closing a store that went away must not end the thread
            log.info("could not close the notifier's store", extra={"error": str(exc)})
