"""One operator pass for one EvalRun object: the SAME reconcile_pass as `evalctl reconcile`, fed from the API.

Specs come from the EvalRun and the EvalCluster it names (the loader's checks run on them as on files);
secrets from the namespace's Secrets; status from core/status.py's summarize(). A spec the loader refuses
becomes a Stalled status, never an exception: a crash loop helps nobody.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

from controller.adapters.kube import KubeApi, KubernetesSecrets
from controller.adapters.process import identity_is_dead
from controller.adapters.store import open_store, shareable_across_threads
from controller.core.reconcile import reconcile_pass, release_pass
from controller.core.status import RunStatus
from controller.core.store import Store
from controller.core.types import Frozen
from controller.core.vocabulary import Outcome
from controller.entry.kube_status import EventNote, aggregate_events, invalid_spec_patch, status_patch
from controller.entry.wiring import cluster_ports, targets_for
from controller.spec.catalog import load_catalog
from controller.spec.errors import SpecErrors
from controller.spec.loader import SpecSet, load_objects

REQUESTED_AT = "evalrun.io/requestedAt"


class OperatorConfig(Frozen):
    store_url: str
    state_url: str | None = None
    base_dir: Path
    interval_s: float
    holder: str


class PassReport(Frozen):
    status: dict[str, Any]
    events: tuple[EventNote, ...] = ()
    summary: RunStatus | None = None
    outcomes: tuple[Outcome, ...] = ()


class Stores:
    """The operator's store. One on database servers only is opened once and shared by every handler thread
    (their clients are thread-safe); one with a SQLite half is opened per pass, in the handler's thread."""

    def __init__(self, config: OperatorConfig) -> None:
        self.config = config
        self._shared: Store | None = None
        self._guard = threading.Lock()

    @contextmanager
    def open(self) -> Iterator[Store]:
        with self._guard:
            shared = self._shared
        if shared is not None:
            yield shared
            return
        store = open_store(self.config.store_url, state_url=self.config.state_url)
        if not shareable_across_threads(store):
            try:
                yield store
            finally:
                store.close()
            return
        with self._guard:
            if self._shared is None:
                self._shared = store
            elif self._shared is not store:  # another thread opened one first: use that, drop this one
                store.close()
            shared = self._shared
        yield shared

    def close(self) -> None:
        with self._guard:
            if self._shared is not None:
                self._shared.close()
                self._shared = None


class Passes:
    """Serialises passes per EvalRun inside this process (a timer and a change handler may fire together)."""

    def __init__(self) -> None:
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def lock(self, uid: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(uid, threading.Lock())


def reconcile_object(api: KubeApi, config: OperatorConfig, stores: Stores, body: Mapping[str, Any],
                     now: datetime) -> PassReport:
    meta = body.get("metadata", {})
    generation = meta.get("generation")
    previous = body.get("status")
    try:
        specs = _specs(api, config, body)
    except SpecErrors as exc:
        messages = [error.message for error in exc.errors]
        return PassReport(status=invalid_spec_patch(messages, generation, previous, now),
                          events=(EventNote(type="Warning", reason="InvalidSpec", message="; ".join(messages)[:1000]),))
    catalog = load_catalog()
    with stores.open() as store:
        [result] = reconcile_pass(targets_for(specs, catalog), store,
                                  cluster_ports(specs, store, catalog, KubernetesSecrets(api, meta["namespace"])),
                                  now, act=True, holder=config.holder, holder_is_dead=identity_is_dead)
    requested = (meta.get("annotations") or {}).get(REQUESTED_AT)
    return PassReport(status=status_patch(result.status, previous, now, requested_at=requested, note=result.note),
                      events=tuple(aggregate_events(result.outcomes)), summary=result.status, outcomes=result.outcomes)


def release_object(api: KubeApi, config: OperatorConfig, stores: Stores, body: Mapping[str, Any]) -> list[EventNote]:
    """The EvalRun is being deleted: cancel its live jobs if `deletionPolicy: Cancel`, and give up its cells.
    Returns the Events of the cancels.

    Raises when the queue cannot be read or a cancel failed, so the finalizer stays and the deletion is retried.
    """
    specs = _specs(api, config, body)
    catalog = load_catalog()
    [target] = targets_for(specs, catalog)
    with stores.open() as store:
        ports = cluster_ports(specs, store, catalog, KubernetesSecrets(api, body["metadata"]["namespace"]))
        return aggregate_events(release_pass(target, store, ports[target.cluster]))


def _specs(api: KubeApi, config: OperatorConfig, body: Mapping[str, Any]) -> SpecSet:
    namespace = body["metadata"]["namespace"]
    cluster_name = (body.get("spec") or {}).get("cluster")
    cluster = api.get("evalclusters", namespace, cluster_name) if isinstance(cluster_name, str) else None
    return load_objects([body, *([cluster] if cluster else [])], config.base_dir, load_catalog())
