"""Load EvalCluster / EvalRun resources from files and directories, reporting every problem at once.

Each problem is a `SpecError` (`FILE:LINE:COL: message` with a hint); all of them, across all
files, are raised together as `SpecErrors`, so `evalctl validate` is one round trip for the user.
Checks that need more than one document (cluster references, duplicate names) or the catalog
(preset names) run after every file has been read.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from controller.api.catalog import Catalog, load_catalog
from controller.api.diagnose import validate
from controller.api.errors import SpecError, SpecErrors, clip, format_errors
from controller.api.evalcluster import AnyCluster, ClusterEvalCluster, EvalCluster
from controller.api.evalrun import ClusterReference, EvalRun
from controller.api.identity import identity_collisions
from controller.api.resolve import benchmarks, resolve
from controller.api.tenancy import OperatorPolicy, cluster_refusals, run_refusals
from controller.api.yamldoc import Document, iter_files, read_documents
from controller.core.types import ClusterRef, EvalRunRef, walltime_seconds

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
MAX_CELLS = 10_000  # per EvalRun: every pass plans every cell (the 1,000-cell bench plans in ~2 s warm)


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


def clusters_named(run: EvalRun) -> list[ClusterRef]:
    """A ClusterEvalCluster by its name; an EvalCluster in the EvalRun's own namespace."""
    return [ClusterRef(name=item.name, cluster_scoped=True) if item.kind == "ClusterEvalCluster"
            else ClusterRef(namespace=run.metadata.namespace, name=item.name) for item in run.spec.cluster_refs]


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
        message = f"unknown kind {clip(str(kind))}{_suggest(str(kind), KINDS)}; known kinds: {', '.join(KINDS)}"
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
            errors += _check_run(resource, document, declared, catalog)
            found = [clusters[ref] for ref in clusters_named(resource) if ref in clusters]
            for cluster in found:
                errors += _check_walltime(resource, document, cluster, catalog)
            errors += _check_cells(resource, document, found[0], catalog) if found else []
            errors += _check_tunnels(resource, document, found, catalog)
            errors += _check_shards(resource, document, found[0], catalog) if found else []
            errors += _check_serving(resource, document, catalog)
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


def _check_cells(run: EvalRun, document: Document, cluster: AnyCluster,
                 catalog: Catalog) -> list[SpecError]:
    """Every pass plans every cell: more than MAX_CELLS would make each pass take minutes."""
    found = benchmarks(run, cluster, catalog)
    count = len(run.spec.models) * sum(1 + (b.shards if b.shards > 1 else 0) for b in found)
    if count <= MAX_CELLS:
        return []
    shards = " and their shards" if any(b.shards > 1 for b in found) else ""
    message = (f"{len(run.spec.models)} models × {len(found)} benchmarks{shards} make {count} cells, "
               f"more than {MAX_CELLS}; split them into several EvalRuns")
    return [document.error(("spec", "models"), message)]


def _check_tunnels(run: EvalRun, document: Document, clusters: Sequence[AnyCluster],
                   catalog: Catalog) -> list[SpecError]:
    """With several clusters an EvalRun has no pinggy pairs (refused at spec.pinggy.pairs): a harness that needs one
    would be held at every launch, waiting for a pair no spec may give it."""
    if run.spec.clusters is None or not clusters:
        return []
    needing = sorted({cell.harbor_config for cluster in clusters for cell in resolve(run, cluster, catalog)
                      if cell.needs_pinggy})
    if not needing:
        return []
    message = (f"agent {run.spec.agent} ({', '.join(needing)}) is an installed-agent harness: its jobs need a pinggy "
               "pair, and pinggy pairs are not supported with several clusters yet; split the EvalRun per cluster "
               "(each with spec.cluster and spec.pinggy.pairs), or use an agent that needs no tunnel")
    return [document.error(("spec", "agent"), message)]


def _check_shards(run: EvalRun, document: Document, cluster: AnyCluster, catalog: Catalog) -> list[SpecError]:
    """A sharded cell's union is checked to cover every task once: that needs the catalog's task count. Several
    clusters would put its shards' run dirs where no one pass reads them all."""
    sharded = [b for b in benchmarks(run, cluster, catalog) if b.shards > 1]
    if not sharded:
        return []
    at = ("spec", "shards") if (run.spec.shards or 1) > 1 else ("spec", "presets")
    if run.spec.clusters is not None:
        return [document.error(at, "shards run on one cluster: with several clusters (spec.clusters) set shards to "
                                   "1, or name one cluster")]
    errors = []
    for benchmark in sharded:
        if benchmark.tasks is None:
            errors.append(document.error(at, f"{benchmark.name} cannot run as {benchmark.shards} shards: the catalog "
                                             "does not count its tasks, so nothing could check that the shards cover "
                                             "it; use a preset, or give the preset its tasks in a catalog override"))
        elif benchmark.shards > benchmark.tasks:
            errors.append(document.error(at, f"{benchmark.name} has {benchmark.tasks} tasks, fewer than "
                                             f"{benchmark.shards} shards; ask for at most {benchmark.tasks}"))
    return errors


