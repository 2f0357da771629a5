"""`evalctl report`: one plan pass (nothing acts, nothing is recorded), the store's rows of each cell, the step
statistics of the run dirs this host can read, rendered as one HTML file."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from controller.adapters.rundirs.post_eval import step_metrics, step_stats
from controller.adapters.secrets import mask_text
from controller.api.catalog import Catalog
from controller.api.loader import LoadedRun, SpecSet
from controller.core.match import join_cells
from controller.core.observed import Observation
from controller.core.ports import ObservationError
from controller.core.reconcile import PassResult
from controller.core.store import Store
from controller.core.types import Cell, EvalRunRef
from controller.entry.passes import run_pass
from controller.report.html import render_html
from controller.report.model import Report, as_of, run_report


def build_report(specs: SpecSet, store: Store, catalog: Catalog, now: datetime) -> tuple[Report, list[PassResult]]:
    """The report, and the pass it was built from (what it could not observe is the command's exit code)."""
    results = run_pass(specs, store, now, act=False, catalog=catalog)
    runs = []
    for run, result in zip(specs.evalruns, results, strict=True):
        steps = {c.run_dir.run_tag: metrics for c in result.plan.cells if c.run_dir is not None
                 and (metrics := _local_steps(c.run_dir.path))}
        cells = [c.cell for c in result.plan.cells]
        runs.append(run_report(result.plan, _rows_and_attempts(result.evalrun, cells, store), catalog.error_classes,
                               run.run.spec.report.trust_threshold, steps, _mlflow(run), result.notes.intake))
    return Report(runs=tuple(runs), as_of=as_of(runs)), results


def write_report(report: Report, path: Path) -> None:
    """Atomically: a half-written report is never left where a browser or a CI artifact picks it up. The page is
    masked once more (this process's secrets, token shapes): it is shared further than any output."""
    html = mask_text(render_html(report))
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(handle, "w", encoding="utf-8") as out:
        out.write(html)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(temporary, 0o666 & ~umask)  # as any file the user writes, not mkstemp's 0600
    os.replace(temporary, path)


def _rows_and_attempts(evalrun: EvalRunRef, cells: Sequence[Cell], store: Store) -> list[Observation]:
    """Each cell's rows (its history, whoever wrote them) and its submissions; Unknown cells have none."""
    try:
        snapshot = store.observe(evalrun, sorted({c.model for c in cells}), sorted({c.benchmark_name for c in cells}),
                                 [c.key for c in cells])
    except ObservationError:
        snapshot = None
    return join_cells(cells, snapshot, None, None)


def _local_steps(path: str) -> dict[str, float]:
    """Step stats of a run dir on this host's filesystem (a remote cluster's are in its post-eval report)."""
    if "://" in path or not Path(path).is_dir():
        return {}
    try:
        return step_metrics(step_stats(path))
    except OSError:
        return {}


def _mlflow(run: LoadedRun) -> str | None:
    upload = run.run.spec.upload
    if not upload.mlflow:
        return None
    return f"experiment {upload.mlflow_experiment or run.run.metadata.name}, one run per attempt tagged run_tag"
