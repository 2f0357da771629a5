"""`evalctl`: a thin shell. Parse input, call the core, render. No rule lives here.

Exit codes: 0 ok, 1 runtime failure (for `reconcile --once`: also an action of the pass that failed),
2 invalid input (FILE:LINE:COL: message, no traceback), 128 + N after signal N (130 SIGINT, 143 SIGTERM).
"""

from __future__ import annotations

import gc
import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Annotated, TextIO, cast

import typer

from controller.adapters.process import identity_is_dead, process_identity
from controller.adapters.secrets import MaskedStream
from controller.api.catalog import load_catalog
from controller.api.errors import SpecErrors
from controller.api.loader import SpecSet
from controller.core.reconcile import PassResult
from controller.core.store import Store
from controller.entry import render
from controller.entry.cli_operator import operator
from controller.entry.cli_stores import db_app, models_app, nodes_app
from controller.entry.closed_pipe import ClosedPipeTolerant
from controller.entry.docs import DEFAULT_OUT, write_or_check
from controller.entry.explaining import names_cell, specs_holding
from controller.entry.logs import configure_logging
from controller.entry.presets import presets_json, presets_table
from controller.entry.reporting import build_report, write_report
from controller.entry.secrets import EnvironmentSecrets
from controller.entry.shell import (
    FATAL,
    RECONCILE_INTERVAL_S,
    RETRY_MAX_S,
    WATCH_INTERVAL_S,
    Files,
    Output,
    StateURL,
    StoreURL,
    StoreURLs,
    UsageError,
    Verbose,
    connect,
    dry_pass,
    error_line,
    exits,
    fit_output_to_logs,
    load,
    one_line,
    one_pass,
    out,
    print_document,
    refuse,
)
from controller.entry.watch import Watch
from controller.entry.webhooks import FLUSH_S, Notifier, webhooks_of
from controller.entry.wiring import targets_for, utc_now


def _version(value: bool) -> None:
    if value:
        try:
            print(f"evalctl {version('evalrun-controller')}")
        except PackageNotFoundError:  # run from a checkout that was never installed
            print("evalctl (version unknown: the evalrun-controller package is not installed)")
        raise typer.Exit()


app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  context_settings={"help_option_names": ["-h", "--help"]})


@app.callback()
def main_options(
    show_version: Annotated[bool, typer.Option("--version", is_eager=True, callback=_version,
                                               help="Print the version and exit.")] = False,
) -> None:
    """Keep LLM agent evaluations on HPC clusters converged on a declared EvalRun spec."""


@app.command()
def validate(files: Files = [], output: Annotated[Output, typer.Option("-o", "--output")] = Output.table,  # noqa: B006
             verbose: Verbose = 0) -> None:
    """Check spec files; exit 2 with FILE:LINE:COL: messages when something is wrong (-o json: the same, as
    {"ok", "errors": [{file, line, col, message}]} on stdout)."""
    configure_logging(verbose)
    with exits():
        try:
            specs = load(files, preflight=True)
        except SpecErrors as exc:
            if output != Output.table:
                print_document(json.dumps({"ok": False, "errors": [asdict(error) for error in exc.errors]}, indent=2),
                               output)
                raise typer.Exit(2) from None
            raise
        cells = sum(len(t.cells) for t in targets_for(specs, load_catalog()))
        if output != Output.table:
            print_document(json.dumps({"ok": True, "errors": [], "evalruns": len(specs.evalruns),
                                       "clusters": len(specs.clusters), "cells": cells}, indent=2), output)
        else:
            out.print(f"ok: {len(specs.evalruns)} EvalRun(s), {len(specs.clusters)} EvalCluster(s), {cells} cell(s)")


@app.command()
def plan(files: Files = [], store: StoreURL = None, state: StateURL = None,  # noqa: B006
         output: Annotated[Output, typer.Option("-o", "--output")] = Output.table, verbose: Verbose = 0) -> None:
    """Show what one pass would do. No side effects."""
    configure_logging(verbose)
    with exits():
        results = dry_pass(load(files, preflight=True), StoreURLs(store, state))
        if output != Output.table:
            print_document(render.plan_json(results), output)
        else:
            for result in results:
                render.plan_table(result, out)


