"""Which namespaces may use a ClusterEvalCluster (issue 27): granted by its admin, never open by default.

A ClusterEvalCluster carries the admin's infrastructure and Secrets (its `secretEnv`, ssh key, MLflow login):
an EvalRun of a namespace it does not grant is refused before any of them is read. Names are matched first, so
a grant by name needs no read of the Namespace object; a selector is tested on the Namespace's labels, read
only then (`labels`, None when they cannot be read: refused, never assumed).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from controller.api.evalcluster import ClusterEvalCluster, LabelRequirement, LabelSelector


def grant_refusal(cluster: ClusterEvalCluster, namespace: str,
                  labels: Callable[[], Mapping[str, str] | None]) -> str:
    """Why EvalRuns of `namespace` may not use `cluster` ("" when they may), naming how the admin grants it."""
    grant = cluster.spec.allowed_namespaces
    if grant is not None and namespace in grant.names:
        return ""
    how = (f"its admin grants it with spec.allowedNamespaces (names: [{namespace}], or a selector matching the "
           "namespace's labels)")
    if grant is None or grant.selector is None:
        return f"ClusterEvalCluster {cluster.metadata.name} is not granted to namespace {namespace}: {how}"
    found = labels()
    if found is None:
        return (f"ClusterEvalCluster {cluster.metadata.name} grants namespaces by label, and namespace {namespace}'s "
                "labels could not be read; retried at the next pass")
    if selects(grant.selector, found):
        return ""
    return (f"ClusterEvalCluster {cluster.metadata.name} is not granted to namespace {namespace} (its labels do not "
            f"match spec.allowedNamespaces.selector): {how}")


def unloadable_refusal(raw: Mapping[str, Any], namespace: str) -> str:
    """Why `namespace` is not told what is wrong with a ClusterEvalCluster that does not load ("" when it may be:
    its admin granted it by name). Its errors quote the admin's paths, hosts and names; a namespace the admin may
    not have granted is told only that it is unusable."""
    spec = raw.get("spec") if isinstance(raw.get("spec"), Mapping) else {}
    grant = spec.get("allowedNamespaces") if isinstance(spec, Mapping) else None
    names = grant.get("names") if isinstance(grant, Mapping) else None
    if isinstance(names, list) and namespace in names:
        return ""
    name = (raw.get("metadata") or {}).get("name", "?")
    return (f"ClusterEvalCluster {name} does not load, and namespace {namespace} is not granted it by name; its "
            "admin sees why (kubectl describe clusterevalcluster)")


def selects(selector: LabelSelector, labels: Mapping[str, str]) -> bool:
    """Kubernetes label-selector semantics: every pair and every expression holds (an empty selector: all)."""
    return (all(labels.get(key) == value for key, value in selector.match_labels.items())
            and all(_holds(requirement, labels) for requirement in selector.match_expressions))


def _holds(requirement: LabelRequirement, labels: Mapping[str, str]) -> bool:
    value = labels.get(requirement.key)
    match requirement.operator:
        case "In":
            return value in requirement.values
        case "NotIn":
            return value not in requirement.values
        case "Exists":
            return value is not None
        case "DoesNotExist":
            return value is None
