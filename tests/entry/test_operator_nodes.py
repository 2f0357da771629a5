"""An EvalCluster's quarantined nodes in its status and its `evalrun.io/release-nodes` annotation, at the API
boundary (a recording KubeApi) on a real store. tests/kube proves the same on the real API server."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from controller.adapters.store.sqlite import SqliteStore
from controller.core.remedies import QuarantineKind
from controller.core.store import Store
from controller.core.types import ClusterRef
from controller.entry.operator_nodes import RELEASE_NODES, publish_nodes, release_annotated

HOUR = 3600.0
LAB = ClusterRef(namespace="lab", name="gpu")
SHARED = ClusterRef(name="shared", cluster_scoped=True)


class Api:
    """What the operator asked of the API server; `refuse` makes every status patch a 403."""

    def __init__(self, refuse: bool = False) -> None:
        self.refuse = refuse
        self.annotated: list[tuple[str, str, str, dict[str, str | None]]] = []
        self.statuses: list[tuple[str, str | None, str, dict[str, Any]]] = []

    def annotate(self, plural: str, namespace: str, name: str, annotations: Mapping[str, str | None]) -> None:
        self.annotated.append((plural, namespace, name, dict(annotations)))

    def patch_status(self, plural: str, namespace: str | None, name: str, status: Mapping[str, Any]) -> None:
        if self.refuse:
            raise ApiException(status=403, reason="Forbidden")
        self.statuses.append((plural, namespace, name, dict(status)))


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    state = SqliteStore(tmp_path / "store.db")
    state.quarantine(QuarantineKind.NODE, "lab/gpu", "gpu03", "nccl-timeout", HOUR, "lab/sweep")
    state.quarantine(QuarantineKind.NODE, "lab/gpu", "gpu04", "ECC errors", HOUR, "lab/sweep")
    state.quarantine(QuarantineKind.NODE, "other/gpu", "gpu05", "nccl-timeout", HOUR, "other/run")
    state.quarantine(QuarantineKind.NODE, "ClusterEvalCluster/shared", "gpu03", "disk full", HOUR, "")
    state.quarantine(QuarantineKind.CLUSTER, "lab/gpu", "lab/gpu", "load shedding", HOUR, "lab/sweep")
    yield Store(state, state)
    state.close()


def annotated(value: str, namespace: str = "lab") -> dict[str, Any]:
    return {"metadata": {"namespace": namespace, "name": "gpu", "annotations": {RELEASE_NODES: value}}}


def live(store: Store) -> list[tuple[str, str]]:
    return [(q.scope, q.name) for q in store.state.live_quarantines() if q.kind == QuarantineKind.NODE]


def test_the_annotation_releases_its_clusters_nodes_once_and_is_removed(store: Store) -> None:
    api = Api()

    note = release_annotated(api, store, annotated("gpu03, gpu09"))  # type: ignore[arg-type]

    assert note is not None and (note.type, note.reason) == ("Normal", "NodesReleased")
    assert note.message.startswith("released gpu03 (nccl-timeout; until ") and \
        note.message.endswith("UTC); not quarantined on lab/gpu: gpu09"), note.message
    assert api.annotated == [("evalclusters", "lab", "gpu", {RELEASE_NODES: None})]
    assert live(store) == [("ClusterEvalCluster/shared", "gpu03"), ("lab/gpu", "gpu04"), ("other/gpu", "gpu05")], \
        "the shared cluster's gpu03 is another cluster's node"


def test_a_tenant_cannot_release_another_clusters_node(store: Store) -> None:
    api = Api()

    note = release_annotated(api, store, annotated("gpu05"))  # type: ignore[arg-type]

    assert note is not None and (note.type, note.reason) == ("Warning", "NodesNotReleased")
    assert note.message == "not quarantined on lab/gpu: gpu05"
    assert ("other/gpu", "gpu05") in live(store)
    assert api.annotated, "removed all the same: it is applied once"


@pytest.mark.parametrize(("value", "message"), [("gpu[03-", "evalrun.io/release-nodes: unbalanced '[' in 'gpu[03-'"),
                                                 (" ", "evalrun.io/release-nodes names no node")])
def test_an_annotation_naming_no_node_is_a_warning_and_is_removed(store: Store, value: str, message: str) -> None:
    api = Api()

    note = release_annotated(api, store, annotated(value))  # type: ignore[arg-type]

    assert note is not None and (note.type, note.message) == ("Warning", message)
    assert len(api.annotated) == 1 and len(live(store)) == 4


def test_a_hostlist_names_several_nodes_and_no_annotation_does_nothing(store: Store) -> None:
    api = Api()

    assert release_annotated(api, store, {"metadata": {"namespace": "lab", "name": "gpu"}}) is None  # type: ignore[arg-type]
    note = release_annotated(api, store, annotated("gpu[03-04]"))  # type: ignore[arg-type]

    assert note is not None and note.reason == "NodesReleased" and "not quarantined" not in note.message
    assert [name for scope, name in live(store) if scope == "lab/gpu"] == []


def test_the_status_lists_the_clusters_nodes_and_is_patched_only_when_they_change(store: Store) -> None:
    api = Api()

    publish_nodes(api, store, LAB, None)  # type: ignore[arg-type]
    [(plural, namespace, name, status)] = api.statuses
    publish_nodes(api, store, LAB, status)  # type: ignore[arg-type]
    publish_nodes(api, store, SHARED, {})  # type: ignore[arg-type]

    assert (plural, namespace, name) == ("evalclusters", "lab", "gpu")
    assert [(n["node"], n["reason"], n["owner"]) for n in status["quarantinedNodes"]] == [
        ("gpu03", "nccl-timeout", "lab/sweep"), ("gpu04", "ECC errors", "lab/sweep")]
    assert all(n["since"].endswith("Z") and n["until"] > n["since"] for n in status["quarantinedNodes"])
    assert status["quarantinedNodesOmitted"] == 0
    assert len(api.statuses) == 2, "unchanged: not patched again"
    assert api.statuses[1][:3] == ("clusterevalclusters", None, "shared")
    assert [n["node"] for n in api.statuses[1][3]["quarantinedNodes"]] == ["gpu03"]


def test_a_status_the_api_refuses_is_a_log_line_not_a_failure(store: Store, caplog: pytest.LogCaptureFixture) -> None:
    publish_nodes(Api(refuse=True), store, LAB, None)  # type: ignore[arg-type]

    assert "cluster status not written" in caplog.text

