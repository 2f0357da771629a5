"""`evalctl`: a thin shell. Parse input, call the core, render. No rule lives here.

Exit codes: see exit_codes.py (and `evalctl --help`).
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

from controller.adapters.secrets import MaskedStream
from controller.api.catalog import load_catalog
from controller.api.errors import SpecErrors
from controller.core.reconcile import PassResult
from controller.entry import remote_validate, render, retrying
from controller.entry.cli_operator import operator
from controller.entry.cli_stores import db_app, models_app, nodes_app
from controller.entry.closed_pipe import ClosedPipeTolerant
from controller.entry.docs import REFERENCE_OUT, write_or_check
from controller.entry.exit_codes import EPILOG, tell_unobserved
from controller.entry.explaining import names_cell, specs_holding
from controller.entry.getting import Kind, get_document, get_table, read_cells
from controller.entry.logs import configure_logging
from controller.entry.new_store import warn_of_a_new_store
from controller.entry.presets import presets_json, presets_table
from controller.entry.reconciling import reconcile_loop, reconcile_once
from controller.entry.reporting import DEFAULT_OUT, ReportFormat, build_report, report_format, report_text, write_report
from controller.entry.shell import (
    RECONCILE_INTERVAL_S,
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
    exits,
    fit_output_to_logs,
    load,
    out,
    print_document,
    refuse,
)
from controller.entry.until_done import Deadline
from controller.entry.watch import Watch
from controller.entry.wiring import targets_for, utc_now


def _version(value: bool) -> None:
    if value:
        try:
            print(f"evalctl {version('evalrun-controller')}")
        except PackageNotFoundError:  # run from a checkout that was never installed
            print("evalctl (version unknown: the evalrun-controller package is not installed)")
        raise typer.Exit()


app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, epilog=EPILOG,
                  context_settings={"help_option_names": ["-h", "--help"]})


@app.callback()
def main_options(
    show_version: Annotated[bool, typer.Option("--version", is_eager=True, callback=_version,
                                               help="Print the version and exit.")] = False,
) -> None:
    """Keep LLM agent evaluations on HPC clusters converged on a declared EvalRun spec."""


@app.command()
def validate(files: Files = [], output: Annotated[Output, typer.Option("-o", "--output")] = Output.table,  # noqa: B006
             remote: Annotated[bool, typer.Option("--remote", help="Also check each cluster where its jobs run (one "
                                                  "command; over ssh, one session): jobs dir, partition, account, "
                                                  "job script, scheduler.python. Exit 3: a cluster could not be "
                                                  "checked.")] = False,
             verbose: Verbose = 0) -> None:
    """Check spec files; exit 2 with FILE:LINE:COL: messages when something is wrong (-o json: the same, as
    {"ok", "errors": [{file, line, col, message}]} on stdout; --remote adds "remote": each cluster's checks)."""
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
        checked = remote_validate.check_clusters(specs) if remote else []
        code = remote_validate.exit_code(checked)
        if output != Output.table:
            print_document(json.dumps({"ok": code == 0, "errors": [], "evalruns": len(specs.evalruns),
                                       "clusters": len(specs.clusters), "cells": cells,
                                       **(remote_validate.remote_json(checked) if remote else {})}, indent=2), output)
        else:
            remote_validate.show(checked)
            if code == 0:
                out.print(f"ok: {len(specs.evalruns)} EvalRun(s), {len(specs.clusters)} EvalCluster(s), "
                          f"{cells} cell(s)")
    raise typer.Exit(code)


@app.command(epilog=EPILOG)
def plan(files: Files = [], store: StoreURL = None, state: StateURL = None,  # noqa: B006
         output: Annotated[Output, typer.Option("-o", "--output")] = Output.table, verbose: Verbose = 0) -> None:
    """Show what one pass would do. No side effects."""
    configure_logging(verbose)
    code = 0
    with exits():
        results = dry_pass(load(files, preflight=True), StoreURLs(store, state, tuple(files)))
        if output != Output.table:
            print_document(render.plan_json(results), output)
        else:
            for result in results:
                render.plan_table(result, out)
        code = tell_unobserved(results)
    raise typer.Exit(code)


@app.command(epilog=EPILOG)
def reconcile(
    files: Files = [],  # noqa: B006
    store: StoreURL = None,
    state: StateURL = None,
    once: Annotated[bool, typer.Option("--once", help="One pass (the default).")] = False,
    loop: Annotated[bool, typer.Option("--loop", help="Pass after pass, every --interval seconds.")] = False,
    interval: Annotated[float | None, typer.Option(
        "--interval", min=0.1, help=f"With --loop: seconds between passes (default {RECONCILE_INTERVAL_S:g}).")] = None,
    until_done: Annotated[bool, typer.Option("--until-done", help="With --loop: stop once every cell is Completed, "
                                                                  "Failed or held (exit 0, or 4 when some are held).")]
    = False,
    timeout: Annotated[str | None, typer.Option("--timeout", help="With --until-done: give up after this long "
                                                                  "(90s, 30m, 2h, 1h30m; exit 5).")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Plan only; the same plan reconcile would run.")] = False,
    verbose: Verbose = 0,
) -> None:
    """Observe, plan and act: one pass (--once) or a loop (--loop)."""
    configure_logging(verbose)
    code = 0
    with exits():
        refuse((once and loop, "--once and --loop exclude each other"),
                (until_done and not loop, "--until-done needs --loop"),
                (timeout is not None and not until_done, "--timeout needs --until-done"),
                (interval is not None and not loop, "--interval needs --loop"),
                (dry_run and (loop or until_done), "--dry-run plans one pass; it does not go with --loop or --until-done"))
        try:
            deadline = Deadline(timeout) if timeout is not None else None
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        specs = load(files, preflight=True)
        urls = StoreURLs(store, state, tuple(files))
        if dry_run:
            results = dry_pass(specs, urls)
            for result in results:
                render.plan_table(result, out)
            code = tell_unobserved(results)
        else:
            warn_of_a_new_store(specs, urls)
            code = (reconcile_loop(specs, urls, interval or RECONCILE_INTERVAL_S, until_done=until_done,
                                   every_cell=verbose > 0, deadline=deadline) if loop else reconcile_once(specs, urls))
    raise typer.Exit(code)


@app.command(epilog=EPILOG)
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
    code = 0
    with exits():
        refuse((interval is not None and not watch, "--interval needs --watch"))
        urls = StoreURLs(store, state, tuple(files))

        def read() -> list[PassResult]:
            return dry_pass(load(files), urls)

        every = interval or WATCH_INTERVAL_S
        args, store_args = retrying.spec_args(files, urls), retrying.store_args(files, urls)
        if not watch:
            results = read()
            if output != Output.table:
                print_document(render.status_json(results, args, store_args), output)
            else:
                for result in results:
                    render.status_grid(result, out, args, store_args)
            code = tell_unobserved(results)
        elif output != Output.table:
            _repeat(lambda: print_document(render.status_json(read(), args, store_args), output), every)
        else:
            with Watch(out) as live:
                _repeat(lambda: live.show([result.plan for result in read()], utc_now()), every)
    raise typer.Exit(code)


def _repeat(show: Callable[[], None], interval: float) -> None:
    """Every `interval` seconds until interrupted."""
    while True:
        show()
        time.sleep(interval)


@app.command(epilog=EPILOG)
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
    code = 0
    with exits():
        urls = StoreURLs(store, state, tuple(files))
        specs = specs_holding(load(files), load_catalog(), model, benchmark)
        results = dry_pass(specs, urls)
        matches = [(c, r.plan) for r in results for c in r.plan.cells if names_cell(c.cell, model, benchmark)]
        if not matches:
            raise UsageError(f"no cell {model} × {benchmark} in these specs")
        for cell, its_plan in matches:
            render.explain(cell, out, utc_now(), its_plan.effects, retrying.spec_args(files, urls),
                           where=its_plan.clusters.get(cell.cell.key, "not placed yet") if its_plan.clusters else "",
                           estimate=its_plan.estimate(cell), store_args=retrying.store_args(files, urls))
        code = tell_unobserved(results)
    raise typer.Exit(code)


@app.command(epilog=EPILOG)
def retry(
    files: Files = [],  # noqa: B006
    model: Annotated[str | None, typer.Argument(help="Model name as in the spec.")] = None,
    benchmark: Annotated[str | None, typer.Argument(help="Preset or dataset as in the spec (or its dataset).")] = None,
    held: Annotated[bool, typer.Option("--held", help="Every held cell of the specs.")] = False,
    all_failed: Annotated[bool, typer.Option("--all-failed", help="Every Failed cell of the specs.")] = False,
    reason: Annotated[str, typer.Option("--reason", help="Why: recorded with who asked and when.")] = "",
    store: StoreURL = None,
    state: StateURL = None,
    verbose: Verbose = 0,
) -> None:
    """Release held cells once (RULES §13): record a retry request; the next pass starts one new attempt."""
    configure_logging(verbose)
    with exits():
        retrying.retry(files, model, benchmark, held=held, all_failed=all_failed, reason=reason,
                       urls=StoreURLs(store, state, tuple(files)), console=out)


@app.command(epilog=EPILOG)
def report(
    files: Files = [],  # noqa: B006
    output: Annotated[str, typer.Option("-o", "--output", help="html (the page), json or yaml (its data).")] = "html",
    to: Annotated[Path | None, typer.Option("--out", help="Where to write it (default: report.html for html; json "
                                                          "and yaml go to stdout).")] = None,
    store: StoreURL = None,
    state: StateURL = None,
    verbose: Verbose = 0,
) -> None:
    """Write one self-contained HTML report (scoreboard, families, every cell's detail) to --out; -o json or yaml:
    its data. Read-only: a plan pass."""
    configure_logging(verbose)
    code = 0
    with exits():
        form = report_format(output)
        specs = load(files)
        opened = connect(StoreURLs(store, state, tuple(files)), readonly=True)
        try:
            built, results = build_report(specs, opened, load_catalog(), utc_now())
        finally:
            opened.close()
        text = report_text(built, form)
        if to is None and form != ReportFormat.html:
            sys.stdout.write(text)
        else:
            write_report(text, to or DEFAULT_OUT)
            cells = sum(len(r.cells) for r in built.runs)
            provisional = sum(1 for r in built.runs for c in r.cells if c.provisional and c.score is not None)
            out.print(f"wrote {to or DEFAULT_OUT}: {len(built.runs)} EvalRun(s), {cells} cell(s), "
                      f"{provisional} provisional")
        code = tell_unobserved(results)
    raise typer.Exit(code)


@app.command()
def get(
    kind: Annotated[Kind, typer.Argument(help="evalruns or cells.")],
    store: StoreURL = None,
    state: StateURL = None,
    output: Annotated[Output, typer.Option("-o", "--output")] = Output.table,
    verbose: Verbose = 0,
) -> None:
    """What the store knows of every EvalRun or cell, no spec needed: status, score, n, provisional, cluster, age.
    Without --store or $EVALCTL_STORE: the .evalctl/store.db of the working directory."""
    configure_logging(verbose)
    with exits():
        urls = StoreURLs(store, state, (Path.cwd(),))  # no spec: the store of the directory it stands in
        opened = connect(urls, readonly=True, missing_note=False)  # read_cells says it, with the levers
        try:
            cells = read_cells(opened, urls)
        finally:
            opened.close()
        if output != Output.table:
            print_document(get_document(kind, cells), output)
        else:
            get_table(kind, cells, out, utc_now())


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
def docs(out_path: Annotated[Path, typer.Option("--out", help="Where to write it ('-': stdout).")] = REFERENCE_OUT,
         check: Annotated[bool, typer.Option("--check", help="Write nothing; exit 1 if the file is stale.")] = False) -> None:
    """Write the field reference (Markdown) generated from the spec models' schema."""
    with exits():
        raise typer.Exit(write_or_check(out_path, check=check))


app.command()(operator)  # after the pass commands: `evalctl --help` lists them in the order a user needs them
app.add_typer(db_app, name="db")
app.add_typer(models_app, name="models")
app.add_typer(nodes_app, name="nodes")


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
