"""How plans and passes look to a person (rich) and to a program (JSON)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from controller.core.gpu_hours import GpuEstimate
from controller.core.levers import force_upload_lever
from controller.core.progress import Progress
from controller.core.reconcile import PassResult
from controller.core.retry import retry_command
from controller.core.status import GpuSummary, RunStatus, gpu_summary, summarize
from controller.core.vocabulary import CellPlan, Effect, PassNotes, Phase, Plan, Rule
from controller.core.walltime import hours_text
from controller.entry.humanize import value_text

TABLE_CELLS_MAX = 200  # past this many cells, `plan` shows a row per decision rather than per cell
PHASE_STYLE = {
    Phase.COMPLETED: "green", Phase.EVALUATED: "cyan", Phase.RUNNING: "blue", Phase.SUBMITTED: "blue",
    Phase.PENDING: "white", Phase.SETTLING: "yellow", Phase.STALLED: "yellow", Phase.FAILED: "red",
    Phase.UNKNOWN: "magenta",
}


def plan_json(results: Sequence[PassResult]) -> str:
    return json.dumps({"evalruns": [
        {"name": str(p.evalrun), "suspended": p.suspended, "preflight": p.preflight or None,
         "cells": [_cell_json(c, p) for c in p.cells],
         "gpu_hours": gpu_summary(p).model_dump(mode="json"), **_selector_json(r.notes)}
        for r in results for p in (r.plan,)
    ]}, indent=2)


def _selector_json(notes: PassNotes) -> dict[str, Any]:
    if not notes.intake:
        return {}
    return {"modelSelector": {"note": notes.intake,
                              "selected": [s.model_dump(mode="json") for s in notes.selections]}}


def _cell_json(cell: CellPlan, plan: Plan, spec_args: Sequence[str] = (), store_args: Sequence[str] = ()
               ) -> dict[str, Any]:
    estimate = plan.estimate(cell)
    release = {"release": retry_command(spec_args, cell.cell)} if spec_args and cell.held else {}
    retry = {"retry": cell.retry.model_dump(mode="json")} if cell.retry is not None else {}
    levers = {"levers": found} if (found := other_levers(cell, store_args)) else {}
    return {
        "model": cell.cell.model,
        "benchmark": cell.cell.benchmark,
        "dataset": cell.cell.dataset,
        "cluster": plan.clusters.get(cell.cell.key) if plan.clusters else cell.cell.cluster,
        "phase": cell.phase.value,
        "actions": [{"kind": a.kind.value, "reason": a.reason} for a in cell.actions],
        "reason": cell.reason,
        "hold": cell.hold_reason or None,
        "rule": cell.rule.value,
        "health": None if cell.health is None else {"state": cell.health.value, "note": cell.health_note},
        "score": cell.score,
        "n_scored": cell.n_scored,
        "provisional": cell.provisional,
        "partial": cell.partial,
        "evidence": cell.evidence or None,
        "gpu_hours": cell.gpu_hours,
        "est_gpu_hours": None if estimate is None else estimate.model_dump(mode="json"),
        "progress": None if (progress := cell.progress) is None else progress.model_dump(mode="json"),
        **retry,
        **release,
        **levers,
    }


def plan_table(result: PassResult, console: Console) -> None:
    """A row per cell; past TABLE_CELLS_MAX cells, a row per decision (phase, rule, action kinds), counted, with
    its first cell and reason: rich measures every cell of every row (~0.8 s per 1,000 rows here), and nobody
    reads 5,000 rows. `-o json` has every cell."""
    plan = result.plan
    title = f"EvalRun {plan.evalrun}" + (" (suspended)" if plan.suspended else "")
    if len(plan.cells) > TABLE_CELLS_MAX:
        _decisions_table(plan, title, console)
        selections(result.notes, console)
        return
    table = Table(title=title, expand=False)
    where = ("cluster",) if plan.clusters else ()  # several clusters: where each cell ran or goes (RULES §15)
    for column in ("model", "benchmark", *where, "phase", "est. GPU-h", "actions", "reason"):
        table.add_column(column, overflow="fold")
    for cell in plan.cells:
        placed = (plan.clusters.get(cell.cell.key, "—"),) if where else ()
        table.add_row(cell.cell.model, cell.cell.benchmark, *placed, _phase(cell.phase), _gpu_cell(cell, plan),
                      _actions(cell), cell.reason)
    console.print(table)
    spending(plan, console)
    effects(plan, console)
    selections(result.notes, console)


def effects(plan: Plan, console: Console, store_args: Sequence[str] = ()) -> None:
    """Every remedy in force, and how to undo the ones a person may lift (`store_args`: the store it is in, for a
    command that reads no spec); the cluster's failed preflight."""
    if plan.preflight:
        console.print(f"  launches held: {plan.preflight}", markup=False, highlight=False)
    for effect in plan.effects:
        console.print(f"  in force: {effect.line()}", markup=False, highlight=False)
    if any(effect.kind == "node" for effect in plan.effects):
        console.print(f"  (lift a node's quarantine: {with_args('evalctl nodes release NODE --cluster CLUSTER', store_args)})",
                      markup=False, highlight=False)


