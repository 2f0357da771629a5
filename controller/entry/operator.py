"""`evalctl operator`: the kopf shell. Handlers take the event, call operator_pass, write status and Events.

Every EvalRun change (apply, spec edit, `evalrun.io/requestedAt`, one of its EvalClusters changing) runs a pass at
once; a timer runs one every `interval` seconds in between. Passes run on workers of their own, fairly across
namespaces and with a deadline (pass_queue.py); passes on one EvalRun never overlap in this process; kopf
peering keeps a second replica idle, and the store's lease keeps a CLI on the same store out.
"""

from __future__ import annotations

import gc
import hashlib
import json
import logging
import secrets
import sys
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, TypeVar, cast

import kopf

from controller.adapters.kube import GROUP, VERSION, KubeApi, load_client_config
from controller.adapters.remote.ssh import parse_host
from controller.api.tenancy import QuotaEntry, estimated_cells, quota_refusal
from controller.core.types import ClusterRef
from controller.entry import prometheus
from controller.entry.kube_status import EventNote, invalid_spec_patch, not_run_patch
from controller.entry.operator_nodes import publish_nodes, release_annotated
from controller.entry.operator_pass import (
    OperatorConfig,
    PassReport,
    Stores,
    clusters_of,
    operator_notifier,
    reconcile_object,
    release_object,
)
from controller.entry.pass_queue import PassNotRun, PassQueue
from controller.entry.webhooks import Notifier

EVALRUNS = (GROUP, VERSION, "evalruns")
EVALCLUSTERS = (GROUP, VERSION, "evalclusters")
CLUSTER_EVALCLUSTERS = (GROUP, VERSION, "clusterevalclusters")
CLUSTER_REVISION = "evalrun.io/cluster-revision"  # bumped on an EvalRun when its EvalCluster changes
T = TypeVar("T")
DELETE_RETRIES = 10  # then the finalizer is released anyway, with a Warning: an object must never hang


