"""`evalctl db`, `evalctl models`, `evalctl nodes`: what the stores hold, read (and a node's quarantine lifted)
without a pass."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import typer

from controller.adapters.store import SUPABASE_SCHEMES
from controller.api.catalog import load_catalog
from controller.core.db_check import check_results
from controller.entry import nodes, render_db
from controller.entry.auditing import audit_results
from controller.entry.logs import configure_logging
from controller.entry.selection import flag_query, selector_rule, unevaluated_candidates
from controller.entry.shell import (
    Files,
    Output,
    StateURL,
    StoreURL,
    StoreURLs,
    UsageError,
    Verbose,
    connect,
    exits,
    load,
    out,
    print_document,
    refuse,
    results_url,
)
from controller.entry.wiring import utc_now

db_app = typer.Typer(no_args_is_help=True, help="Look at the results DB as the reconciler reads it.")


@db_app.command("check")
def db_check(
    store: StoreURL = None,
    output: Annotated[Output, typer.Option("-o", "--output")] = Output.table,
    verbose: Verbose = 0,
) -> None:
    """Report rows the reconciler would read as ambiguous or cannot read; exit 1 if there are any. Read-only."""
    configure_logging(verbose)
    with exits():
        opened = connect(StoreURLs(store, None), readonly=True)
        try:
            snapshot = opened.results.read_results(None, None)
        finally:
            opened.close()
        findings = check_results(snapshot)
        rows_read = len(snapshot.rows) + len(snapshot.undecodable)
        if output != Output.table:
            print_document(render_db.db_findings_json(findings, rows_read), output)
        else:
            render_db.db_findings(findings, rows_read, out)
        if findings:
            raise typer.Exit(1)


@db_app.command("audit")
def db_audit(
    files: Files = [],  # noqa: B006
    store: StoreURL = None,
    state: StateURL = None,
    output: Annotated[Output, typer.Option("-o", "--output")] = Output.table,
    apply: Annotated[bool, typer.Option("--apply", help="Mark the rows listed in evalrun_row_audit (gate version, "
                                                        "verdict, refusal, reason, time); sandbox_jobs is never "
                                                        "written.")] = False,
    verbose: Verbose = 0,
) -> None:
    """Re-apply the admission gate to the Finished rows of the specs' cells whose run dirs can still be read; list
    those it would refuse or mark provisional. Exit 0: nothing new (or --apply marked it), 1: findings not marked,
    2: bad input. Changes nothing without --apply."""
    configure_logging(verbose)
    code = 0
    with exits():
        specs = load(files)
        urls = StoreURLs(store, state, tuple(files))
        refuse((apply and results_url(urls).startswith(SUPABASE_SCHEMES),
                 "--apply cannot mark rows through Supabase's REST API: use --store postgresql://… (the project's "
                 "direct connection), whose migrations create evalrun_row_audit"))
        opened = connect(urls, readonly=True)
        try:
            found = audit_results(specs, opened, load_catalog(), utc_now())
        finally:
            opened.close()
        marked = None
        if apply:
            if found.new:
                writable = connect(urls, readonly=False)
                try:
                    writable.results.mark_rows([entry.mark() for entry in found.new])
                finally:
                    writable.close()
            marked = len(found.new)
        if output != Output.table:
            print_document(render_db.audit_json(found, marked=marked), output)
        else:
            render_db.audit_table(found, out, marked=marked)
        code = 1 if found.new and not apply else 0
    raise typer.Exit(code)


models_app = typer.Typer(no_args_is_help=True, help="The results DB's models, as a modelSelector chooses them.")


class ModelsOutput(StrEnum):
    table = "table"
    json = "json"
    list = "list"


@models_app.command("unevaluated")
def models_unevaluated(
    files: Files = [],  # noqa: B006
    benchmark: Annotated[str | None, typer.Option("--benchmark", help="A preset (tb2, v2, …) or a dataset "
                                                                      "(Org/name): its family is checked.")] = None,
    size: Annotated[float | None, typer.Option("--size", help="A size in billions: the size policy's band "
                                                              "around it (8 → 8B-class).")] = None,
    within: Annotated[str | None, typer.Option("--within", help="Registered this recently: 14d, 36h, 2w.")] = None,
    store: StoreURL = None,
    output: Annotated[ModelsOutput, typer.Option("-o", "--output", help="table, json, or list (one name a line: "
                                                                          "a priority file).")] = ModelsOutput.table,
    verbose: Verbose = 0,
) -> None:
    """The newest unevaluated models, by a spec's modelSelector (-f: what it would select now) or by
    --benchmark/--size/--within (every match). Read-only: the same query the selector runs."""
    configure_logging(verbose)
    with exits():
        refuse((bool(files) and any(v is not None for v in (benchmark, size, within)),
                 "use -f SPEC or --benchmark/--size/--within, not both"),
                (not files and benchmark is None, "name a spec with -f, or a benchmark with --benchmark"))
        catalog = load_catalog()
        if files:
            specs = load(files)
            queries = [(r, specs.cluster_of(r)) for r in specs.evalruns if r.run.spec.model_selector is not None]
            if not queries:
                raise UsageError("no EvalRun in these files has a modelSelector")
        else:
            assert benchmark is not None
            try:
                queries = [flag_query(catalog, benchmark, size, within)]
            except ValueError as error:
                raise UsageError(str(error)) from None
        opened = connect(StoreURLs(store, None, tuple(files)), readonly=True)
        try:
            found = [(run, unevaluated_candidates(
                selector_rule(selector), run, cluster, catalog, opened, set(run.run.spec.models), utc_now(),
                selector.limit if files else None))
                for run, cluster in queries if (selector := run.run.spec.model_selector) is not None]
        finally:
            opened.close()
        if output == ModelsOutput.list:
            print("\n".join(dict.fromkeys(c.name for _, chosen in found for c in chosen)))
        elif output == ModelsOutput.json:
            print(render_db.candidates_json([(str(run.ref) if files else None, chosen) for run, chosen in found]))
        else:
            for run, chosen in found:
                render_db.candidates_table(str(run.ref) if files else None, chosen, out)


nodes_app = typer.Typer(no_args_is_help=True, help="Nodes quarantined as bad (refire-elsewhere): see them, lift them.")
ClusterName = Annotated[str | None, typer.Option("--cluster", help="The EvalCluster: namespace/name, "
                                                 "ClusterEvalCluster/name, or its name alone.")]


@nodes_app.command("list")
def nodes_list(
    cluster: ClusterName = None,
    store: StoreURL = None,
    state: StateURL = None,
    output: Annotated[Output, typer.Option("-o", "--output")] = Output.table,
    verbose: Verbose = 0,
) -> None:
    """Every node quarantined now: cluster, node, since, until, the EvalRun whose pass decided it, why. Read-only."""
    configure_logging(verbose)
    with exits():
        opened = connect(StoreURLs(store, state), readonly=True)
        try:
            found = nodes.node_quarantines(opened.state.live_quarantines(), cluster)
        finally:
            opened.close()
        if output != Output.table:
            print_document(nodes.as_json(found), output)
        else:
            nodes.table(found, out, utc_now())


@nodes_app.command("release")
def nodes_release(
    node: Annotated[str, typer.Argument(help="The node, as `nodes list` shows it.")],
    cluster: ClusterName = None,
    store: StoreURL = None,
    state: StateURL = None,
    verbose: Verbose = 0,
) -> None:
    """Lift a node's quarantine now: the next pass may submit to it. Exit 1 if it is not quarantined."""
    configure_logging(verbose)
    with exits():
        opened = connect(StoreURLs(store, state), readonly=False)
        try:
            released = nodes.release(opened.state, node, cluster)
        except nodes.ClusterNeeded as exc:
            raise UsageError(str(exc)) from None
        finally:
            opened.close()
        out.print(nodes.released_line(released, utc_now()), markup=False, soft_wrap=True)
