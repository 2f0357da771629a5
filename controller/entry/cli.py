"""`evalctl`: a thin shell. Parse input, call the core, render. No rule lives here.

Exit codes: 0 ok, 1 runtime failure, 2 invalid input (FILE:LINE:COL: message, no traceback).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from controller.adapters.process import identity_is_dead, process_identity
from controller.adapters.store import UnsupportedStoreURL, open_store
from controller.core.ports import Store
from controller.core.reconcile import PassResult, reconcile_pass
from controller.core.types import Phase, Plan
from controller.entry import render
from controller.entry.logs import configure_logging
from controller.entry.wiring import MissingSecret, cluster_ports, targets_for, utc_now
from controller.spec.catalog import load_catalog
from controller.spec.errors import SpecErrors
from controller.spec.loader import SpecSet, load_specs

DEFAULT_STORE = "sqlite:///.evalctl/store.db"
app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Keep LLM agent evaluations on HPC clusters converged on a declared EvalRun spec.")
out = Console(highlight=False)


class Output(StrEnum):
    table = "table"
    json = "json"


Files = Annotated[list[Path], typer.Option("-f", "--file", help="Spec files or directories (multi-document YAML).")]
StoreURL = Annotated[str | None, typer.Option("--store", help="sqlite:///path.db (default $EVALCTL_STORE, else "
                                                              f"{DEFAULT_STORE}).")]
Verbose = Annotated[int, typer.Option("-v", "--verbose", count=True, help="More log output (-v info, -vv debug).")]


class UsageError(Exception):
    """Bad input that is not a spec error (e.g. an unknown store URL): exit 2."""


@contextmanager
def _exits() -> Iterator[None]:
    """Map failures to exit codes with a one-line message; a traceback only with EVALCTL_DEBUG=1."""
    try:
        yield
    except SpecErrors as exc:
        for error in exc.errors:
            _error(str(error))
        raise typer.Exit(2) from None
    except (UsageError, UnsupportedStoreURL) as exc:
        _error(f"evalctl: {exc}")
        raise typer.Exit(2) from None
    except (MissingSecret, NotImplementedError, OSError, RuntimeError) as exc:
        if os.environ.get("EVALCTL_DEBUG") == "1":
            raise
        _error(f"evalctl: {exc}")
        raise typer.Exit(1) from None


def _error(line: str) -> None:
    """Errors go out unwrapped, one per line, so editors and CI can jump to FILE:LINE:COL."""
    print(line, file=sys.stderr)


def _load(files: list[Path]) -> SpecSet:
    if not files:
        raise UsageError("name at least one spec file or directory with -f")
    return load_specs(files, load_catalog())


def _store(url: str | None, *, readonly: bool) -> Store:
    return open_store(url or os.environ.get("EVALCTL_STORE") or DEFAULT_STORE, readonly=readonly)


def _pass(specs: SpecSet, store: Store, *, act: bool) -> list[PassResult]:
    catalog = load_catalog()
    return reconcile_pass(targets_for(specs, catalog), store, cluster_ports(specs, store, catalog), utc_now(),
                          act=act, holder=process_identity(), holder_is_dead=identity_is_dead)


def _plans(specs: SpecSet, store_url: str | None) -> list[Plan]:
    store = _store(store_url, readonly=True)
    try:
        return [r.plan for r in _pass(specs, store, act=False)]
    finally:
        store.close()


@app.command()
def validate(files: Files = [], verbose: Verbose = 0) -> None:  # noqa: B006 — typer reads the default
    """Check spec files; exit 2 with FILE:LINE:COL: messages when something is wrong."""
    configure_logging(verbose)
    with _exits():
        specs = _load(files)
        cells = sum(len(t.cells) for t in targets_for(specs, load_catalog()))
        out.print(f"ok: {len(specs.evalruns)} EvalRun(s), {len(specs.clusters)} EvalCluster(s), {cells} cell(s)")


@app.command()
def plan(files: Files = [], store: StoreURL = None, output: Annotated[Output, typer.Option("-o", "--output")] =  # noqa: B006
         Output.table, verbose: Verbose = 0) -> None:
    """Show what one pass would do. No side effects."""
    configure_logging(verbose)
    with _exits():
        plans = _plans(_load(files), store)
        if output == Output.json:
            print(render.plan_json(plans))
        else:
            for p in plans:
                render.plan_table(p, out)


@app.command()
def reconcile(
    files: Files = [],  # noqa: B006
    store: StoreURL = None,
    once: Annotated[bool, typer.Option("--once", help="One pass (the default).")] = False,
    loop: Annotated[bool, typer.Option("--loop", help="Pass after pass, every --interval seconds.")] = False,
    interval: Annotated[float, typer.Option("--interval", min=0.1, help="Seconds between passes.")] = 30.0,
    until_done: Annotated[bool, typer.Option("--until-done", help="With --loop: stop once no cell is in flight.")]
    = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Plan only; the same plan reconcile would run.")] = False,
    verbose: Verbose = 0,
) -> None:
    """Observe, plan and act: one pass (--once) or a loop (--loop)."""
    configure_logging(verbose)
    with _exits():
        if once and loop:
            raise UsageError("--once and --loop exclude each other")
        specs = _load(files)
        if dry_run:
            for p in _plans(specs, store):
                render.plan_table(p, out)
            return
        the_store = _store(store, readonly=False)
        try:
            passes = 0
            while True:
                passes += 1
                results = _pass(specs, the_store, act=True)
                render.pass_summary(results, out)
                if not loop or (until_done and _settled(results)):
                    break
                time.sleep(interval)
            if loop and until_done:
                out.print(f"converged after {passes} pass(es)")
                for result in results:
                    render.status_grid(result.plan, out)
        finally:
            the_store.close()


@app.command()
def status(
    files: Files = [],  # noqa: B006
    store: StoreURL = None,
    output: Annotated[Output, typer.Option("-o", "--output")] = Output.table,
    watch: Annotated[bool, typer.Option("--watch", help="Redraw every --interval seconds.")] = False,
    interval: Annotated[float, typer.Option("--interval", min=0.5)] = 10.0,
    verbose: Verbose = 0,
) -> None:
    """Models × benchmarks grid with each cell's phase and score."""
    configure_logging(verbose)
    with _exits():
        while True:
            plans = _plans(_load(files), store)
            if output == Output.json:
                print(render.status_json(plans))
            else:
                if watch:
                    out.clear()
                for p in plans:
                    render.status_grid(p, out)
            if not watch:
                return
            time.sleep(interval)


@app.command()
def explain(
    files: Files,
    model: Annotated[str, typer.Argument(help="Model name as in the spec.")],
    benchmark: Annotated[str, typer.Argument(help="Preset or dataset as in the spec (or its dataset).")],
    store: StoreURL = None,
    verbose: Verbose = 0,
) -> None:
    """Why the planner decides what it does for one cell."""
    configure_logging(verbose)
    with _exits():
        matches = [c for p in _plans(_load(files), store) for c in p.cells if c.cell.model == model
                   and benchmark in (c.cell.benchmark, c.cell.dataset, c.cell.benchmark_name)]
        if not matches:
            raise UsageError(f"no cell {model} × {benchmark} in these specs")
        for cell in matches:
            render.explain(cell, out)


@app.command()
def crds() -> None:
    """Print the CustomResourceDefinitions generated from the spec models."""
    from controller.spec.crds import render_crds

    print(render_crds(), end="")


def _settled(results: list[PassResult]) -> bool:
    """Nothing in flight: every cell Completed or Failed (a human's turn), and nothing was just launched."""
    return all(c.phase in (Phase.COMPLETED, Phase.FAILED) for r in results for c in r.plan.cells)


def main() -> None:
    app()


if __name__ == "__main__":
    sys.exit(main())
