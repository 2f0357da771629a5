"""Load EvalCluster / EvalRun resources from files and directories, reporting every problem at once.

Each problem is a `SpecError` (`FILE:LINE:COL: message` with a hint); all of them, across all
files, are raised together as `SpecErrors`, so `evalctl validate` is one round trip for the user.
Checks that need more than one document (cluster references, duplicate names) or the catalog
(preset names) run after every file has been read.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from controller.api.catalog import Catalog, load_catalog
from controller.api.diagnose import validate
from controller.api.errors import SpecError, SpecErrors, clip, format_errors
from controller.api.evalcluster import AnyCluster, ClusterEvalCluster, EvalCluster
from controller.api.evalrun import EvalRun
from controller.api.identity import identity_collisions
from controller.api.run_checks import clusters_named, run_errors, suggest
from controller.api.tenancy import OperatorPolicy, cluster_refusals, run_refusals
from controller.api.yamldoc import Document, iter_files, read_documents
from controller.core.types import ClusterRef, EvalRunRef

__all__ = [
    "LoadedCluster",
    "LoadedRun",
    "SpecError",
    "SpecErrors",
    "SpecSet",
    "format_errors",
    "load_objects",
    "load_specs",
    "object_label",
    "parse_resource",
]

Resource = EvalCluster | ClusterEvalCluster | EvalRun
KINDS: dict[str, type[Resource]] = {"EvalCluster": EvalCluster, "ClusterEvalCluster": ClusterEvalCluster,
                                    "EvalRun": EvalRun}
CLUSTER_KINDS = ("EvalCluster", "ClusterEvalCluster")


class Loaded(BaseModel):
    model_config = ConfigDict(frozen=True)

    file: Path
    directory: Path

    def path(self, value: str) -> str:
        """`value` resolved against this resource's spec file directory when relative (URLs untouched)."""
        if "://" in value or Path(value).is_absolute():
            return value
        return str(self.directory / value)


class LoadedCluster(Loaded):
    cluster: AnyCluster

    @property
    def ref(self) -> ClusterRef:
        return _ref_of(self.cluster)

    @property
    def cluster_scoped(self) -> bool:
        """A ClusterEvalCluster: the admin's, trusted with the operator's own credentials."""
        return isinstance(self.cluster, ClusterEvalCluster)

    @property
    def job_script(self) -> str:
        return self.path(self.cluster.spec.job_script)


class LoadedRun(Loaded):
    run: EvalRun

    @property
    def ref(self) -> EvalRunRef:
        """How the store, status and events know it: `namespace/name`, or `name` without a namespace."""
        return EvalRunRef(namespace=self.run.metadata.namespace, name=self.run.metadata.name)

    @property
    def cluster_ref(self) -> ClusterRef:
        """`spec.cluster` names an EvalCluster in the EvalRun's own namespace (as Kubernetes references do);
        `clusterRef` may name a cluster-scoped ClusterEvalCluster instead. With `clusters`: the first."""
        return cluster_named(self.run)

    @property
    def cluster_refs(self) -> list[ClusterRef]:
        """Every cluster it names, spec order (one unless `clusters`)."""
        return clusters_named(self.run)


class SpecSet(BaseModel):
    """Everything `-f` named, validated and cross-checked: every run's cluster is in `clusters`."""

    model_config = ConfigDict(frozen=True)

    clusters: dict[ClusterRef, LoadedCluster]
    evalruns: list[LoadedRun]

    def cluster_of(self, run: LoadedRun) -> LoadedCluster:
        """Its (first) cluster."""
        return self.clusters[run.cluster_ref]

    def clusters_of(self, run: LoadedRun) -> list[LoadedCluster]:
        """Every cluster it names, spec order."""
        return [self.clusters[ref] for ref in run.cluster_refs]


def cluster_named(run: EvalRun) -> ClusterRef:
    return clusters_named(run)[0]


def _ref_of(cluster: AnyCluster) -> ClusterRef:
    if isinstance(cluster, ClusterEvalCluster):
        return ClusterRef(name=cluster.metadata.name, cluster_scoped=True)
    return ClusterRef(namespace=cluster.metadata.namespace, name=cluster.metadata.name)


