"""Charts as inline SVG, drawn by matplotlib: no script, no font or image fetched, the same bytes for the same data."""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from typing import Any

import matplotlib

matplotlib.use("svg")  # no display, no GUI toolkit: also on a login node

from matplotlib import pyplot as plt
from matplotlib.figure import Figure

from controller.report.model import CellReport

STYLE: dict[Any, Any] = {"svg.hashsalt": "evalctl-report", "svg.fonttype": "none", "font.size": 9, "font.family": "sans-serif",
         "axes.spines.top": False, "axes.spines.right": False}
PROVISIONAL_ALPHA = 0.35


def scoreboard(benchmark: str, cells: Sequence[CellReport]) -> str:
    """One benchmark: a bar per model with its score ± stderr; provisional bars pale, missing scores absent."""
    with plt.rc_context(STYLE):
        figure, axes = plt.subplots(figsize=(7, 0.35 * len(cells) + 0.9))
        names = [c.model for c in cells]
        positions = range(len(cells))
        scores = [c.score if c.score is not None else 0.0 for c in cells]
        errors = [c.stderr if c.stderr is not None and c.score is not None else 0.0 for c in cells]
        bars = axes.barh(positions, scores, xerr=errors, color="#3b6ea8", error_kw={"elinewidth": 0.8})
        for bar, cell in zip(bars, cells, strict=True):
            if cell.score is None:
                bar.set_visible(False)
            elif cell.provisional:
                bar.set_alpha(PROVISIONAL_ALPHA)
        axes.set_yticks(list(positions), names)
        axes.invert_yaxis()
        axes.set_xlim(0, max(1.0, max((s + e for s, e in zip(scores, errors, strict=True)), default=1.0)))
        axes.set_xlabel(f"{benchmark}: accuracy ± stderr (pale: provisional)")
        return _svg(figure)


def error_histogram(errors: dict[str, int]) -> str:
    """The error classes of one cell's trials, every known class shown (zeros too), as MLflow logs them."""
    with plt.rc_context(STYLE):
        figure, axes = plt.subplots(figsize=(4.2, 0.22 * len(errors) + 0.6))
        names = list(errors)
        axes.barh(range(len(names)), [errors[n] for n in names], color="#b5563c")
        axes.set_yticks(range(len(names)), names)
        axes.invert_yaxis()
        top = max(errors.values(), default=0)
        axes.set_xlim(0, max(1, math.ceil(top * 1.1)))
        axes.set_xlabel("trials")
        return _svg(figure)


def _svg(figure: Figure) -> str:
    figure.tight_layout()
    buffer = io.StringIO()
    figure.savefig(buffer, format="svg", metadata={"Date": None, "Creator": None})
    plt.close(figure)
    text = buffer.getvalue()
    return text[text.index("<svg"):]  # the XML prolog and DOCTYPE do not belong inside HTML
