"""An EvalRun on a ClusterEvalCluster that does not grant its namespace (issue 27), at the API boundary (a
recording KubeApi): refused as InvalidSpec before any Secret is read, and its deletion cancels nothing there.
tests/kube/test_tenancy_grants.py proves the same on the real API server."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import pytest

from controller.adapters.kube import KubeApi
from controller.core.types import EvalRunRef
from controller.entry.operator_pass import OperatorConfig, Stores, reconcile_object, release_object


class Core:
    def read_namespaced_secret(self, name: str, namespace: str) -> Any:
        raise AssertionError(f"Secret {namespace}/{name} read for an EvalRun that may not use the cluster")


class Api:
    """The admin's ClusterEvalCluster `hpc` (with a secretEnv), and the labels of namespace team-a."""

    def __init__(self, allowed: dict[str, Any] | None) -> None:
        spec: dict[str, Any] = {"scheduler": {"type": "local"}, "jobsDir": "/tmp/j", "logsDir": "/tmp/l",
                                "jobScript": "/bin/true",
                                "secretEnv": [{"name": "HF_TOKEN", "secretRef": {"name": "admin-hf"}}]}
        if allowed is not None:
            spec["allowedNamespaces"] = allowed
        self.cluster = {"apiVersion": "evalrun.io/v1alpha1", "kind": "ClusterEvalCluster",
                        "metadata": {"name": "hpc"}, "spec": spec}
        self.core = Core()
        self.labels_read: list[str] = []

    def get(self, plural: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        assert (plural, namespace, name) == ("clusterevalclusters", None, "hpc")
        return self.cluster

    def namespace_labels(self, name: str) -> dict[str, str] | None:
        self.labels_read.append(name)
        return {"team": "nlp"}


def evalrun(policy: str = "Keep") -> dict[str, Any]:
    return {"apiVersion": "evalrun.io/v1alpha1", "kind": "EvalRun",
            "metadata": {"name": "sweep", "namespace": "team-a", "generation": 1},
            "spec": {"clusterRef": {"kind": "ClusterEvalCluster", "name": "hpc"}, "models": ["org/m-8B"],
                     "datasets": ["DCAgent/tiny"], "deletionPolicy": policy}}


@pytest.fixture
def config(tmp_path: Path) -> OperatorConfig:
    return OperatorConfig(store_url=f"sqlite:///{tmp_path}/store.db", base_dir=tmp_path, interval_s=30, holder="me")


@pytest.mark.parametrize(("allowed", "reads_labels"), [
    (None, False), ({"names": ["team-b"]}, False), ({"selector": {"matchLabels": {"team": "vision"}}}, True)])
def test_an_ungranted_namespace_is_refused_before_any_secret_is_read(
        config: OperatorConfig, allowed: dict[str, Any] | None, reads_labels: bool) -> None:
    api = Api(allowed)

    report = reconcile_object(cast(KubeApi, api), config, Stores(config), evalrun(), datetime.now(UTC))

    [ready] = [c for c in report.status["conditions"] if c["type"] == "Ready"]
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
    assert "ClusterEvalCluster hpc is not granted to namespace team-a" in ready["message"]
    assert "spec.allowedNamespaces" in ready["message"]
    assert [note.reason for note in report.events] == ["InvalidSpec"]
    assert api.labels_read == (["team-a"] if reads_labels else [])


def test_deleting_an_ungranted_evalrun_cancels_nothing_and_gives_up_its_cells(config: OperatorConfig) -> None:
    stores = Stores(config)
    mine = EvalRunRef(namespace="team-a", name="sweep")
    with stores.open() as store:
        store.state.claim_cells(mine, ["cell-1"], 3600)

    events = release_object(cast(KubeApi, Api({"names": ["team-b"]})), config, stores, evalrun("Cancel"))

    assert [(note.type, note.reason) for note in events] == [("Warning", "NotCancelled")]
    other = EvalRunRef(namespace="team-b", name="other")
    with stores.open() as store:
        assert store.state.claim_cells(other, ["cell-1"], 3600) == {"cell-1": other}, "given up at once"
    stores.close()