@app.command()
def reconcile(
    files: Files = [],  # noqa: B006
    store: StoreURL = None,
    state: StateURL = None,
    once: Annotated[bool, typer.Option("--once", help="One pass (the default).")] = False,
    loop: Annotated[bool, typer.Option("--loop", help="Pass after pass, every --interval seconds.")] = False,
    interval: Annotated[float | None, typer.Option(
        "--interval", min=0.1, help=f"With --loop: seconds between passes (default {RECONCILE_INTERVAL_S:g}).")] = None,
    until_done: Annotated[bool, typer.Option("--until-done", help="With --loop: stop once no cell is in flight.")]
    = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Plan only; the same plan reconcile would run.")] = False,
    verbose: Verbose = 0,
) -> None:
    """Observe, plan and act: one pass (--once; exit 1 if an action failed) or a loop (--loop)."""
    configure_logging(verbose)
    code = 0
    with exits():
        refuse((once and loop, "--once and --loop exclude each other"),
                (until_done and not loop, "--until-done needs --loop"),
                (interval is not None and not loop, "--interval needs --loop"),
                (dry_run and (loop or until_done), "--dry-run plans one pass; it does not go with --loop or --until-done"))
        specs = load(files, preflight=True)
        urls = StoreURLs(store, state)
        if dry_run:
            for result in dry_pass(specs, urls):
                render.plan_table(result, out)
        elif loop:
            _loop(specs, urls, interval or RECONCILE_INTERVAL_S, until_done=until_done, every_cell=verbose > 0)
        else:
            code = _once(specs, urls)
    raise typer.Exit(code)


def _once(specs: SpecSet, urls: StoreURLs) -> int:
    """One acting pass; 1 if any action failed, so cron and CI see it (the summary says which). Its messages are
    sent before it exits (for at most FLUSH_S; the rest wait for the next run)."""
    store = connect(urls, readonly=False)
    notifier = _notifier(urls)
    try:
        results = one_pass(specs, store, act=True)
        _notify(notifier, specs, flush=True)
    finally:
        store.close()
        notifier.close()
    render.pass_summary(results, out)
    return 1 if any(r.blocked or any(not o.ok for o in r.outcomes) for r in results) else 0


def _loop(specs: SpecSet, urls: StoreURLs, interval: float, *, until_done: bool, every_cell: bool) -> None:
    """Pass after pass until interrupted (or, with `until_done`, settled). A failed action waits for the next
    pass; a pass that fails as a whole (store locked or unreachable, an I/O error) is retried with back-off and
    a freshly opened store, so a long-running reconciler outlives an outage. Each pass prints its line and what
    changed (`every_cell`, from -v: every decision, as --once does)."""
    store: Store | None = None
    notifier = _notifier(urls)
    passes = failures = 0
    decided: render.Decisions = {}
    try:
        while True:
            passes += 1
            try:
                store = store or connect(urls, readonly=False)
                results = one_pass(specs, store, act=True)
                _notify(notifier, specs, flush=until_done and _settled(results))
            except FATAL:
                raise
            except (OSError, RuntimeError) as exc:
                failures += 1
                delay = min(interval * 2 ** failures, max(RETRY_MAX_S, interval))
                error_line(f"evalctl: pass {passes} failed: {one_line(exc)}; retrying in {delay:g}s")
                _close(store)
                store = None
                time.sleep(delay)
                continue
            failures = 0
            decided = render.loop_summary(results, out, decided, every_cell=every_cell)
            if until_done and _settled(results):
                out.print(f"converged after {passes} pass(es)")
                for result in results:
                    render.status_grid(result, out)
                return
            time.sleep(interval)
    finally:
        _close(store)
        notifier.close()


def _close(store: Store | None) -> None:
    if store is not None:
        store.close()


def _notifier(urls: StoreURLs) -> Notifier:
    """The webhook sender, on a store of its own (its thread's); it starts only for EvalRuns with webhooks."""
    return Notifier(lambda: connect(urls, readonly=False), process_identity(), holder_is_dead=identity_is_dead)


def _notify(notifier: Notifier, specs: SpecSet, *, flush: bool) -> None:
    """Wake the sender with the webhooks as they are now; with `flush`, give the last messages FLUSH_S to go."""
    notifier.offer(webhooks_of(specs, EnvironmentSecrets()))
    if flush and not notifier.flush(FLUSH_S):
        error_line(f"evalctl: webhook messages still unsent after {FLUSH_S:g}s; the next run sends them")


@app.command()
def status(
    files: Files = [],  # noqa: B006
    store: StoreURL = None,
    state: StateURL = None,
    output: Annotated[Output, typer.Option("-o", "--output")] = Output.table,
    watch: Annotated[bool, typer.Option("--watch", help="A live table with progress bars, redrawn every --interval "
                                                        "seconds (on a pipe: each changed table once).")] = False,
    interval: Annotated[float | None, typer.Option(
        "--interval", min=0.5, help=f"With --watch: seconds between redraws (default {WATCH_INTERVAL_S:g}).")] = None,
    verbose: Verbose = 0,
) -> None:
    """Models × benchmarks grid: each cell's phase and uploaded score, or `Running 5/18 · ETA 14 min` until one is
    uploaded. --watch: a live table with progress bars (on a pipe: each changed frame once)."""
    configure_logging(verbose)
    with exits():
        refuse((interval is not None and not watch, "--interval needs --watch"))
        urls = StoreURLs(store, state)

        def read() -> list[PassResult]:
            return dry_pass(load(files), urls)

        every = interval or WATCH_INTERVAL_S
        if output != Output.table:
            _repeat(lambda: print_document(render.status_json(read()), output), every if watch else None)
        elif not watch:
            for result in read():
                render.status_grid(result, out)
        else:
            with Watch(out) as live:
                _repeat(lambda: live.show([result.plan for result in read()], utc_now()), every)


