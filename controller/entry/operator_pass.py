"""One operator pass for one EvalRun object: the SAME reconcile_pass as `evalctl reconcile`, fed from the API.

Specs come from the EvalRun and the EvalCluster(s) it names (the loader's checks run on them as on files);
secrets from the namespace's Secrets; status from core/status.py's summarize(). A spec the loader refuses
becomes a Stalled status, never an exception: a crash loop helps nobody.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import Field

from controller.adapters.kube import KubeApi, KubernetesSecrets
from controller.adapters.process import identity_is_dead
from controller.adapters.store import open_store, shareable_across_threads
from controller.api.catalog import Catalog, load_catalog
from controller.api.errors import SpecError, SpecErrors
from controller.api.evalcluster import ClusterEvalCluster
from controller.api.evalrun import asks_to_cancel
from controller.api.grants import grant_refusal, unloadable_refusal
from controller.api.loader import SpecSet, load_objects, object_label, parse_resource
from controller.api.tenancy import NamespaceQuota, OperatorPolicy
from controller.core.cluster_view import ClusterPorts
from controller.core.ports import ObservationError
from controller.core.reconcile import release_pass
from controller.core.status import RunStatus
from controller.core.store import CELL_OWNER_TTL, Store
from controller.core.types import ClusterRef, EvalRunRef, Frozen
from controller.core.vocabulary import Outcome
from controller.entry.egress import egress_refusals
from controller.entry.kube_status import EventNote, aggregate_events, invalid_spec_patch, status_patch
from controller.entry.operator_nodes import publish_nodes
from controller.entry.operator_retry import annotated_retry, release_hints
from controller.entry.passes import pass_targets, run_pass
from controller.entry.webhooks import Notifier, webhooks_of
from controller.entry.wiring import cluster_ports

REQUESTED_AT = "evalrun.io/requestedAt"
Named = tuple[str, str | None, str]  # a cluster as the API names it: (plural, namespace or None, name)


class OperatorConfig(Frozen):
    store_url: str
    state_url: str | None = None
    base_dir: Path
    interval_s: float
    holder: str
    policy: OperatorPolicy = OperatorPolicy()
    namespace: str = Field("evalrun-system", description="the operator's own: the Secrets of ClusterEvalClusters")
    pass_timeout_s: float = Field(120.0, gt=0, description="a pass not finished by then is Unknown (--pass-timeout)")
    quota: NamespaceQuota = NamespaceQuota()


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


def reconcile_object(api: KubeApi, config: OperatorConfig, stores: Stores, body: Mapping[str, Any],
                     now: datetime, notifier: Notifier | None = None) -> PassReport:
    meta = body.get("metadata", {})
    generation = meta.get("generation")
    previous = body.get("status")
    clusters = _clusters(api, body)
    secrets = KubernetesSecrets(api, meta["namespace"])
    try:
        _check_grants(api, body, clusters)
        specs = _specs(config, body, clusters)
        if refused := egress_refusals(specs, secrets, config.policy):
            raise SpecErrors(refused)
    except SpecErrors as exc:
        messages = [error.message for error in exc.errors]
        return PassReport(status=invalid_spec_patch(messages, generation, previous, now),
                          events=(EventNote(type="Warning", reason="InvalidSpec", message="; ".join(messages)[:1000]),))
    catalog = load_catalog()
    with stores.open() as store:
        [result] = run_pass(specs, store, now, act=True, catalog=catalog,
                            ports=_ports(api, config, specs, store, catalog, meta["namespace"]),
                            holder=config.holder, holder_is_dead=identity_is_dead)
        for ref in specs.evalruns[0].cluster_refs:
            publish_nodes(api, store, ref, (clusters.get(_named(ref)) or {}).get("status"))
        retried = annotated_retry(store, body, result.plan.cells, now)  # released by the next pass
    if notifier is not None:  # the sender's thread delivers what the pass queued; the URLs are the namespace's
        notifier.offer(webhooks_of(specs, secrets, config.policy))
    requested = (meta.get("annotations") or {}).get(REQUESTED_AT)
    status = release_hints(status_patch(result.status, previous, now, requested_at=requested, note=result.note),
                           result.plan.cells, meta)
    events = tuple(aggregate_events(result.outcomes))
    if retried is not None:
        status, events = {**status, **retried[0]}, (*events, retried[1])
    return PassReport(status=status, events=events, summary=result.status, outcomes=result.outcomes)


def operator_notifier(config: OperatorConfig) -> Notifier:
    """The operator's webhook sender: one thread, on a store of its own."""
    return Notifier(lambda: open_store(config.store_url, state_url=config.state_url), config.holder,
                    holder_is_dead=identity_is_dead)


