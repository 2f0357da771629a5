"""The report as one self-contained HTML file: styles inline, charts inline SVG, no script, nothing fetched."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from markupsafe import Markup

from controller.report.charts import error_histogram, scoreboard
from controller.report.model import Report

K = TypeVar("K")


def render_html(report: Report) -> str:
    environment = Environment(loader=PackageLoader("controller.report", "templates"), undefined=StrictUndefined,
                              autoescape=select_autoescape(["html", "j2"]), trim_blocks=True, lstrip_blocks=True)
    cells = {run.name: {(c.model, c.benchmark): c for c in run.cells} for run in report.runs}
    boards = {run.name: {b: scoreboard(b, [c for c in run.cells if c.benchmark == b]) for b in run.benchmarks}
              for run in report.runs}
    histograms = {(run.name, c.model, c.benchmark): error_histogram(c.errors)
                  for run in report.runs for c in run.cells if c.errors}
    return environment.get_template("report.html.j2").render(
        report=report, cells=cells, boards=_safe(boards), histograms=_safe(histograms))


def _safe(charts: Mapping[K, Any]) -> dict[K, Any]:
    """matplotlib's SVG is markup of ours, not text to escape."""
    return {k: _safe(v) if isinstance(v, Mapping) else Markup(v) for k, v in charts.items()}
