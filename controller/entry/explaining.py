"""Which EvalRuns `evalctl explain MODEL BENCHMARK` needs: only those that may hold the cell, so no other cluster is
dialled; and the nearest cells when none does (a typo deserves a suggestion, not a bare "no cell")."""

from __future__ import annotations

import difflib
from collections.abc import Sequence

from controller.api.catalog import Catalog
from controller.api.loader import SpecSet
from controller.api.resolve import resolve
from controller.core.types import Cell
from controller.entry.shell import UsageError

SUGGESTED = 3


def names_cell(cell: Cell, model: str, benchmark: str) -> bool:
    return cell.model == model and benchmark in (cell.benchmark, cell.dataset, cell.benchmark_name)


def nearest_cells(cells: Sequence[Cell], model: str, benchmark: str) -> str:
    """'; nearest: …' with the cells whose names are closest to the ones asked for ('' when none is close)."""
    labels = sorted({f"{c.model} × {c.benchmark}" for c in cells})
    nearest = difflib.get_close_matches(f"{model} × {benchmark}", labels, n=SUGGESTED, cutoff=0.5)
    return f"; nearest: {', '.join(nearest)}" if nearest else ""


def specs_holding(specs: SpecSet, catalog: Catalog, model: str, benchmark: str) -> SpecSet:
    """The EvalRuns that list the cell, and those whose modelSelector may have chosen its model (the store says
    which did); raises UsageError with the nearest listed cells when none may hold it."""
    listed = {run.ref: resolve(run.run, specs.cluster_of(run).cluster, catalog, None) for run in specs.evalruns}
    holding = [run for run in specs.evalruns if run.run.spec.model_selector is not None
               or any(names_cell(c, model, benchmark) for c in listed[run.ref])]
    if not holding:
        raise UsageError(f"no cell {model} × {benchmark} in these specs"
                         + nearest_cells([c for cells in listed.values() for c in cells], model, benchmark))
    clusters = {ref for run in holding for ref in run.cluster_refs}
    return SpecSet(clusters={ref: c for ref, c in specs.clusters.items() if ref in clusters}, evalruns=holding)