def _repeat(show: Callable[[], None], interval: float | None) -> None:
    """Once (interval None), or every `interval` seconds until interrupted."""
    while True:
        show()
        if interval is None:
            return
        time.sleep(interval)


@app.command()
def explain(
    files: Files,
    model: Annotated[str, typer.Argument(help="Model name as in the spec.")],
    benchmark: Annotated[str, typer.Argument(help="Preset or dataset as in the spec (or its dataset).")],
    store: StoreURL = None,
    state: StateURL = None,
    verbose: Verbose = 0,
) -> None:
    """Why the planner decides what it does for one cell."""
    configure_logging(verbose)
    with exits():
        specs = specs_holding(load(files), load_catalog(), model, benchmark)
        matches = [(c, r.plan) for r in dry_pass(specs, StoreURLs(store, state)) for c in r.plan.cells
                   if names_cell(c.cell, model, benchmark)]
        if not matches:
            raise UsageError(f"no cell {model} × {benchmark} in these specs")
        for cell, its_plan in matches:
            render.explain(cell, out, utc_now(), its_plan.effects)


@app.command()
def report(
    files: Files = [],  # noqa: B006
    output: Annotated[Path, typer.Option("-o", "--output", help="Where to write the HTML file.")] = Path("report.html"),
    store: StoreURL = None,
    state: StateURL = None,
    verbose: Verbose = 0,
) -> None:
    """Write one self-contained HTML report (scoreboard, families, every cell's detail). Read-only: a plan pass."""
    configure_logging(verbose)
    with exits():
        specs = load(files)
        opened = connect(StoreURLs(store, state), readonly=True)
        try:
            built = build_report(specs, opened, load_catalog(), utc_now())
        finally:
            opened.close()
        write_report(built, output)
        cells = sum(len(r.cells) for r in built.runs)
        provisional = sum(1 for r in built.runs for c in r.cells if c.provisional and c.score is not None)
        out.print(f"wrote {output}: {len(built.runs)} EvalRun(s), {cells} cell(s), {provisional} provisional")


@app.command()
def presets(output: Annotated[Output, typer.Option("-o", "--output")] = Output.table) -> None:
    """The benchmark presets a spec may name: dataset, tasks, jobs' walltime; and the aliases for several."""
    with exits():
        shipped = load_catalog().presets
        if output != Output.table:
            print_document(presets_json(shipped), output)
        else:
            presets_table(shipped, out)


@app.command()
def crds() -> None:
    """Print the CustomResourceDefinitions generated from the spec models."""
    from controller.api.crds import render_crds

    print(render_crds(), end="")


@app.command()
def docs(out_path: Annotated[Path, typer.Option("--out", help="Where to write it ('-': stdout).")] = DEFAULT_OUT,
         check: Annotated[bool, typer.Option("--check", help="Write nothing; exit 1 if the file is stale.")] = False) -> None:
    """Write the field reference (Markdown) generated from the spec models' schema."""
    with exits():
        raise typer.Exit(write_or_check(out_path, check=check))


app.command()(operator)  # after the pass commands: `evalctl --help` lists them in the order a user needs them
app.add_typer(db_app, name="db")
app.add_typer(models_app, name="models")
app.add_typer(nodes_app, name="nodes")


def _settled(results: list[PassResult]) -> bool:
    """Nothing in flight: every cell Completed or Failed (a human's turn)."""
    return all(r.status.settled for r in results)


def main() -> None:
    # Everything imported so far lives as long as the process: out of the collector's sight, a pass's full
    # collections no longer walk it again and again (the GC's cost grows with all live objects, not the new ones).
    gc.freeze()
    # the last line of defence: whatever a command prints or logs, this process's secrets and token shapes masked
    sys.stdout = cast(TextIO, MaskedStream(cast(TextIO, ClosedPipeTolerant(sys.stdout))))
    sys.stderr = cast(TextIO, MaskedStream(sys.stderr))
    fit_output_to_logs()
    app()


if __name__ == "__main__":
    main()
