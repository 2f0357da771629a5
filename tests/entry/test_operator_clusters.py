"""An EvalRun over several clusters under the operator (issue 30, RULES §15), at the API boundary (a recording
KubeApi) with real local jobs: every listed cluster is fetched and granted, a change to any of them re-runs the
EvalRun, cells are placed on each, and deleting it cancels the jobs on each. tests/kube/test_multi_cluster.py
proves the same against the real API server."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import pytest

from controller.adapters.kube import KubeApi
from controller.adapters.scheduler.local import LocalScheduler
from controller.api.tenancy import OperatorPolicy
from controller.entry.operator import CLUSTER_REVISION, _rerun_evalruns_on
from controller.entry.operator_pass import OperatorConfig, Stores, reconcile_object, release_object
from tests.fixtures.evalctl import cancel_live_jobs, wait_until

REPO = Path(__file__).resolve().parents[2]
FAKE_HARBOR = REPO / "specs" / "demo" / "fake_harbor.py"
NAMESPACE = "team-a"


class Core:
    def read_namespaced_secret(self, name: str, namespace: str) -> Any:
        raise AssertionError(f"Secret {namespace}/{name} read for an EvalRun that may not use the cluster")


class Api:
    """The objects the API server holds, by (plural, namespace, name); records annotations and status patches."""

    def __init__(self, *objects: dict[str, Any]) -> None:
        self.objects = {_named(o): o for o in objects}
        self.core = Core()
        self.annotated: list[tuple[str, str]] = []
        self.patched: list[tuple[str, str | None, str]] = []

    def get(self, plural: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        return self.objects.get((plural, namespace, name))

    def list(self, plural: str, namespace: str | None) -> list[dict[str, Any]]:
        return [o for (p, ns, _), o in self.objects.items() if p == plural and namespace in (None, ns)]

    def annotate(self, plural: str, namespace: str, name: str, annotations: dict[str, str | None]) -> None:
        assert CLUSTER_REVISION in annotations
        self.annotated.append((namespace, name))

    def patch_status(self, plural: str, namespace: str | None, name: str, patch: dict[str, Any]) -> None:
        self.patched.append((plural, namespace, name))

    def namespace_labels(self, name: str) -> dict[str, str] | None:
        return {}


def _named(o: dict[str, Any]) -> tuple[str, str | None, str]:
    meta = o["metadata"]
    return {"EvalRun": "evalruns", "EvalCluster": "evalclusters", "ClusterEvalCluster": "clusterevalclusters"}[
        o["kind"]], meta.get("namespace"), meta["name"]


def evalrun(clusters: list[Any], name: str = "sweep", models: tuple[str, ...] = ("org/m-8B",),
            policy: str = "Orphan") -> dict[str, Any]:
    spec: dict[str, Any] = {"models": list(models), "datasets": ["DCAgent/tiny_a"], "deletionPolicy": policy}
    spec |= {"clusters": clusters} if len(clusters) > 1 else {"cluster": clusters[0]}
    return {"apiVersion": "evalrun.io/v1alpha1", "kind": "EvalRun",
            "metadata": {"name": name, "namespace": NAMESPACE, "generation": 1}, "spec": spec}


def local_cluster(name: str) -> dict[str, Any]:
    """A namespaced EvalCluster of local jobs that hang once started (they stay live until cancelled)."""
    return {"apiVersion": "evalrun.io/v1alpha1", "kind": "EvalCluster",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"scheduler": {"type": "local"}, "jobsDir": f"jobs-{name}", "logsDir": f"logs-{name}",
                     "jobScript": str(FAKE_HARBOR), "timeLimit": "01:00:00", "maxLiveJobs": 1,
                     "env": {"FAKE_HARBOR_TASKS": "4", "FAKE_HARBOR_HANG_AFTER": "1"}}}


def admin_cluster(name: str, granted: list[str]) -> dict[str, Any]:
    """The admin's ClusterEvalCluster with a secretEnv (never read for a namespace it does not grant)."""
    return {"apiVersion": "evalrun.io/v1alpha1", "kind": "ClusterEvalCluster", "metadata": {"name": name},
            "spec": {"scheduler": {"type": "local"}, "jobsDir": f"/tmp/{name}/j", "logsDir": f"/tmp/{name}/l",
                     "jobScript": "/bin/true", "allowedNamespaces": {"names": granted},
                     "secretEnv": [{"name": "HF_TOKEN", "secretRef": {"name": "admin-hf"}}]}}


