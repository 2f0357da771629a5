"""`status --watch`: a table of cells with progress bars, redrawn in place on a terminal (rich.live). Piped to a
file or a CI log it redraws nothing: a frame is printed (under the time it was read) only when it differs from
the last one, with no cursor or colour codes, so the log holds each change once."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from controller.core.status import summarize
from controller.core.vocabulary import CellPlan, Phase, Plan
from controller.entry.render import PHASE_STYLE, TABLE_CELLS_MAX, progress_text

BAR_WIDTH = 24


def watch_view(plans: Sequence[Plan]) -> RenderableType:
    """A table per EvalRun, a row per cell: phase, then a bar of scored trials and `5/18 · ETA 14 min` while it
    runs, or its uploaded score and the trials it rests on (`0.412 (n=89)`) and its trust flags once it has one.
    Past TABLE_CELLS_MAX cells, the Completed ones are counted rather than listed."""
    return Group(*(_run_table(plan) for plan in plans))


def _run_table(plan: Plan) -> Table:
    counts = summarize(plan).counts
    summary = ", ".join(f"{n} {phase.value}" for phase, n in sorted(counts.items(), key=lambda i: -i[1]) if n)
    cells = list(plan.cells)
    caption = None
    if len(cells) > TABLE_CELLS_MAX:
        unfinished = [c for c in cells if c.phase != Phase.COMPLETED]
        cells = unfinished[:TABLE_CELLS_MAX]
        caption = f"{counts[Phase.COMPLETED]} Completed cells and {len(unfinished) - len(cells)} more not listed"
    table = Table(title=f"EvalRun {plan.evalrun}: {summary}", caption=caption, expand=False)
    for column in ("model", "benchmark", "phase", "trials scored / score", "progress"):
        table.add_column(column, overflow="fold")
    for cell in cells:
        table.add_row(cell.cell.model, cell.cell.benchmark, f"[{PHASE_STYLE[cell.phase]}]{cell.phase.value}[/]",
                      _result(cell), _progress(cell))
    return table


def _result(cell: CellPlan) -> RenderableType:
    """A scored cell's score and n, where an unscored one has its bar: a full bar says less than the number."""
    if cell.score is not None:
        return f"{cell.score:.3f}" + (f" (n={cell.n_scored})" if cell.n_scored is not None else "")
    progress = cell.progress
    if progress is None or not progress.total:
        return ""
    return ProgressBar(total=progress.total, completed=min(progress.scored, progress.total), width=BAR_WIDTH)


def _progress(cell: CellPlan) -> str:
    if cell.score is not None:
        return ", ".join(flag for flag, on in (("provisional", cell.provisional), ("partial", cell.partial)) if on)
    return progress_text(progress) if (progress := cell.progress) is not None else ""


class Watch:
    """Shows each reading of the plans: in place on a terminal, as changed frames elsewhere."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.live = Live(console=console, auto_refresh=False) if console.is_terminal else None
        self.last_frame: str | None = None

    def __enter__(self) -> Watch:
        if self.live is not None:
            self.live.start()
        return self

    def __exit__(self, *_: object) -> None:
        if self.live is not None:
            self.live.stop()

    def show(self, plans: Sequence[Plan], read_at: datetime) -> None:
        view = watch_view(plans)
        if self.live is not None:
            self.live.update(Group(Text(f"read {read_at:%Y-%m-%d %H:%M:%S} UTC"), view), refresh=True)
            return
        with self.console.capture() as captured:
            self.console.print(view)
        frame = captured.get()
        if frame != self.last_frame:
            self.last_frame = frame
            self.console.print(f"{read_at:%Y-%m-%d %H:%M:%S} UTC", highlight=False)
            self.console.file.write(frame)
            self.console.file.flush()
