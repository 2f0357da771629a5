"""What an EvalRun is checked against once every file is read: the clusters it names (declared, and their
limits), the presets of the catalog, and what its cells, tunnels, shards, walltime and serving need of them."""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence

from controller.api.catalog import Catalog
from controller.api.errors import SpecError, clip
from controller.api.evalcluster import AnyCluster
from controller.api.evalrun import ClusterReference, EvalRun
from controller.api.resolve import benchmarks, resolve
from controller.api.yamldoc import Document
from controller.core.types import ClusterRef, walltime_seconds

MAX_CELLS = 10_000  # per EvalRun: every pass plans every cell (the 1,000-cell bench plans in ~2 s warm)



def clusters_named(run: EvalRun) -> list[ClusterRef]:
    """A ClusterEvalCluster by its name; an EvalCluster in the EvalRun's own namespace."""
    return [ClusterRef(name=item.name, cluster_scoped=True) if item.kind == "ClusterEvalCluster"
            else ClusterRef(namespace=run.metadata.namespace, name=item.name) for item in run.spec.cluster_refs]


def run_errors(run: EvalRun, document: Document, clusters: Sequence[AnyCluster], declared: set[ClusterRef] | None,
               catalog: Catalog) -> list[SpecError]:
    """Every problem of the EvalRun against the `clusters` it names that were loaded, the `declared` ones (None:
    some document was unreadable, references not checked) and the catalog."""
    errors = _check_run(run, document, declared, catalog)
    for cluster in clusters:
        errors += _check_walltime(run, document, cluster, catalog)
    errors += _check_cells(run, document, clusters[0], catalog) if clusters else []
    errors += _check_tunnels(run, document, clusters, catalog)
    errors += _check_shards(run, document, clusters[0], catalog) if clusters else []
    errors += _check_serving(run, document, catalog)
    return errors


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
            suggestion = suggest(name, catalog.presets.known)
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
                f"{suggest(item.name, scoped)}; ask the operator's admin, or name an EvalCluster of "
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
    return (f"cluster {name} is not defined{where} by any loaded file{suggest(name, here)}"
            f"{known}; pass the file that defines the EvalCluster with -f")


def _describe(catalog: Catalog) -> str:
    aliases = [f"{alias} (= {'+'.join(names)})" for alias, names in catalog.presets.aliases.items()]
    return ", ".join([*catalog.presets.presets, *aliases])


def suggest(name: str, known: Sequence[str] | Mapping[str, object]) -> str:
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""