def load_specs(paths: Sequence[Path], catalog: Catalog | None = None, *, preflight: bool = False) -> SpecSet:
    """Read `paths` (files, or directories searched for *.yaml / *.yml); raise `SpecErrors` listing all problems.

    `preflight`: also refuse what this machine can tell is wrong before a job waits in the queue (a local job
    script that is missing): for the commands that would submit (`validate`, `plan`, `reconcile`), not for those
    that only read what ran."""
    catalog = catalog or load_catalog()
    errors: list[SpecError] = []
    parsed: list[tuple[Resource, Document, Path]] = []
    declared: set[ClusterRef] | None = set()  # clusters, valid or not; None once a document could not be read
    files = _files(paths, errors)
    for file in files:
        documents, read_errors = read_documents(file, str(file))
        errors += read_errors
        if read_errors:
            declared = None
        elif all(document.data is None for document in documents):
            errors.append(SpecError(str(file), 1, 1, "no EvalRun or EvalCluster in this file (it is empty or only "
                                                     "comments); add a resource or leave the file out"))
        for document in documents:
            resource = _parse(document, errors)
            if resource is not None:
                parsed.append((resource, document, file))
            ref = _declared_cluster(document)
            if declared is not None and ref:
                declared.add(ref)
    errors += _cross_check(parsed, catalog, declared)
    if preflight:
        errors += [error for resource, document, file in parsed for error in _missing_job_script(resource, document, file)]
    if errors:
        order = {str(file): index for index, file in enumerate(files)}
        raise SpecErrors(sorted(errors, key=lambda e: (order.get(e.file, -1), e.line, e.col)))
    return _spec_set(parsed)


def load_objects(objects: Sequence[Mapping[str, Any]], base_dir: Path, catalog: Catalog | None = None,
                 policy: OperatorPolicy | None = None) -> SpecSet:
    """Custom resources from the API (the operator), with the same checks as files and, for namespaced objects,
    the operator `policy`. Relative paths of a namespaced object resolve under `base_dir/<namespace>/` (tenants
    never share a dir), of a ClusterEvalCluster under `base_dir`; errors are labelled `<Kind> <namespace>/<name>`
    (no lines: no file)."""
    catalog = catalog or load_catalog()
    errors: list[SpecError] = []
    parsed: list[tuple[Resource, Document, Path]] = []
    declared: set[ClusterRef] = set()
    for data in objects:
        document = Document(object_label(data), data, 1, 1)
        resource = _parse(document, errors)
        if resource is not None:
            directory = base_dir / resource.metadata.namespace if resource.metadata.namespace else base_dir
            parsed.append((resource, document, directory / "resource"))
            if policy is not None:
                refused = (run_refusals(resource, policy) if isinstance(resource, EvalRun)
                           else cluster_refusals(resource, directory, policy))
                errors += [document.error(at, why) for at, why in refused]
        ref = _declared_cluster(document)
        if ref:
            declared.add(ref)
    errors += _cross_check(parsed, catalog, declared)
    if errors:
        raise SpecErrors(errors)
    return _spec_set(parsed)


def object_label(data: Mapping[str, Any]) -> str:
    """`<Kind> <namespace>/<name>`: where an API object's errors are said to be (it has no file)."""
    meta = data.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    return f"{data.get('kind', 'resource')} {meta.get('namespace', '')}/{meta.get('name', '?')}"


def parse_resource(data: Mapping[str, Any], file: str = "<resource>") -> Resource:
    """Validate one already-loaded resource (e.g. a custom resource the operator received); raise `SpecErrors`."""
    errors: list[SpecError] = []
    resource = _parse(Document(file, data, 1, 1), errors)
    if resource is None:
        raise SpecErrors(errors)
    return resource


def _files(paths: Sequence[Path], errors: list[SpecError]) -> list[Path]:
    files: dict[Path, Path] = {}
    for path in paths:
        if not path.exists():
            errors.append(SpecError(str(path), 1, 1, "no such file or directory; check the -f path"))
            continue
        found = list(iter_files(path))
        if not found:
            errors.append(SpecError(str(path), 1, 1, "directory holds no *.yaml or *.yml files"))
        for file in found:
            files.setdefault(file.resolve(), file)
    return list(files.values())