def with_args(command: str, args: Sequence[str]) -> str:
    return " ".join((command, *args))


def other_levers(cell: CellPlan, store_args: Sequence[str]) -> list[str]:
    """What releases a held cell besides `evalctl retry`: the command a hold names (with the store it is in), and,
    for an upload hold, upload.forceUpload (RULES §14), which uploads the run that is there instead of a new one."""
    commands = [with_args(hold.release, store_args) for hold in cell.holds if hold.release]
    force = force_upload_lever(cell)
    return list(dict.fromkeys(commands)) + ([force] if force else [])


def _gpu_cell(cell: CellPlan, plan: Plan) -> str:
    """A cell not yet run: its estimate and where it comes from; one that ran: what it spent."""
    estimate = plan.estimate(cell)
    if estimate is not None:
        return f"? ({estimate.source.value})" if estimate.hours is None else f"{estimate.hours:.2f} ({estimate.source.value})"
    return "—" if cell.gpu_hours is None else f"{cell.gpu_hours:.2f} spent"


def estimate_text(estimate: GpuEstimate) -> str:
    """`2.10 GPU-h (median of 3 finished attempt(s) of tb2, 0–14B); est. 2 h 30 m (p90 3 h 00 m) from …; server
    start 13 m (measured, median of 4 job(s) of 0–14B)`: the start a sized request adds where the estimate lacks it."""
    hours = "unknown GPU-h" if estimate.hours is None else f"{estimate.hours:.2f} GPU-h"
    wall = estimate.wall
    if wall is None:
        return f"{hours} ({estimate.basis}); no wall time to go by"
    start = "" if wall.start_hours is None else f"; server start {hours_text(wall.start_hours)} ({wall.start_basis})"
    return (f"{hours} ({estimate.basis}); est. {hours_text(wall.median_hours)} (p90 {hours_text(wall.high_hours)}) "
            f"from {wall.basis}{start}")


def spending(plan: Plan, console: Console) -> None:
    """What the plan's cells spent and are estimated to, and how sized walltimes fared (walltime auto)."""
    console.print(gpu_line(gpu_summary(plan)), highlight=False)
    if plan.walltime is not None:
        console.print(plan.walltime.summary(), highlight=False)


def gpu_line(gpu: GpuSummary) -> str:
    """`est. GPU-h: 12.40 for 3 cell(s) not yet run (history 2, unknown 1); 3.10 spent; budget 400 GPU-h`."""
    sources = ", ".join(f"{source} {n}" for source, n in gpu.by_source.items())
    line = (f"est. GPU-h: {gpu.estimated:.2f} for {gpu.not_yet_run} cell(s) not yet run"
            + (f" ({sources})" if sources else "") + f"; {gpu.spent:.2f} spent")
    if gpu.by_cluster:
        line += " (" + ", ".join(f"{name} {hours:.2f}" for name, hours in gpu.by_cluster.items()) + ")"
    if gpu.max_hours is not None:
        line += f"; budget {gpu.max_hours:g} GPU-h (spec.budget.maxGpuHours)"
        line += f", {gpu.held} launch(es) held" if gpu.held else ""
    return line


def selections(notes: PassNotes, console: Console) -> None:
    """What the modelSelector did, and which models it took: when, and by which rule."""
    if not notes.intake:
        return
    console.print(f"modelSelector: {notes.intake}", markup=False)
    for selection in notes.selections[:TABLE_CELLS_MAX]:
        console.print(f"  {selection.model}: selected {selection.selected_at:%Y-%m-%d %H:%M} UTC by "
                      f"{selection.rule}", markup=False)
    if len(notes.selections) > TABLE_CELLS_MAX:
        console.print(f"  … and {len(notes.selections) - TABLE_CELLS_MAX} more (-o json lists them)", markup=False)


