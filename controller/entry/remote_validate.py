"""`evalctl validate --remote`: every cluster of the specs checked now where its jobs run (RULES §12, the same
preflight a reconciler runs before its first launch there), one command each — over ssh, one session.

A failed check is bad input: `FILE:LINE:COL: cluster C: …` at the field to fix, exit 2. A cluster that could not
be checked (unreachable, SLURM not answering) is not a verdict on the spec: exit 3, "could not be observed".
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from controller.adapters.scheduler.preflight import run_preflight
from controller.api.errors import SpecError
from controller.api.loader import CLUSTER_KINDS, LoadedCluster, SpecSet
from controller.api.yamldoc import Document, locate, read_documents
from controller.core.ports import ObservationError
from controller.core.preflight import Preflight
from controller.entry.exit_codes import BAD_INPUT, OK, UNOBSERVED
from controller.entry.preflight import preflight_target
from controller.entry.secrets import EnvironmentSecrets
from controller.entry.shell import error_line, out
from controller.entry.wiring import cluster_commands, secret_mask


def check_clusters(specs: SpecSet) -> list[tuple[LoadedCluster, Preflight]]:
    """Each cluster's preflight, run now (never one remembered); one that could not run says why."""
    secrets = EnvironmentSecrets()
    checked = []
    for cluster in specs.clusters.values():
        target = preflight_target(cluster)
        try:
            found = run_preflight(cluster_commands(cluster, secrets), target, secret_mask(cluster, specs, secrets))
        except ObservationError as exc:
            found = Preflight(cluster=target.cluster, unobserved=str(exc))
        checked.append((cluster, found))
    return checked


def spec_errors(cluster: LoadedCluster, found: Preflight) -> list[SpecError]:
    """Each failed check at the field to fix in the cluster's file."""
    document = _document(cluster)
    errors = []
    for failure in found.failures:
        line, col = locate(document, ("spec", *failure.field.split("."))) if document else (1, 1)
        errors.append(SpecError(str(cluster.file), line, col, f"cluster {cluster.ref}: {failure.message}"))
    return errors


def exit_code(checked: list[tuple[LoadedCluster, Preflight]]) -> int:
    if any(found.failures for _, found in checked):
        return BAD_INPUT
    return UNOBSERVED if any(found.unobserved for _, found in checked) else OK


def remote_json(checked: list[tuple[LoadedCluster, Preflight]]) -> dict[str, Any]:
    """`validate -o json --remote`'s additions: the errors at their fields, and each cluster's checks."""
    return {"errors": [asdict(error) for cluster, found in checked for error in spec_errors(cluster, found)],
            "remote": [{"cluster": str(cluster.ref), "host": preflight_target(cluster).host, "ok": found.ok,
                        "failures": [failure.model_dump() for failure in found.failures],
                        "passed": list(found.passed), "unobserved": found.unobserved or None}
                       for cluster, found in checked]}


def show(checked: list[tuple[LoadedCluster, Preflight]]) -> None:
    """For a person: a line per cluster that passed (stdout); errors at their fields, and a line per cluster that
    could not be checked (stderr, one per line: editors and CI jump to FILE:LINE:COL)."""
    for cluster, found in checked:
        for error in spec_errors(cluster, found):
            error_line(str(error))
        if found.unobserved:
            error_line(f"evalctl: cluster {cluster.ref} could not be checked: {found.unobserved}")
        if found.ok:
            out.print(f"cluster {cluster.ref} on {preflight_target(cluster).host}: ok ({', '.join(found.passed)})",
                      markup=False, highlight=False)


def _document(cluster: LoadedCluster) -> Document | None:
    """The cluster's document in its file (re-read: the loader keeps the parsed spec, not its positions)."""
    documents, _ = read_documents(cluster.file, str(cluster.file))
    for document in documents:
        data: dict[str, Any] = document.data if isinstance(document.data, dict) else {}
        meta: dict[str, Any] = data["metadata"] if isinstance(data.get("metadata"), dict) else {}
        if (data.get("kind") in CLUSTER_KINDS and meta.get("name") == cluster.cluster.metadata.name
                and meta.get("namespace") == cluster.cluster.metadata.namespace):
            return document
    return None