def _check_walltime(run: EvalRun, document: Document, cluster: AnyCluster, catalog: Catalog) -> list[SpecError]:
    """A pre-walltime margin as long as the walltime would cancel every job the moment it starts."""
    margin = run.spec.monitor.pre_walltime_minutes
    limits = [b.time_limit for b in benchmarks(run, cluster, catalog) if b.time_limit] or [cluster.spec.time_limit]
    shortest = min(limits, key=walltime_seconds)
    limit_minutes = walltime_seconds(shortest) / 60
    if margin < limit_minutes:
        return []
    whose = "timeLimit" if shortest == cluster.spec.time_limit else "shortest preset walltime"
    message = (f"monitor.preWalltimeMinutes ({margin:g}) is not shorter than cluster {cluster.metadata.name}'s "
               f"{whose} ({shortest} = {limit_minutes:g} min): every job would be cancelled as it "
               f"starts; lower preWalltimeMinutes (e.g. {max(limit_minutes // 4, 0):g}) or raise timeLimit")
    return [document.error(("spec", "monitor", "preWalltimeMinutes"), message)]


def _check_serving(run: EvalRun, document: Document, catalog: Catalog) -> list[SpecError]:
    """An agent that parses tool calls out of the text itself must get no vLLM tool-call parser: the parser takes
    the JSON away from it and every trial scores 0, silently (RULES §10). Reported at the registry line
    that gives the parser; at the EvalRun's agent when the registry was not read from a file."""
    harness = catalog.harnesses.harness(run.spec.agent)
    pattern = catalog.harnesses.patterns[harness.pattern]
    if not pattern.client_side_tool_calls or run.spec.agent in catalog.harnesses.model_free_agents:
        return []
    errors: list[SpecError] = []
    for model in run.spec.models:
        parser = catalog.models.serving(model, harness.pattern).tool_call_parser
        if parser is None:
            continue
        message = (f"EvalRun {run.metadata.name}: agent {run.spec.agent} (serving pattern {harness.pattern}) parses "
                   f"tool calls from the text itself, but {clip(model)} would be served with tool_call_parser "
                   f"{parser}: the parser takes that JSON away and every trial scores 0; give the parser to the "
                   f"patterns that need it (serving.patterns.<pattern>.tool_call_parser), not to "
                   f"{harness.pattern}")
        errors.append(catalog.models.error(model, harness.pattern, "tool_call_parser", message)
                      or document.error(("spec", "agent"), message))
    return errors


def _check_run(run: EvalRun, document: Document, declared: set[ClusterRef] | None,
               catalog: Catalog) -> list[SpecError]:
    errors: list[SpecError] = []
    for index, (item, ref) in enumerate(zip(run.spec.cluster_refs, clusters_named(run), strict=True)):
        if declared is not None and ref not in declared:
            at = (("spec", "clusters", index, "name") if run.spec.clusters is not None
                  else ("spec", "cluster") if run.spec.cluster is not None else ("spec", "clusterRef", "name"))
            errors.append(document.error(at, _missing_cluster(run, item, declared)))
    seen: dict[str, str] = {}
    for index, name in enumerate(run.spec.presets or []):
        expanded = catalog.presets.expand(name)
        if not expanded:
            suggestion = _suggest(name, catalog.presets.known)
            message = f"unknown preset {name}{suggestion}; known presets: {_describe(catalog)}"
            errors.append(document.error(("spec", "presets", index), message))
        for preset in expanded:
            if preset in seen:
                errors.append(
                    document.error(
                        ("spec", "presets", index),
                        f"preset {name} repeats {preset}, already included by {seen[preset]}; list each benchmark once",
                    )
                )
                break
            seen[preset] = name
    return errors


def _missing_cluster(run: EvalRun, item: ClusterReference, declared: set[ClusterRef]) -> str:
    if item.kind == "ClusterEvalCluster":
        scoped = sorted(ref.name for ref in declared if ref.cluster_scoped)
        return (f"ClusterEvalCluster {item.name} is not defined by any loaded file"
                f"{_suggest(item.name, scoped)}; ask the operator's admin, or name an EvalCluster of "
                "this namespace (cluster: NAME)")
    namespace = run.metadata.namespace
    where = f" in namespace {namespace}" if namespace else ""
    name = item.name
    here = sorted(ref.name for ref in declared if ref.namespace == namespace and not ref.cluster_scoped)
    elsewhere = sorted(str(ref) if ref.namespace or ref.cluster_scoped else f"{ref.name} (no namespace)"
                       for ref in declared if ref.name == name and ref.namespace != namespace)
    if elsewhere:
        return (f"cluster {name} is not defined{where} by any loaded file, only {', '.join(elsewhere)}: an "
                "EvalRun uses the EvalCluster of its own namespace; give both the same metadata.namespace (or name "
                "a ClusterEvalCluster with clusterRef)")
    known = f"; loaded clusters{where}: {', '.join(here)}" if here else f"; no EvalCluster{where} was loaded"
    return (f"cluster {name} is not defined{where} by any loaded file{_suggest(name, here)}"
            f"{known}; pass the file that defines the EvalCluster with -f")


def _describe(catalog: Catalog) -> str:
    aliases = [f"{alias} (= {'+'.join(names)})" for alias, names in catalog.presets.aliases.items()]
    return ", ".join([*catalog.presets.presets, *aliases])


def _suggest(name: str, known: Sequence[str] | Mapping[str, object]) -> str:
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


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