def _decisions_table(plan: Plan, title: str, console: Console) -> None:
    groups: dict[tuple[Phase, str, tuple[str, ...]], list[CellPlan]] = {}
    for cell in plan.cells:
        groups.setdefault((cell.phase, cell.rule.value, tuple(a.kind.value for a in cell.actions)), []).append(cell)
    table = Table(title=f"{title}: {len(plan.cells)} cells in {len(groups)} decisions",
                  caption="one row per decision, with its first cell; `-o json` lists every cell", expand=False)
    for column in ("cells", "phase", "first cell", "actions", "reason"):
        table.add_column(column, overflow="fold", justify="right" if column == "cells" else "left")
    for (phase, _, _), cells in sorted(groups.items(), key=lambda group: -len(group[1])):
        first = cells[0]
        table.add_row(str(len(cells)), _phase(phase), f"{first.cell.model} × {first.cell.benchmark}", _actions(first),
                      first.reason)
    console.print(table)
    spending(plan, console)


def _actions(cell: CellPlan) -> str:
    return "\n".join(a.render() for a in cell.actions) or "—"


def status_grid(result: PassResult, console: Console, spec_args: Sequence[str] = (),
                store_args: Sequence[str] = ()) -> None:
    """Models × benchmarks, each cell its phase and its uploaded score, or its progress (`Running 5/18 · ETA 14
    min`) until one is uploaded (a sharded cell's own, which says how far its shards are); then each held cell, why,
    and what releases it (`spec_args`: how the command was told its specs and store, for `evalctl retry`;
    `store_args`: its store, for a command that reads no spec)."""
    plan = result.plan
    benchmarks = list(dict.fromkeys(c.cell.benchmark for c in plan.cells))
    models = list(dict.fromkeys(c.cell.model for c in plan.cells))
    by_key = {(c.cell.model, c.cell.benchmark): c for c in plan.cells if c.cell.shard is None}  # a shard: its cell's
    counts = summarize(plan).counts
    summary = ", ".join(f"{n} {phase.value}" for phase, n in sorted(counts.items(), key=lambda i: -i[1]) if n)
    table = Table(title=f"EvalRun {plan.evalrun}" + (" (suspended)" if plan.suspended else "") + f": {summary}")
    table.add_column("model")
    for bench in benchmarks:
        table.add_column(bench, justify="center")
    for model in models:
        cells = [by_key.get((model, bench)) for bench in benchmarks]
        table.add_row(model, *(_grid_cell(c) + _where(c, plan) for c in cells))
    console.print(table)
    spending(plan, console)
    effects(plan, console, store_args)
    held(plan, console, spec_args, store_args)
    if result.notes.notifications:
        console.print(f"  notifications: {result.notes.notifications}", markup=False, highlight=False)
    selections(result.notes, console)
    for source in result.unobserved:
        console.print(f"  {source.line()}", markup=False, highlight=False)


def _where(cell: CellPlan | None, plan: Plan) -> str:
    """Several clusters (RULES §15): ` @ lab-b`, the cluster the cell ran on or goes to."""
    placed = plan.clusters.get(cell.cell.key) if cell is not None else None
    return f" @ {placed}" if placed else ""


def held(plan: Plan, console: Console, spec_args: Sequence[str], store_args: Sequence[str] = ()) -> None:
    """Each held cell, whatever its phase: its hold, then what releases it: a retry already asked for, or the command
    that asks for one (a Failed cell, RULES §13), the command its hold names, upload.forceUpload (an upload hold).
    A hold a retry does not release (the GPU budget, a failed preflight, the spec) says in its reason what does."""
    for cell in plan.cells:
        if cell.rule == Rule.RETRY and cell.retry is not None:
            console.print(f"  retry: {cell.cell.label}: {cell.retry.line()}: released by the next pass",
                          markup=False, highlight=False)
        if not cell.holds:
            continue
        console.print(f"  held: {cell.cell.label}: {cell.hold_reason}", markup=False, highlight=False)
        retried = cell.held and (cell.retry is not None or bool(spec_args))
        if cell.held and cell.retry is not None:
            console.print(f"    {cell.retry.line()}: the next pass releases it", markup=False, highlight=False)
        elif cell.held and spec_args:
            console.print(f"    release: {retry_command(spec_args, cell.cell)}", markup=False, highlight=False)
        for lever in other_levers(cell, store_args):
            console.print(f"    {'or' if retried else 'release'}: {lever}", markup=False, highlight=False)