def release_object(api: KubeApi, config: OperatorConfig, stores: Stores, body: Mapping[str, Any]) -> list[EventNote]:
    """The EvalRun is being deleted: cancel its live jobs if `deletionPolicy: Cancel`, and give up its cells.
    Returns the Events of the cancels.

    Raises when the queue cannot be read or a cancel failed, so the finalizer stays and the deletion is retried;
    and for a spec that no longer loads only when its jobs are to be cancelled (which cluster is then unknown):
    orphaned, its cells are given up at once (a policy refusal or typo never holds a deletion). On a
    ClusterEvalCluster that does not grant its namespace nothing is cancelled there: its cells are given up.
    With several clusters, each one's live jobs are cancelled on it.
    """
    clusters = _clusters(api, body)
    try:
        _check_grants(api, body, clusters)
    except SpecErrors as exc:
        _give_up_cells(stores, body)
        return [EventNote(type="Warning", reason="NotCancelled", message=exc.errors[0].message[:1000])]
    try:
        specs = _specs(config, body, clusters)
    except SpecErrors:
        if asks_to_cancel(body):
            raise
        _give_up_cells(stores, body)
        return []
    catalog = load_catalog()
    with stores.open() as store:
        [target] = pass_targets(specs, catalog, store, datetime.now(UTC), act=False, select_new=False)
        if target.unknown:  # which jobs are its own is not known: retry rather than cancel too few
            raise ObservationError(target.unknown)
        ports = _ports(api, config, specs, store, catalog, body["metadata"]["namespace"])
        return aggregate_events(release_pass(target, store, ports))


def _give_up_cells(stores: Stores, body: Mapping[str, Any]) -> None:
    meta = body["metadata"]
    with stores.open() as store:
        store.state.claim_cells(EvalRunRef(namespace=meta["namespace"], name=meta["name"]), [],
                                CELL_OWNER_TTL.total_seconds())


def _check_grants(api: KubeApi, body: Mapping[str, Any], clusters: Mapping[Named, Mapping[str, Any]]) -> None:
    """Raise SpecErrors when the EvalRun names a ClusterEvalCluster that does not grant its namespace (one error per
    such cluster): checked before anything of the clusters is used, so none of the admin's Secrets is read for them.
    A ClusterEvalCluster that does not load is left to the loader to report to the namespaces it names, and unusable
    to the others."""
    namespace = body["metadata"]["namespace"]
    refused = [why for named, cluster in clusters.items()
               if named[0] == "clusterevalclusters" and (why := _grant_refusal(api, cluster, namespace))]
    if refused:
        raise SpecErrors([SpecError(object_label(body), 1, 1, why) for why in refused])


def _grant_refusal(api: KubeApi, cluster: Mapping[str, Any], namespace: str) -> str:
    try:
        parsed = parse_resource(cluster, object_label(cluster))
    except SpecErrors:
        return unloadable_refusal(cluster, namespace)
    if not isinstance(parsed, ClusterEvalCluster):
        return ""
    return grant_refusal(parsed, namespace, lambda: api.namespace_labels(namespace))


def _ports(api: KubeApi, config: OperatorConfig, specs: SpecSet, store: Store, catalog: Catalog,
           namespace: str) -> dict[ClusterRef, ClusterPorts]:
    """The adapters as a tenant's EvalRun gets them: its namespace's Secrets (a ClusterEvalCluster's are the
    operator's), errors of remote hosts without their raw text, the operator's MLflow login only where allowed."""
    return cluster_ports(specs, store, catalog, KubernetesSecrets(api, namespace), public_errors=True,
                         admin_secrets=KubernetesSecrets(api, config.namespace),
                         allowed_mlflow_uri=config.policy.ambient_mlflow_login)


def _clusters(api: KubeApi, body: Mapping[str, Any]) -> dict[Named, dict[str, Any]]:
    """The clusters an EvalRun names that exist, as the API has them; the loader names each one missing."""
    found = {named: api.get(*named) for named in clusters_of(body)}
    return {named: cluster for named, cluster in found.items() if cluster is not None}


def _specs(config: OperatorConfig, body: Mapping[str, Any], clusters: Mapping[Named, Mapping[str, Any]]) -> SpecSet:
    """The EvalRun and the clusters it names: EvalClusters of its namespace, or the admin's ClusterEvalClusters."""
    return load_objects([body, *clusters.values()], config.base_dir, load_catalog(), config.policy)


def clusters_of(body: Mapping[str, Any]) -> list[Named]:
    """Every cluster an EvalRun's spec names, as written, spec order (`clusters`, else `cluster` or `clusterRef`);
    a name that is no string is left to the loader."""
    spec = body.get("spec") or {}
    listed = spec.get("clusters")
    if isinstance(listed, list):
        items = listed
    else:
        found = spec.get("clusterRef")
        ref: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
        items = [{**ref, "name": spec.get("cluster") or ref.get("name")}]
    namespace = body["metadata"]["namespace"]
    return list(dict.fromkeys(named for item in items if (named := _item(item, namespace)) is not None))


def _item(item: object, namespace: str) -> Named | None:
    ref: Mapping[str, Any] = item if isinstance(item, Mapping) else {"name": item}
    name = ref.get("name")
    if not isinstance(name, str):
        return None
    return ("clusterevalclusters", None, name) if ref.get("kind") == "ClusterEvalCluster" else (
        "evalclusters", namespace, name)


def _named(ref: ClusterRef) -> Named:
    return ("clusterevalclusters", None, ref.name) if ref.cluster_scoped else ("evalclusters", ref.namespace, ref.name)
