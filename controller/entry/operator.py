"""`evalctl operator`: the kopf shell. Handlers take the event, call operator_pass, write status and Events.

Every EvalRun change (apply, spec edit, `evalrun.io/requestedAt`, its EvalCluster changing) runs a pass at
once; a timer runs one every `interval` seconds in between. Passes on one EvalRun never overlap in this
process; kopf peering keeps a second replica idle, and the store's lease keeps a CLI on the same store out.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

import kopf

from controller.adapters.kube import GROUP, VERSION, KubeApi, load_client_config
from controller.entry import prometheus
from controller.entry.operator_pass import (
    OperatorConfig,
    Passes,
    Stores,
    cluster_of,
    reconcile_object,
    release_object,
)

EVALRUNS = (GROUP, VERSION, "evalruns")
EVALCLUSTERS = (GROUP, VERSION, "evalclusters")
CLUSTER_EVALCLUSTERS = (GROUP, VERSION, "clusterevalclusters")
CLUSTER_REVISION = "evalrun.io/cluster-revision"  # bumped on an EvalRun when its EvalCluster changes
DELETE_RETRIES = 10  # then the finalizer is released anyway, with a Warning: an object must never hang


class Memo(kopf.Memo):
    config: OperatorConfig
    api: KubeApi
    passes: Passes
    stores: Stores


def build_registry(interval_s: float) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.persistence.finalizer = "evalrun.io/finalizer"
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="kopf.evalrun.io")
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix="kopf.evalrun.io")
        settings.posting.level = logging.WARNING  # actions reach Events aggregated, once per pass

    @kopf.on.cleanup(registry=registry)
    def close_store(memo: Memo, **_: Any) -> None:
        memo.stores.close()

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        """Like kubectl: the pod's service account, else the kubeconfig (a registry of our own has no default)."""
        return kopf.login_via_client(**kwargs)

    @kopf.on.create(*EVALRUNS, registry=registry, id="apply")
    @kopf.on.update(*EVALRUNS, registry=registry, id="change")
    @kopf.on.resume(*EVALRUNS, registry=registry, id="resume")
    @kopf.timer(*EVALRUNS, registry=registry, id="resync", interval=interval_s, initial_delay=interval_s)
    def evalrun_pass(body: kopf.Body, patch: kopf.Patch, memo: Memo, namespace: str | None, name: str, **_: Any) -> None:
        if body.metadata.get("deletionTimestamp"):
            return  # the delete handler owns the object now
        with memo.passes.lock(body.metadata.uid), prometheus.PASS_SECONDS.time():
            report = reconcile_object(memo.api, memo.config, memo.stores, body, datetime.now(UTC))
        patch.status.update(report.status)
        for note in report.events:
            kopf.event(body, type=note.type, reason=note.reason, message=note.message)
        prometheus.record(namespace or "", name, report)

    @kopf.on.delete(*EVALRUNS, registry=registry, id="release", retries=DELETE_RETRIES, backoff=15)
    def evalrun_deleted(body: kopf.Body, memo: Memo, retry: int, namespace: str | None, name: str, **_: Any) -> None:
        with memo.passes.lock(body.metadata.uid):
            try:
                events = release_object(memo.api, memo.config, memo.stores, body)
            except Exception as exc:
                if retry + 1 >= DELETE_RETRIES:
                    kopf.warn(body, reason="ReleaseGivenUp", message=f"left as is after {DELETE_RETRIES} tries: {exc}")
                    return
                raise kopf.TemporaryError(f"cannot release yet: {exc}", delay=15) from exc
        for note in events:
            kopf.event(body, type=note.type, reason=note.reason, message=note.message)
        prometheus.forget(namespace or "", name)

    @kopf.on.create(*EVALCLUSTERS, registry=registry, id="cluster-apply")
    @kopf.on.update(*EVALCLUSTERS, registry=registry, id="cluster-change")
    def cluster_changed(body: kopf.Body, memo: Memo, namespace: str | None, name: str, **_: Any) -> None:
        """Fixing a cluster must re-run the EvalRuns on it now, not at the next timer tick."""
        _rerun_evalruns_on(memo.api, ("evalclusters", namespace, name), str(body.metadata.get("resourceVersion")))

    @kopf.on.event(*CLUSTER_EVALCLUSTERS, registry=registry, id="clusterwide-change")
    def clusterwide_changed(event: kopf.RawEvent, body: kopf.Body, memo: Memo, name: str, **_: Any) -> None:
        """The admin's objects carry no kopf state (the operator may only read them), so every event re-runs, and
        re-annotating with the same resourceVersion changes nothing."""
        if event.get("type") != "DELETED":
            _rerun_evalruns_on(memo.api, ("clusterevalclusters", None, name),
                               str(body.metadata.get("resourceVersion")))

    return registry


def _rerun_evalruns_on(api: KubeApi, cluster: tuple[str, str | None, str], revision: str) -> None:
    """Annotate the EvalRuns on `cluster` (plural, namespace, name; a ClusterEvalCluster's in every namespace)."""
    for run in api.list("evalruns", cluster[1]):
        if cluster_of(run) == cluster:
            api.annotate("evalruns", run["metadata"]["namespace"], run["metadata"]["name"], {CLUSTER_REVISION: revision})


def run(config: OperatorConfig, *, namespaces: list[str], standalone: bool, liveness: str | None,
        metrics_port: int | None, peering: str, priority: int) -> None:
    """Run until SIGINT/SIGTERM (kopf handles both and finishes the handlers under way)."""
    load_client_config()
    kopf.configure(log_format=kopf.LogFormat.JSON)
    if metrics_port is not None:
        prometheus.serve(metrics_port)
    memo = Memo(config=config, api=KubeApi(), passes=Passes(), stores=Stores(config))
    kopf.run(registry=build_registry(config.interval_s), memo=memo, standalone=standalone,
             peering_name=None if standalone else peering, priority=priority, liveness_endpoint=liveness,
             clusterwide=not namespaces, namespaces=namespaces)