def status_json(results: Sequence[PassResult], spec_args: Sequence[str] = (), store_args: Sequence[str] = ()) -> str:
    """The same summary the operator writes to `.status` (conditions, attention), plus every cell; a held cell
    with its hold (`hold`), the retry that releases it (`release`, a Failed cell) and what else does (`levers`);
    `held` lists them, as the grid does."""
    return json.dumps({"evalruns": [{**_status_json(r.plan, r.status, r.notes, spec_args, store_args),
                                     "unobserved": [u.model_dump(mode="json") for u in r.unobserved]}
                                    for r in results]}, indent=2)


def _status_json(plan: Plan, summary: RunStatus, notes: PassNotes, spec_args: Sequence[str],
                 store_args: Sequence[str]) -> dict[str, Any]:
    cells = [_cell_json(c, plan, spec_args, store_args) for c in plan.cells]
    return {
        "name": str(plan.evalrun),
        "suspended": plan.suspended,
        "counts": {phase.value: n for phase, n in summary.counts.items() if n},
        "conditions": [c.model_dump(mode="json", exclude_none=True) for c in summary.conditions],
        "attention": [a.model_dump(mode="json", exclude_none=True) for a in summary.attention],
        "held": [{key: shown[key] for key in HELD_KEYS if key in shown} for shown in cells if shown["hold"]],
        "cells": cells,
        "gpu_hours": summary.gpu_hours.model_dump(mode="json"),
        "walltime": None if plan.walltime is None else plan.walltime.model_dump(mode="json"),
        "quarantined": [q.model_dump(mode="json") for q in plan.quarantined],
        "effects": [e.model_dump(mode="json") for e in plan.effects],
        "notifications": notes.notifications,
        **_selector_json(notes),
    }


HELD_KEYS = ("model", "benchmark", "cluster", "phase", "hold", "release", "levers")


def pass_summary(results: Sequence[PassResult], console: Console) -> None:
    """One pass: a line per EvalRun, then its actions' outcomes, or its decisions counted when it acted on none."""
    for result in results:
        _summary_line(result, console)
        if not result.outcomes:
            _decisions_counted(result, console)
        _outcomes(result, console)


Decisions = dict[str, dict[str, str]]  # EvalRun → cell label → what its plan decided, in words


def loop_summary(results: Sequence[PassResult], console: Console, before: Decisions, *, every_cell: bool) -> Decisions:
    """A pass of `--loop`, fit for a log that runs for days: its line per EvalRun and its outcomes, then only the
    cells whose decision changed since the pass before (`every_cell`: as `--once` shows them). Returns what each
    cell decided, for the next pass."""
    after: Decisions = {}
    for result in results:
        now = after[str(result.evalrun)] = {
            c.cell.label: "; ".join(a.render() for a in c.actions) or c.reason for c in result.plan.cells}
        earlier = before.get(str(result.evalrun))
        _summary_line(result, console)
        if every_cell or earlier is None:
            if not result.outcomes:
                _decisions_counted(result, console)
        else:
            for label, decision in now.items():
                if earlier.get(label) != decision:
                    console.print(f"  {label}: {decision}", highlight=False)
        _outcomes(result, console)
    return after


def _summary_line(result: PassResult, console: Console) -> None:
    done = sum(1 for o in result.outcomes if o.ok)
    failed = sum(1 for o in result.outcomes if not o.ok)
    line = f"{result.evalrun}: {done} action(s) done" + (f", {failed} failed" if failed else "")
    console.print(line + (f" ({result.note})" if result.note else ""))
    if result.plan.preflight:
        console.print(f"  launches held: {result.plan.preflight}", markup=False, highlight=False)


def _decisions_counted(result: PassResult, console: Console) -> None:
    decisions = Counter(a.render() for c in result.plan.cells for a in c.actions)
    for decision, n in decisions.most_common():
        console.print(f"  {n} × {decision}", highlight=False)


def _outcomes(result: PassResult, console: Console) -> None:
    for outcome in result.outcomes:
        mark = "[green]✓[/]" if outcome.ok else "[red]✗[/]"
        console.print(f"  {mark} {outcome.cell}: {outcome.action}: {outcome.message}", highlight=False)


