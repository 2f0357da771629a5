"""Which namespaces may use a ClusterEvalCluster (issue 27): none unless granted, by name or by label selector."""

from __future__ import annotations

from typing import Any

import pytest

from controller.api.errors import SpecErrors
from controller.api.evalcluster import ClusterEvalCluster
from controller.api.grants import grant_refusal
from controller.api.loader import parse_resource


def cluster(allowed: dict[str, Any] | None = None) -> ClusterEvalCluster:
    spec: dict[str, Any] = {"scheduler": {"type": "local"}, "jobsDir": "jobs", "logsDir": "logs", "jobScript": "x"}
    if allowed is not None:
        spec["allowedNamespaces"] = allowed
    parsed = parse_resource({"apiVersion": "evalrun.io/v1alpha1", "kind": "ClusterEvalCluster",
                             "metadata": {"name": "hpc"}, "spec": spec})
    assert isinstance(parsed, ClusterEvalCluster)
    return parsed


def never_read() -> dict[str, str]:
    raise AssertionError("a grant by name, or none at all, reads no Namespace")


TEAM = {"team": "vision", "tier": "gold"}


@pytest.mark.parametrize(("allowed", "labels", "granted"), [
    (None, None, False),  # the default: no namespace
    ({}, None, False),
    ({"names": ["team-b"]}, None, False),
    ({"names": ["team-b", "team-a"]}, None, True),
    ({"selector": {}}, {}, True),  # the Kubernetes convention: an empty selector selects every namespace
    ({"selector": {"matchLabels": {"team": "vision"}}}, TEAM, True),
    ({"selector": {"matchLabels": {"team": "nlp"}}}, TEAM, False),
    ({"selector": {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["gold", "silver"]}]}}, TEAM,
     True),
    ({"selector": {"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["gold"]}]}}, TEAM, False),
    ({"selector": {"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["gold"]}]}}, {}, True),
    ({"selector": {"matchExpressions": [{"key": "team", "operator": "Exists"}]}}, TEAM, True),
    ({"selector": {"matchExpressions": [{"key": "team", "operator": "DoesNotExist"}]}}, TEAM, False),
    ({"selector": {"matchLabels": {"team": "vision"},  # every term must hold
                   "matchExpressions": [{"key": "tier", "operator": "In", "values": ["silver"]}]}}, TEAM, False),
])
def test_a_namespace_is_granted_by_name_or_selector_and_by_nothing_else(
        allowed: dict[str, Any] | None, labels: dict[str, str] | None, granted: bool) -> None:
    read = never_read if labels is None else lambda: labels

    why = grant_refusal(cluster(allowed), "team-a", read)

    assert (why == "") is granted, why
    if not granted:
        assert "ClusterEvalCluster hpc" in why and "team-a" in why and "spec.allowedNamespaces" in why


def test_a_namespace_whose_labels_cannot_be_read_is_refused() -> None:
    why = grant_refusal(cluster({"selector": {}}), "team-a", lambda: None)
    assert "could not be read" in why


@pytest.mark.parametrize("allowed", [
    {"names": ["Team_A"]},
    {"selector": {"matchExpressions": [{"key": "tier", "operator": "In"}]}},
    {"selector": {"matchExpressions": [{"key": "tier", "operator": "Exists", "values": ["x"]}]}},
    {"selector": {"matchExpressions": [{"key": "tier", "operator": "Like", "values": ["x"]}]}},
])
def test_a_malformed_grant_is_refused(allowed: dict[str, Any]) -> None:
    with pytest.raises(SpecErrors, match="allowedNamespaces"):
        cluster(allowed)


def test_a_namespaced_evalcluster_has_no_grant() -> None:
    with pytest.raises(SpecErrors, match="allowedNamespaces"):
        parse_resource({"apiVersion": "evalrun.io/v1alpha1", "kind": "EvalCluster",
                        "metadata": {"name": "hpc", "namespace": "team-a"},
                        "spec": {"scheduler": {"type": "local"}, "jobsDir": "j", "logsDir": "l", "jobScript": "x",
                                 "allowedNamespaces": {"names": ["team-a"]}}})


def test_a_cluster_that_does_not_load_tells_why_only_to_namespaces_it_names() -> None:
    from controller.api.grants import unloadable_refusal

    broken = {"metadata": {"name": "hpc"}, "spec": {"jobsDir": 7, "allowedNamespaces": {"names": ["team-a"]}}}
    assert unloadable_refusal(broken, "team-a") == "", "granted by name: the loader's errors are its to see"
    why = unloadable_refusal(broken, "team-b")
    assert "does not load" in why and "jobsDir" not in why, why
    assert unloadable_refusal({"metadata": {"name": "hpc"}, "spec": "garbage"}, "team-a") != ""