class DigestDiffBase(kopf.AnnotationsDiffBaseStorage):
    """kopf keeps what it last handled in an annotation, to tell a change: the whole spec, labels and annotations.
    An EvalRun of a few hundred KB overflowed the 256 KiB annotation budget, the finalizer patch failed and the
    object could never be deleted. Our handlers need only THAT something changed (they read the object itself):
    a digest of it does."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        essence = super().build(body=body, extra_fields=extra_fields)
        encoded = json.dumps(essence, sort_keys=True, separators=(",", ":")).encode()
        return cast(kopf.BodyEssence, {"sha256": hashlib.sha256(encoded).hexdigest()})


class Memo(kopf.Memo):
    config: OperatorConfig
    api: KubeApi
    passes: PassQueue
    stores: Stores
    notifier: Notifier


def build_registry(interval_s: float) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.persistence.finalizer = "evalrun.io/finalizer"
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="kopf.evalrun.io")
        settings.persistence.diffbase_storage = DigestDiffBase(prefix="kopf.evalrun.io")
        settings.posting.level = logging.WARNING  # actions reach Events aggregated, once per pass

    @kopf.on.cleanup(registry=registry)
    def close_store(memo: Memo, **_: Any) -> None:
        memo.notifier.close()
        memo.stores.close()

    @kopf.on.probe(registry=registry, id="passes")
    def passes_move(memo: Memo, **_: Any) -> str:
        """/healthz fails (500) when passes were queued and none finished for the pass timeout plus two intervals:
        every worker is stuck, and only a restart helps. A single hung EvalRun is refused, not queued: no restart."""
        problem = memo.passes.wedged(datetime.now(UTC), memo.config.pass_timeout_s + 2 * memo.config.interval_s)
        if problem:
            raise kopf.PermanentError(problem)
        return "passes move"

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        """Like kubectl: the pod's service account, else the kubeconfig (a registry of our own has no default)."""
        return kopf.login_via_client(**kwargs)

    @kopf.index(*EVALRUNS, registry=registry, id="quota")
    def evalruns_by_namespace(namespace: str | None, uid: str, meta: kopf.Meta, spec: kopf.Spec,
                              **_: Any) -> dict[str, QuotaEntry]:
        """Every EvalRun, per namespace: kopf fills the index before any handler runs, so a quota is known."""
        return {namespace or "": QuotaEntry(str(meta.get("creationTimestamp") or ""), uid, estimated_cells(spec))}

    @kopf.index(*EVALCLUSTERS, registry=registry, id="hosts")
    def login_host(namespace: str | None, name: str, spec: kopf.Spec, **_: Any) -> dict[str, str]:
        """Which lane each namespaced cluster's passes wait in: its ssh host (shared by every cluster that reaches
        it), else itself. Not for ClusterEvalClusters: the admin's hosts are trusted, and an index there would stop
        an operator that may not list them (the per-namespace install)."""
        return {f"evalclusters/{namespace}/{name}": pass_lane("evalclusters", namespace, name, spec)}

    @kopf.on.create(*EVALRUNS, registry=registry, id="apply")
    @kopf.on.update(*EVALRUNS, registry=registry, id="change")
    @kopf.on.resume(*EVALRUNS, registry=registry, id="resume")
    @kopf.timer(*EVALRUNS, registry=registry, id="resync", interval=interval_s, initial_delay=interval_s)
    async def evalrun_pass(body: kopf.Body, patch: kopf.Patch, memo: Memo, namespace: str | None, name: str,
                           **kwargs: Any) -> None:
        """On kopf's event loop: the pass runs on the pass queue, and waiting for it holds no thread."""
        if body.metadata.get("deletionTimestamp"):
            return  # the delete handler owns the object now
        quota = cast("kopf.Index[str, QuotaEntry]", kwargs["quota"])  # the index above, by its id
        over = quota_refusal(list(quota.get(namespace or "", ())), body.metadata.uid or "", memo.config.quota)
        if over:
            patch.status.update(invalid_spec_patch([over], body.metadata.get("generation"), body.get("status"),
                                                   datetime.now(UTC), reason="QuotaExceeded"))
            return
        try:
            with prometheus.PASS_SECONDS.time():
                report = await _queued(memo, body, kwargs, lambda: reconcile_object(
                    memo.api, memo.config, memo.stores, body, datetime.now(UTC), memo.notifier))
        except PassNotRun as exc:
            report = PassReport(status=not_run_patch(str(exc), body.metadata.get("generation"), body.get("status"),
                                                     datetime.now(UTC)),
                                events=(EventNote(type="Warning", reason="PassNotFinished", message=str(exc)),))
        patch.status.update(report.status)
        for note in report.events:
            kopf.event(body, type=note.type, reason=note.reason, message=note.message)
        prometheus.record(namespace or "", name, report)

    @kopf.on.delete(*EVALRUNS, registry=registry, id="release", retries=DELETE_RETRIES, backoff=15)
    async def evalrun_deleted(body: kopf.Body, memo: Memo, retry: int, namespace: str | None, name: str,
                              **kwargs: Any) -> None:
        try:
            events = await _queued(memo, body, kwargs,
                                   lambda: release_object(memo.api, memo.config, memo.stores, body))
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
        """Fixing a cluster must re-run the EvalRuns on it now, not at the next timer tick. Nodes its
        `evalrun.io/release-nodes` names are released first (operator_nodes.py), and its status lists its
        quarantined nodes. A store that fails raises: kopf retries the handler."""
        with memo.stores.open() as store:
            note = release_annotated(memo.api, store, body)
            publish_nodes(memo.api, store, ClusterRef(namespace=namespace, name=name), body.get("status"))
        if note is not None:
            kopf.event(body, type=note.type, reason=note.reason, message=note.message)
        _rerun_evalruns_on(memo.api, ("evalclusters", namespace, name), str(body.metadata.get("resourceVersion")))

    @kopf.on.event(*CLUSTER_EVALCLUSTERS, registry=registry, id="clusterwide-change")
    def clusterwide_changed(event: kopf.RawEvent, body: kopf.Body, memo: Memo, name: str, **_: Any) -> None:
        """The admin's objects carry no kopf state (the operator may only read them), so every event re-runs, and
        re-annotating with the same resourceVersion changes nothing."""
        if event.get("type") != "DELETED":
            _rerun_evalruns_on(memo.api, ("clusterevalclusters", None, name),
                               str(body.metadata.get("resourceVersion")))

    return registry