def explain(cell: CellPlan, console: Console, now: datetime, in_force: Sequence[Effect] = (),
            spec_args: Sequence[str] = (), where: str = "", estimate: GpuEstimate | None = None,
            store_args: Sequence[str] = ()) -> None:
    """Every value as a person reads it (humanize): no enum or datetime repr reaches the screen. `in_force`: the
    plan's effects; the cluster's and this cell's are shown. A held cell: what releases it (`spec_args` for a
    retry, `store_args` for a command that reads no spec). `where`: several clusters, the one it ran on or goes to
    (RULES §15). `estimate`: a cell not run yet, what one attempt is expected to cost and take, and from what."""
    c = cell.cell
    console.print(f"[bold]{escape(c.label)}[/] (EvalRun {c.evalrun})", highlight=False)
    console.print(f"  dataset {c.dataset}, agent {c.agent}, harbor config {c.harbor_config}, "
                  f"timeout ×{c.timeout_multiplier:g}, n_concurrent {c.n_concurrent}", highlight=False)
    console.print(f"  cell key {c.key}", highlight=False)
    if where:
        console.print(f"  cluster: {where}", highlight=False)
    trials = f" {progress_text(progress)}" if (progress := cell.progress) is not None else ""
    console.print(f"  phase:  {_phase(cell.phase)}{trials}")
    console.print(f"  score:  {value_text(cell.score, now)}" + (_trust_flags(cell) if cell.score is not None
                                                                 else " (none uploaded)"), highlight=False)
    if cell.evidence:
        console.print(f"  admission: {cell.evidence}", highlight=False)
    console.print(f"  rule:   {cell.rule.citation}", highlight=False)
    console.print(f"  reason: {cell.reason}", highlight=False)
    if cell.health is not None:
        console.print(f"  health: {cell.health_note or cell.health.value}", highlight=False)  # the note names it
    if cell.gpu_hours is not None:
        console.print(f"  GPU-hours: {cell.gpu_hours:.2f} spent (this EvalRun's jobs of the cell)", highlight=False)
    if estimate is not None:
        console.print(f"  estimate: {estimate_text(estimate)}", highlight=False)
    for action in cell.actions:
        console.print(f"  action: {action.render()}", highlight=False)
    if cell.retry is not None:
        console.print(f"  retry:  {cell.retry.line()} (pending: "
                      f"{'released by the next pass' if cell.rule == Rule.RETRY else 'waits for a hold to release'})",
                      markup=False, highlight=False)
    elif cell.held and spec_args:
        console.print(f"  release: {retry_command(spec_args, cell.cell)}", markup=False, highlight=False)
    retried = cell.retry is not None or (cell.held and bool(spec_args))
    for lever in other_levers(cell, store_args):
        console.print(f"  {'or' if retried else 'release'}: {lever}", markup=False, highlight=False)
    for effect in in_force:
        if effect.kind != "refire" or effect.subject == c.label:
            console.print(f"  in force: {effect.line()}", markup=False, highlight=False)
    for update in cell.row_updates:
        console.print(f"  record: {value_text(update, now)}", highlight=False)
    for key, value in cell.memory:
        if value is not None and value != ():
            console.print(f"  remembered {key}: {value_text(value, now)}", highlight=False)
    if cell.run_dir is not None:
        d = cell.run_dir
        where = f"{d.run_tag} (the union of {len(d.shards)} shard run dirs)" if d.shards else d.path or d.run_tag
        console.print(f"  run dir {where}: {d.n_completed}/{value_text(d.n_total, now)} completed, "
                      f"{d.n_scored} scored, {d.n_infra_errors} infra errors, fires {d.fires}", highlight=False)
        for path in d.shards:
            console.print(f"    shard run dir {path}", markup=False, highlight=False)
        for label, when in (("started", d.started_at), ("last trial", d.last_progress_at),
                            ("finished", d.finished_at)):
            console.print(f"    {label}: {value_text(when, now)}", highlight=False)


def _grid_cell(cell: CellPlan | None) -> str:
    if cell is None:
        return ""
    spent = f" · {cell.gpu_hours:.2f} GPU-h" if cell.gpu_hours is not None else ""
    return f"{_phase(cell.phase)}{_score_or_progress(cell)}{spent}"


def _score_or_progress(cell: CellPlan) -> str:
    """` 0.417` once a score is uploaded, else ` 5/18 · ETA 14 min` from its run dir (never a score before)."""
    if cell.score is not None:
        return f" {cell.score:.3f}{_trust_flags(cell)}"
    return f" {progress_text(progress)}" if (progress := cell.progress) is not None else ""


def _trust_flags(cell: CellPlan) -> str:
    return f" ({cell.trust_note})" if cell.trust_note else ""


def progress_text(progress: Progress) -> str:
    total = "?" if progress.total is None else progress.total
    eta = "" if progress.eta_minutes is None else f" · ETA {progress.eta_minutes} min"
    return f"{progress.scored}/{total}{eta}"


def _phase(phase: Phase) -> str:
    return f"[{PHASE_STYLE[phase]}]{phase.value}[/]"