@pytest.fixture
def config(tmp_path: Path) -> OperatorConfig:
    return OperatorConfig(store_url=f"sqlite:///{tmp_path}/store.db", base_dir=tmp_path, interval_s=30, holder="me",
                          policy=OperatorPolicy(allow_local_scheduler=True,
                                                allowed_path_roots=(str(tmp_path), str(REPO))))


@pytest.fixture
def schedulers(tmp_path: Path) -> Iterator[dict[str, LocalScheduler]]:
    found = {name: LocalScheduler(str(tmp_path / NAMESPACE / f"logs-{name}" / ".local-scheduler")) for name in "ab"}
    yield found
    for scheduler in found.values():
        cancel_live_jobs(scheduler)


def ready(report_status: dict[str, Any]) -> dict[str, Any]:
    [found] = [c for c in report_status["conditions"] if c["type"] == "Ready"]
    return cast(dict[str, Any], found)


def test_a_second_cluster_scoped_cluster_not_granted_is_refused_before_any_secret_is_read(
        config: OperatorConfig) -> None:
    api = Api(admin_cluster("hpc", [NAMESPACE]), admin_cluster("gpu", ["team-b"]))
    body = evalrun([{"kind": "ClusterEvalCluster", "name": "hpc"}, {"kind": "ClusterEvalCluster", "name": "gpu"}])

    report = reconcile_object(cast(KubeApi, api), config, Stores(config), body, datetime.now(UTC))

    condition = ready(report.status)
    assert (condition["status"], condition["reason"]) == ("False", "InvalidSpec")
    assert "ClusterEvalCluster gpu is not granted to namespace team-a" in condition["message"]
    assert "hpc is not granted" not in condition["message"], "the first cluster grants it"


def test_a_missing_second_cluster_stalls_the_evalrun_naming_it(config: OperatorConfig) -> None:
    api = Api(local_cluster("a"))

    report = reconcile_object(cast(KubeApi, api), config, Stores(config), evalrun(["a", "b"]), datetime.now(UTC))

    condition = ready(report.status)
    assert condition["reason"] == "InvalidSpec"
    assert "cluster b is not defined in namespace team-a" in condition["message"], condition
    assert "cluster a is not" not in condition["message"]


def test_a_change_to_any_listed_cluster_reruns_the_evalrun() -> None:
    api = Api(evalrun(["b"], name="on-b"), evalrun(["a", "b"], name="over-a-b"), evalrun(["a"], name="on-a"),
              evalrun(["a", {"kind": "ClusterEvalCluster", "name": "b"}], name="over-a-admin-b"))

    _rerun_evalruns_on(cast(KubeApi, api), ("evalclusters", NAMESPACE, "b"), "7")

    assert sorted(api.annotated) == [(NAMESPACE, "on-b"), (NAMESPACE, "over-a-b")]


def test_cells_go_to_both_clusters_and_deleting_cancels_the_jobs_on_each(
        config: OperatorConfig, schedulers: dict[str, LocalScheduler]) -> None:
    api = Api(local_cluster("a"), local_cluster("b"))
    body = evalrun(["a", "b"], models=("org/m-8B", "org/n-8B"), policy="Cancel")
    stores = Stores(config)

    report = reconcile_object(cast(KubeApi, api), config, stores, body, datetime.now(UTC))

    assert report.status["summary"]["clusters"] == {f"{NAMESPACE}/a": 1, f"{NAMESPACE}/b": 1}, report.status
    assert {name: len(list(s.observe())) for name, s in schedulers.items()} == {"a": 1, "b": 1}
    assert set(api.patched) == {("evalclusters", NAMESPACE, "a"), ("evalclusters", NAMESPACE, "b")}, "nodes of each"

    events = release_object(cast(KubeApi, api), config, stores, body)

    assert [note.reason for note in events] == ["Cancel"], events
    assert "2 cell(s)" in events[0].message
    for name, scheduler in schedulers.items():
        wait_until(lambda s=scheduler: all(not job.state.active for job in s.observe()),
                   f"the job on {name} to be cancelled", timeout_s=30)
    stores.close()