def _parse(document: Document, errors: list[SpecError]) -> Resource | None:
    data = document.data
    if data is None:
        return None
    if not isinstance(data, Mapping):
        found = "a list" if isinstance(data, list) else "a string" if isinstance(data, str) else "a scalar"
        message = f"a resource must be a mapping with apiVersion, kind, metadata and spec, not {found}"
        errors.append(document.error((), message))
        return None
    kind = data.get("kind")
    if kind is None:
        errors.append(document.error((), "missing required field `kind`; add `kind: EvalRun` or `kind: EvalCluster`"))
        return None
    if not isinstance(kind, str) or kind not in KINDS:
        message = f"unknown kind {clip(str(kind))}{suggest(str(kind), KINDS)}; known kinds: {', '.join(KINDS)}"
        errors.append(document.error(("kind",), message))
        return None
    result = validate(KINDS[kind], document, by_alias=True, ignore=("status",))
    if isinstance(result, list):
        errors += result
        return None
    return result


def _declared_cluster(document: Document) -> ClusterRef | None:
    """The EvalCluster a document declares, even if it is invalid (its errors are reported already)."""
    data = document.data
    if isinstance(data, Mapping) and data.get("kind") in CLUSTER_KINDS and isinstance(data.get("metadata"), Mapping):
        name, namespace = data["metadata"].get("name"), data["metadata"].get("namespace")
        if data["kind"] == "ClusterEvalCluster" and isinstance(name, str):
            return ClusterRef(name=name, cluster_scoped=True)
        if isinstance(name, str) and (namespace is None or isinstance(namespace, str)):
            return ClusterRef(namespace=namespace, name=name)
    return None


def _cross_check(
    parsed: list[tuple[Resource, Document, Path]], catalog: Catalog, declared: set[ClusterRef] | None
) -> list[SpecError]:
    """Duplicate names, cluster references (skipped when some document was unreadable) and preset names."""
    errors: list[SpecError] = []
    first: dict[tuple[str, str | None, str], Document] = {}
    for resource, document, _ in parsed:
        key = (resource.kind, resource.metadata.namespace, resource.metadata.name)
        if key in first:
            earlier = first[key].error(("metadata", "name"), "")
            message = (
                f"{resource.kind} {resource.metadata.name} is defined twice (first at {earlier.file}:{earlier.line}:"
                f"{earlier.col}); rename one or delete the copy"
            )
            errors.append(document.error(("metadata", "name"), message))
        first.setdefault(key, document)
    clusters = {_ref_of(r): r for r, _, _ in parsed if isinstance(r, EvalCluster | ClusterEvalCluster)}
    for resource, document, _ in parsed:
        if isinstance(resource, EvalRun):
            found = [clusters[ref] for ref in clusters_named(resource) if ref in clusters]
            errors += run_errors(resource, document, found, declared, catalog)
    errors += identity_collisions([(r, d) for r, d, _ in parsed if isinstance(r, EvalRun)], catalog)
    return errors


def _missing_job_script(resource: Resource, document: Document, file: Path) -> list[SpecError]:
    """A local job script (not over ssh: that one is on the login node) must be a file this user can read: sbatch
    and the local runner read it, and run it through bash when it is not executable."""
    if isinstance(resource, EvalRun) or resource.spec.scheduler.ssh or "://" in resource.spec.job_script:
        return []
    script = file.parent / resource.spec.job_script
    if script.is_file() and os.access(script, os.R_OK):
        return []
    what = "cannot be read" if script.is_file() else "is not a file" if script.exists() else "does not exist"
    return [document.error(("spec", "jobScript"), f"spec.jobScript: {script} {what}; fix the path (a relative one "
                                                  "is read from this file's directory)")]


def _spec_set(parsed: list[tuple[Resource, Document, Path]]) -> SpecSet:
    clusters: dict[ClusterRef, LoadedCluster] = {}
    runs: list[LoadedRun] = []
    for resource, _, file in parsed:
        directory = file.resolve().parent
        if isinstance(resource, EvalCluster | ClusterEvalCluster):
            loaded = LoadedCluster(cluster=resource, file=file, directory=directory)
            clusters[loaded.ref] = loaded
        else:
            runs.append(LoadedRun(run=resource, file=file, directory=directory))
    return SpecSet(clusters=clusters, evalruns=runs)
