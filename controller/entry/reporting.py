"""`evalctl report`: one plan pass (nothing acts, nothing is recorded), the store's rows of each cell, the step
statistics of the run dirs this host can read, rendered as one HTML file (or its data as JSON or YAML).

`-o` is a format here as in every command; the file goes to `--out PATH`. Versions before 0.5 took the path as
`-o PATH`: such a value is refused with the option that replaced it, never taken for a format or a file name."""

from __future__ import annotations

import io
import json
import os
import tempfile
from collections.abc import Sequence
from datetime import datetime
from enum import StrEnum
from pathlib import Path

from ruamel.yaml import YAML

from controller.adapters.rundirs.post_eval import step_metrics, step_stats
from controller.adapters.secrets import mask_text
from controller.api.catalog import Catalog
from controller.api.loader import LoadedRun, SpecSet
from controller.core.match import join_cells
from controller.core.observed import Observation
from controller.core.ports import ObservationError
from controller.core.reconcile import PassResult
from controller.core.store import Store
from controller.core.trial_errors import ErrorClasses
from controller.core.types import Cell, EvalRunRef
from controller.entry.passes import run_pass
from controller.entry.shell import UsageError
from controller.report.html import render_html
from controller.report.model import Report, as_of, run_report


class ReportFormat(StrEnum):
    html = "html"
    json = "json"
    yaml = "yaml"


DEFAULT_OUT = Path("report.html")


def report_format(value: str) -> ReportFormat:
    """`-o`'s value as a format; a path (the old `-o report.html`) is refused with the option that takes it now."""
    try:
        return ReportFormat(value)
    except ValueError:
        formats = ", ".join(f.value for f in ReportFormat)
        raise UsageError(f"-o {value}: not a format ({formats}); -o is the format, as in plan and status: "
                         f"write the file with --out {value}") from None


def build_report(specs: SpecSet, store: Store, catalog: Catalog, now: datetime) -> tuple[Report, list[PassResult]]:
    """The report, and the pass it was built from (what it could not observe is the command's exit code)."""
    results = run_pass(specs, store, now, act=False, catalog=catalog)
    runs = []
    for run, result in zip(specs.evalruns, results, strict=True):
        steps = {c.run_dir.run_tag: metrics for c in result.plan.cells if c.run_dir is not None
                 and (metrics := _local_steps(c.run_dir.path, catalog.error_classes))}
        cells = [c.cell for c in result.plan.cells]
        runs.append(run_report(result.plan, _rows_and_attempts(result.evalrun, cells, store), catalog.error_classes,
                               run.run.spec.report.trust_threshold, steps, _mlflow(run), result.notes.intake))
    return Report(runs=tuple(runs), as_of=as_of(runs)), results


def report_text(report: Report, form: ReportFormat) -> str:
    """The page, or its data (the HTML's numbers, as the model has them) as JSON or YAML; masked once more (this
    process's secrets, token shapes): a report is shared further than any output."""
    if form == ReportFormat.html:
        return mask_text(render_html(report))
    data = json.loads(report.model_dump_json())
    if form == ReportFormat.json:
        return mask_text(json.dumps(data, indent=2) + "\n")
    yaml, text = YAML(typ="rt"), io.StringIO()
    yaml.default_flow_style = False
    yaml.dump(data, text)
    return mask_text(text.getvalue())


def write_report(text: str, path: Path) -> None:
    """Atomically: a half-written report is never left where a browser or a CI artifact picks it up."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(handle, "w", encoding="utf-8") as out:
        out.write(text)
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


def _local_steps(path: str, errors: ErrorClasses) -> dict[str, float]:
    """Step stats of a run dir on this host's filesystem (a remote cluster's are in its post-eval report), over the
    trials counted as completed, as the post-eval report has them."""
    if "://" in path or not Path(path).is_dir():
        return {}
    try:
        return step_metrics(step_stats(path, errors))
    except OSError:
        return {}


def _mlflow(run: LoadedRun) -> str | None:
    upload = run.run.spec.upload
    if not upload.mlflow:
        return None
    return f"experiment {upload.mlflow_experiment or run.run.metadata.name}, one run per attempt tagged run_tag"