async def _queued(memo: Memo, body: kopf.Body, kwargs: dict[str, Any], work: Callable[[], T]) -> T:
    """`work` for this EvalRun on the pass queue, within the pass timeout, in the lane of its (first) cluster's ssh
    host (or of the cluster itself): a lane holds a bounded number of workers."""
    plural, namespace, name = next(iter(clusters_of(body)), ("evalclusters", body.metadata.namespace, None))
    cluster = f"{plural}/{namespace}/{name}"
    lanes = cast("kopf.Index[str, str]", kwargs["hosts"])
    lane = next(iter(lanes.get(cluster, ())), cluster)
    return await memo.passes.run(body.metadata.uid or "", body.metadata.namespace or "", lane, work,
                                 memo.config.pass_timeout_s)


def pass_lane(plural: str, namespace: str | None, name: str, spec: Mapping[str, Any]) -> str:
    """`ssh:<host>` for a cluster reached over ssh, whatever the user and port; else the cluster itself."""
    ssh = (spec.get("scheduler") or {}).get("ssh")
    try:
        return f"ssh:{parse_host(ssh)[1]}" if isinstance(ssh, str) else f"{plural}/{namespace}/{name}"
    except ValueError:
        return f"{plural}/{namespace}/{name}"


def _rerun_evalruns_on(api: KubeApi, cluster: tuple[str, str | None, str], revision: str) -> None:
    """Annotate the EvalRuns that name `cluster` (plural, namespace, name; a ClusterEvalCluster's in every
    namespace), among their `clusters` too."""
    for run in api.list("evalruns", cluster[1]):
        if cluster in clusters_of(run):
            api.annotate("evalruns", run["metadata"]["namespace"], run["metadata"]["name"], {CLUSTER_REVISION: revision})


def random_priority() -> int:
    """kopf pauses EVERY replica when the highest priorities tie (two replicas of one Deployment, same args): a
    random one per process makes exactly one act; when it dies, the next highest resumes once its peering entry
    expires."""
    return secrets.randbelow(2**31 - 2) + 1


def run(config: OperatorConfig, *, namespaces: list[str], standalone: bool, liveness: str | None,
        metrics_port: int | None, peering: str, priority: int) -> None:
    """Run until SIGINT/SIGTERM (kopf handles both and finishes the handlers under way)."""
    load_client_config()
    # A thread holding the GIL keeps it up to the switch interval before a waiting one may take it: with passes over
    # 10,000 cells computing on the workers, kopf's event loop (every API event, patch and timer) and a small pass
    # of another namespace waited that long at every wake-up. 1 ms instead of 5: another namespace's first status
    # 3.1 s → 1.3 s, its Ready 3.9× → 1.2× its time alone (`make bench-fairness HOSTILE=cells`, docs/PERFORMANCE.md).
    sys.setswitchinterval(0.001)
    kopf.configure(log_format=kopf.LogFormat.JSON)
    if metrics_port is not None:
        prometheus.serve(metrics_port)
    memo = Memo(config=config, api=KubeApi(), passes=PassQueue(), stores=Stores(config),
                notifier=operator_notifier(config))
    gc.freeze()  # what is loaded by now lives as long as the process: kept out of every pass's full collections
    kopf.run(registry=build_registry(config.interval_s), memo=memo, standalone=standalone,
             peering_name=None if standalone else peering, priority=priority, liveness_endpoint=liveness,
             clusterwide=not namespaces, namespaces=namespaces)
