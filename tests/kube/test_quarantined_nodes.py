"""Quarantined nodes under the operator: an EvalCluster's status lists those of its cluster, and its
`evalrun.io/release-nodes` annotation lifts them, for that cluster only, once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from controller.adapters.store.sqlite import SqliteStore
from controller.core.remedies import QuarantineKind
from tests.kube.conftest import Lab, eventually

pytestmark = pytest.mark.kube
DAY = 86400.0


def cluster(lab: Lab) -> dict[str, Any]:
    found: dict[str, Any] = lab.kube.json("get", "evalcluster", "local", "-n", lab.namespace)
    return found


def listed(lab: Lab) -> list[str]:
    return [entry["node"] for entry in (cluster(lab).get("status") or {}).get("quarantinedNodes") or ()]


def test_the_status_lists_the_clusters_nodes_and_the_annotation_releases_them_once(lab: Lab):
    store = SqliteStore(Path(lab.store.removeprefix("sqlite:///")))
    for node in ("gpu03", "gpu04"):
        store.quarantine(QuarantineKind.NODE, f"{lab.namespace}/local", node, "nccl-timeout: check the node", DAY,
                         f"{lab.namespace}/demo")
    store.quarantine(QuarantineKind.NODE, "elsewhere/local", "gpu05", "nccl-timeout", DAY, "elsewhere/run")
    store.close()
    lab.start_operator()
    lab.apply(lab.cluster_yaml(), lab.run_yaml(["org/a-8B"]))

    eventually(lambda: listed(lab) == ["gpu03", "gpu04"], "the cluster's quarantined nodes in its status")
    gpu03 = cluster(lab)["status"]["quarantinedNodes"][0]
    assert (gpu03["reason"], gpu03["owner"]) == ("nccl-timeout: check the node", f"{lab.namespace}/demo"), gpu03
    assert gpu03["since"].endswith("Z") and gpu03["until"] > gpu03["since"], gpu03

    lab.kube.kubectl("annotate", "evalcluster/local", "-n", lab.namespace, "evalrun.io/release-nodes=gpu03,gpu05")

    eventually(lambda: listed(lab) == ["gpu04"], "gpu03 released and gone from the status")
    eventually(lambda: "evalrun.io/release-nodes" not in (cluster(lab)["metadata"].get("annotations") or {}),
               "the handled annotation removed")
    [event] = [e for e in lab.events() if e["involvedObject"]["kind"] == "EvalCluster" and e["reason"] == "NodesReleased"]
    assert event["message"].startswith("released gpu03 (nccl-timeout: check the node; until "), event["message"]
    assert event["message"].endswith(f"; not quarantined on {lab.namespace}/local: gpu05"), event["message"]
    left = SqliteStore(Path(lab.store.removeprefix("sqlite:///")), readonly=True)
    assert [(q.scope, q.name) for q in left.live_quarantines()] == [("elsewhere/local", "gpu05"),
                                                                    (f"{lab.namespace}/local", "gpu04")], \
        "another cluster's node is out of this annotation's reach"
    left.close()
    lab.wait_condition("Ready")
