"""An EvalCluster's quarantined nodes in the operator: listed in its status, lifted by an annotation.

`evalrun.io/release-nodes: "gpu03,gpu04"` (a hostlist: `gpu[03-04]` too) on an EvalCluster lifts those nodes'
quarantines on that cluster only, the scope its EvalRuns' passes quarantine under (`namespace/name`): a tenant who
may annotate it reaches no other cluster's. The operator then removes the annotation, so it is applied once, and an
Event says what was lifted. A ClusterEvalCluster is the admin's and the operator may not annotate it: its nodes are
released with `evalctl nodes release`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from kubernetes.client.exceptions import ApiException

from controller.adapters.kube import KubeApi
from controller.core.hostlist import HostlistError, expand
from controller.core.ports import ObservationError
from controller.core.remedies import Quarantined
from controller.core.store import Store
from controller.core.types import ClusterRef
from controller.entry.kube_status import EventNote, clip, quarantined_nodes_patch
from controller.entry.nodes import node_quarantines

log = logging.getLogger("evalctl.operator")
RELEASE_NODES = "evalrun.io/release-nodes"


def quarantined_on(store: Store, cluster: ClusterRef) -> tuple[Quarantined, ...]:
    """The cluster's nodes quarantined now (read now: after a pass, what it decided is in)."""
    return tuple(q for q in node_quarantines(store.state.live_quarantines()) if q.scope == str(cluster))


def publish_nodes(api: KubeApi, store: Store, cluster: ClusterRef, status: Mapping[str, Any] | None) -> None:
    """Write the cluster's quarantined nodes into its status, when they are not what `status` (its status as last
    read) shows: passes of many EvalRuns on one cluster patch it only when something changed. A courtesy: a store
    or an API that refuses (an older install's RBAC without the status subresource) costs a log line, never the
    pass or the handler."""
    try:
        patch = quarantined_nodes_patch(quarantined_on(store, cluster))
        if any((status or {}).get(key) != value for key, value in patch.items()):
            plural = "clusterevalclusters" if cluster.cluster_scoped else "evalclusters"
            api.patch_status(plural, cluster.namespace, cluster.name, patch)
    except (ApiException, ObservationError) as exc:
        log.warning("cluster status not written", extra={"cluster": str(cluster), "error": str(exc)})


def release_annotated(api: KubeApi, store: Store, body: Mapping[str, Any]) -> EventNote | None:
    """Lift the nodes a namespaced EvalCluster's annotation names, then remove the annotation; None without one."""
    meta = body["metadata"]
    value = (meta.get("annotations") or {}).get(RELEASE_NODES)
    if value is None:
        return None
    namespace, name = meta["namespace"], meta["name"]
    cluster = ClusterRef(namespace=namespace, name=name)
    try:
        wanted = expand(value)
    except HostlistError as exc:
        note = EventNote(type="Warning", reason="NodesNotReleased", message=f"{RELEASE_NODES}: {exc}")
    else:
        note = _release(store, cluster, wanted)
    api.annotate("evalclusters", namespace, name, {RELEASE_NODES: None})
    log.info("release-nodes annotation handled", extra={"cluster": str(cluster), "note": note.message})
    return note


def _release(store: Store, cluster: ClusterRef, wanted: tuple[str, ...]) -> EventNote:
    live = {q.name: q for q in quarantined_on(store, cluster)}
    released = [live[node] for node in wanted
                if node in live and store.state.release_quarantine(live[node].kind, live[node].scope, node)]
    lifted = ", ".join(f"{q.name} ({q.reason}; until {q.until:%Y-%m-%d %H:%M} UTC)" for q in released)
    absent = [node for node in wanted if node not in {q.name for q in released}]
    missing = f"not quarantined on {cluster}: {', '.join(absent)}" if absent else ""
    if not released:
        return EventNote(type="Warning", reason="NodesNotReleased",
                         message=clip(missing or f"{RELEASE_NODES} names no node"))
    return EventNote(type="Normal", reason="NodesReleased",
                     message=clip(f"released {lifted}" + (f"; {missing}" if missing else "")))
