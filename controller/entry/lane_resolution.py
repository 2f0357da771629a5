"""A multi-cluster EvalRun's lanes: each cluster's resolution of the cells it may run, and why it may not run the
others (a pin sends the model elsewhere; the preset's walltime does not fit there). Single-cluster EvalRuns have
none: their one cluster clamps a walltime as it always did."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from controller.api.catalog import Catalog
from controller.api.loader import LoadedCluster, LoadedRun
from controller.api.resolve import benchmarks, resolve
from controller.core.lanes import ClusterLane
from controller.core.planner import Policy
from controller.core.types import Cell


def lanes_for(run: LoadedRun, clusters: Sequence[LoadedCluster], catalog: Catalog, models: Sequence[str] | None,
              policy_of: Callable[[LoadedCluster], Policy]) -> tuple[tuple[ClusterLane, ...], tuple[Cell, ...]]:
    """One lane per cluster, spec order, and the EvalRun's cells: one per (model, benchmark) in spec order, as the
    first cluster that may run it resolves it (the first cluster's resolution when none may: the first lane lists it, every
    lane gives its reason, and the planner holds it).

    A cell is one cell wherever it runs, so its key must be the same on each cluster it may run on: a cluster
    whose hardwareProfile resolves it to another configuration (another fingerprint) may not run it."""
    resolved = [resolve(run.run, cluster.cluster, catalog, models, one_cluster=False) for cluster in clusters]
    walltime = [_too_long(run, cluster, catalog) for cluster in clusters]
    why = [_reasons(run, cluster, cells, walltime[lane])
           for lane, (cluster, cells) in enumerate(zip(clusters, resolved, strict=True))]
    cells: list[Cell] = []
    nowhere = set()  # the first lane lists them too: the planner holds them there, saying why
    for index in range(len(resolved[0])):  # every cluster resolves the same (model, benchmark)s in the same order
        eligible = [lane for lane in range(len(clusters)) if not why[lane][index]]
        if not eligible:
            nowhere.add(index)
        chosen = resolved[eligible[0] if eligible else 0][index]
        for lane in eligible[1:]:
            if resolved[lane][index].key != chosen.key:
                profile = clusters[lane].cluster.spec.hardware_profile
                why[lane][index] = (f"resolves to another configuration on {clusters[lane].cluster.metadata.name} "
                                    f"({f'hardwareProfile {profile}' if profile else 'no hardwareProfile'}): it runs "
                                    f"as {chosen.cluster} resolves it")
        cells.append(chosen)
    lanes = tuple(
        ClusterLane(cluster=cluster.ref, policy=policy_of(cluster),
                    cells=tuple(cell for index, (cell, reason) in enumerate(zip(resolved[lane], why[lane], strict=True))
                                if not reason or (lane == 0 and index in nowhere)),
                    ineligible={cells[index].key: reason for index, reason in enumerate(why[lane]) if reason},
                    too_long=frozenset(cells[index].key for index, reason in enumerate(why[lane])
                                       if reason and reason == walltime[lane].get(cells[index].benchmark)))
        for lane, cluster in enumerate(clusters))
    return lanes, tuple(cells)


def _reasons(run: LoadedRun, cluster: LoadedCluster, cells: Sequence[Cell], too_long: dict[str, str]) -> list[str]:
    """Why each of `cells` cannot run on `cluster` ("" when it can)."""
    name = cluster.cluster.metadata.name
    return [_pinned_elsewhere(run, name, cell.model) or too_long.get(cell.benchmark, "") for cell in cells]


def _too_long(run: LoadedRun, cluster: LoadedCluster, catalog: Catalog) -> dict[str, str]:
    """Benchmark → why its walltime keeps it off `cluster`: several clusters, a cell runs where its whole walltime
    fits, never cut into chunks on a shorter one."""
    name, longest = cluster.cluster.metadata.name, cluster.cluster.spec.longest_walltime
    return {b.name: f"needs {b.walltime}; {name} allows at most {longest}"
            for b in benchmarks(run.run, cluster.cluster, catalog) if b.clamped}


def _pinned_elsewhere(run: LoadedRun, name: str, model: str) -> str:
    pinned = run.run.spec.pinned_to(model)
    return f"pinned to {pinned}" if pinned is not None and pinned != name else ""
