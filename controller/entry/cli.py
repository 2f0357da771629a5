"""`evalctl`: a thin shell. Parse input, call the core, render. No rule lives here.

Exit codes: 0 ok, 1 runtime failure (for `reconcile --once`: also an action of the pass that failed),
2 invalid input (FILE:LINE:COL: message, no traceback), 128 + N after signal N (130 SIGINT, 143 SIGTERM).
"""

from __future__ import annotations

import gc
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import StrEnum
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from types import FrameType
from typing import Annotated, NamedTuple, NoReturn, TextIO, cast

import typer
from rich.console import Console

from controller.adapters.process import identity_is_dead, process_identity
from controller.adapters.secrets import MaskedStream
from controller.adapters.store import SUPABASE_SCHEMES, UnsupportedStoreURL, open_store
from controller.api.catalog import load_catalog
from controller.api.errors import SpecErrors
from controller.api.loader import SpecSet, load_specs
from controller.core.db_check import check_results
from controller.core.reconcile import PassResult
from controller.core.store import Store
from controller.entry import nodes, render
from controller.entry.auditing import audit_results
from controller.entry.logs import configure_logging
from controller.entry.passes import run_pass
from controller.entry.reporting import build_report, write_report
from controller.entry.secrets import EnvironmentSecrets
from controller.entry.selection import flag_query, selector_rule, unevaluated_candidates
from controller.entry.watch import Watch
from controller.entry.webhooks import FLUSH_S, Notifier, webhooks_of
from controller.entry.wiring import targets_for, utc_now

DEFAULT_STORE = "sqlite:///.evalctl/store.db"
BUSY_TIMEOUT_ENV = "EVALCTL_STORE_BUSY_TIMEOUT_S"  # how long a store write waits for another process's lock
RECONCILE_INTERVAL_S = 30.0
WATCH_INTERVAL_S = 10.0
RETRY_MAX_S = 300.0  # a failed --loop pass is retried after 2, 4, 8 … intervals, at most this long
SIGNALS = (signal.SIGINT, signal.SIGTERM)
app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False)
out = Console(highlight=False)


class Output(StrEnum):
    table = "table"
    json = "json"


Files = Annotated[list[Path], typer.Option("-f", "--file", help="Spec files or directories (multi-document YAML).")]
StoreURL = Annotated[str | None, typer.Option("--store", help="The results DB: sqlite:///path.db, postgresql://… or "
                                              f"supabase://… (default $EVALCTL_STORE, else {DEFAULT_STORE}).")]
StateURL = Annotated[str | None, typer.Option("--state", help="The controller's own state, when it is not kept in the "
                                              "--store DB: sqlite:///… or postgresql://… (default $EVALCTL_STATE; "
                                              "with supabase:// it defaults to sqlite:///.evalctl/state.db).")]
Verbose = Annotated[int, typer.Option("-v", "--verbose", count=True, help="More log output (-v info, -vv debug).")]


class UsageError(Exception):
    """Bad input that is not a spec error (e.g. an unknown store URL, flags that do not go together): exit 2."""


class Interrupted(BaseException):
    """SIGINT or SIGTERM. A BaseException, so no `except Exception` on the way (the actor's per-action guard)
    mistakes it for a failed action: it unwinds to `_exits`, and every store is closed on the way."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


# Errors that waiting does not cure: `reconcile --loop` stops on them instead of retrying. (A missing secret
# fails the submissions that need it, action by action: another EvalRun can still progress.)
FATAL = (NotImplementedError,)


@contextmanager
def _exits() -> Iterator[None]:
    """Map failures to exit codes with a one-line message; a traceback only with EVALCTL_DEBUG=1."""
    try:
        with _signals():
            yield
    except Interrupted as exc:
        name = signal.Signals(exc.signum).name
        _error(f"evalctl: interrupted ({name}); the next pass picks up where this one stopped")
        raise typer.Exit(128 + exc.signum) from None
    except SpecErrors as exc:
        for error in exc.errors:
            _error(str(error))
        raise typer.Exit(2) from None
    except (UsageError, UnsupportedStoreURL) as exc:
        _error(f"evalctl: {exc}")
        raise typer.Exit(2) from None
    except typer.Exit:  # a command's own exit code (click's Exit is a RuntimeError): not a failure to report
        raise
    except Exception as exc:
        if os.environ.get("EVALCTL_DEBUG") == "1":
            raise
        expected = isinstance(exc, OSError | RuntimeError)  # MissingSecret, StoreUnavailable, … say it all
        _error(f"evalctl: {_one_line(exc)}" if expected else
               f"evalctl: internal error ({type(exc).__name__}: {_one_line(exc)}); EVALCTL_DEBUG=1 shows the traceback")
        raise typer.Exit(1) from None


@contextmanager
def _signals() -> Iterator[None]:
    """SIGINT/SIGTERM raise `Interrupted` where the program is; unwinding closes the store, and closing a SQLite
    connection rolls back a transaction it had open. A second signal while unwinding exits at once."""
    def interrupt(signum: int, frame: FrameType | None) -> NoReturn:
        for each in SIGNALS:
            signal.signal(each, _exit_now)
        raise Interrupted(signum)

    previous = {each: signal.signal(each, interrupt) for each in SIGNALS}
    try:
        yield
    finally:
        for each, handler in previous.items():
            signal.signal(each, handler)


def _exit_now(signum: int, frame: FrameType | None) -> NoReturn:
    os._exit(128 + signum)


def _error(line: str) -> None:
    """Errors go out unwrapped, one per line, so editors and CI can jump to FILE:LINE:COL."""
    print(line, file=sys.stderr)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _refuse(*combinations: tuple[bool, str]) -> None:
    """Flags that do not apply are refused, not silently ignored: the user meant something else."""
    for given, message in combinations:
        if given:
            raise UsageError(message)


def _load(files: list[Path]) -> SpecSet:
    if not files:
        raise UsageError("name at least one spec file or directory with -f")
    return load_specs(files, load_catalog())


class StoreURLs(NamedTuple):
    results: str | None
    state: str | None


def _results_url(urls: StoreURLs) -> str:
    return urls.results or os.environ.get("EVALCTL_STORE") or DEFAULT_STORE


def _store(urls: StoreURLs, *, readonly: bool) -> Store:
    url = _results_url(urls)
    state = urls.state or os.environ.get("EVALCTL_STATE") or None
    busy = os.environ.get(BUSY_TIMEOUT_ENV)
    if busy is None:
        return open_store(url, state_url=state, readonly=readonly)
    return open_store(url, state_url=state, readonly=readonly, busy_timeout_s=_seconds(busy))


def _seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds <= 3600:
        raise UsageError(f"{BUSY_TIMEOUT_ENV} must be a number of seconds between 0 and 3600")
    return seconds


def _pass(specs: SpecSet, store: Store, *, act: bool) -> list[PassResult]:
    return run_pass(specs, store, utc_now(), act=act, holder=process_identity(), holder_is_dead=identity_is_dead)


def _dry_pass(specs: SpecSet, urls: StoreURLs) -> list[PassResult]:
    """A pass that plans and acts on nothing (plan, status, explain, --dry-run)."""
    store = _store(urls, readonly=True)
    try:
        return _pass(specs, store, act=False)
    finally:
        store.close()


def _version(value: bool) -> None:
    if value:
        try:
            print(f"evalctl {version('evalrun-controller')}")
        except PackageNotFoundError:  # run from a checkout that was never installed
            print("evalctl (version unknown: the evalrun-controller package is not installed)")
        raise typer.Exit()


@app.callback()
def main_options(
    show_version: Annotated[bool, typer.Option("--version", is_eager=True, callback=_version,
                                               help="Print the version and exit.")] = False,
) -> None:
    """Keep LLM agent evaluations on HPC clusters converged on a declared EvalRun spec."""


@app.command()
def validate(files: Files = [], verbose: Verbose = 0) -> None:  # noqa: B006 — typer reads the default
    """Check spec files; exit 2 with FILE:LINE:COL: messages when something is wrong."""
    configure_logging(verbose)
    with _exits():
        specs = _load(files)
        cells = sum(len(t.cells) for t in targets_for(specs, load_catalog()))
        out.print(f"ok: {len(specs.evalruns)} EvalRun(s), {len(specs.clusters)} EvalCluster(s), {cells} cell(s)")


@app.command()
def plan(files: Files = [], store: StoreURL = None, state: StateURL = None,  # noqa: B006
         output: Annotated[Output, typer.Option("-o", "--output")] = Output.table, verbose: Verbose = 0) -> None:
    """Show what one pass would do. No side effects."""
    configure_logging(verbose)
    with _exits():
        results = _dry_pass(_load(files), StoreURLs(store, state))
        if output == Output.json:
            print(render.plan_json(results))
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
    with _exits():
        _refuse((once and loop, "--once and --loop exclude each other"),
                (until_done and not loop, "--until-done needs --loop"),
                (interval is not None and not loop, "--interval needs --loop"),
                (dry_run and (loop or until_done), "--dry-run plans one pass; it does not go with --loop or --until-done"))
        specs = _load(files)
        urls = StoreURLs(store, state)
        if dry_run:
            for result in _dry_pass(specs, urls):
                render.plan_table(result, out)
        elif loop:
            _loop(specs, urls, interval or RECONCILE_INTERVAL_S, until_done=until_done)
        else:
            code = _once(specs, urls)
    raise typer.Exit(code)


def _once(specs: SpecSet, urls: StoreURLs) -> int:
    """One acting pass; 1 if any action failed, so cron and CI see it (the summary says which). Its messages are
    sent before it exits (for at most FLUSH_S; the rest wait for the next run)."""
    store = _store(urls, readonly=False)
    notifier = _notifier(urls)
    try:
        results = _pass(specs, store, act=True)
        _notify(notifier, specs, flush=True)
    finally:
        store.close()
        notifier.close()
    render.pass_summary(results, out)
    return 1 if any(r.blocked or any(not o.ok for o in r.outcomes) for r in results) else 0


def _loop(specs: SpecSet, urls: StoreURLs, interval: float, *, until_done: bool) -> None:
    """Pass after pass until interrupted (or, with `until_done`, settled). A failed action waits for the next
    pass; a pass that fails as a whole (store locked or unreachable, an I/O error) is retried with back-off and
    a freshly opened store, so a long-running reconciler outlives an outage."""
    store: Store | None = None
    notifier = _notifier(urls)
    passes = failures = 0
    try:
        while True:
            passes += 1
            try:
                store = store or _store(urls, readonly=False)
                results = _pass(specs, store, act=True)
                _notify(notifier, specs, flush=until_done and _settled(results))
            except FATAL:
                raise
            except (OSError, RuntimeError) as exc:
                failures += 1
                delay = min(interval * 2 ** failures, max(RETRY_MAX_S, interval))
                _error(f"evalctl: pass {passes} failed: {_one_line(exc)}; retrying in {delay:g}s")
                _close(store)
                store = None
                time.sleep(delay)
                continue
            failures = 0
            render.pass_summary(results, out)
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
    return Notifier(lambda: _store(urls, readonly=False), process_identity(), holder_is_dead=identity_is_dead)


def _notify(notifier: Notifier, specs: SpecSet, *, flush: bool) -> None:
    """Wake the sender with the webhooks as they are now; with `flush`, give the last messages FLUSH_S to go."""
    notifier.offer(webhooks_of(specs, EnvironmentSecrets()))
    if flush and not notifier.flush(FLUSH_S):
        _error(f"evalctl: webhook messages still unsent after {FLUSH_S:g}s; the next run sends them")


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
    with _exits():
        _refuse((interval is not None and not watch, "--interval needs --watch"))
        urls = StoreURLs(store, state)

        def read() -> list[PassResult]:
            return _dry_pass(_load(files), urls)

        every = interval or WATCH_INTERVAL_S
        if output == Output.json:
            _repeat(lambda: print(render.status_json(read()), flush=True), every if watch else None)
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
    with _exits():
        matches = [(c, r.plan) for r in _dry_pass(_load(files), StoreURLs(store, state)) for c in r.plan.cells
                   if c.cell.model == model and benchmark in (c.cell.benchmark, c.cell.dataset, c.cell.benchmark_name)]
        if not matches:
            raise UsageError(f"no cell {model} × {benchmark} in these specs")
        for cell, its_plan in matches:
            render.explain(cell, out, utc_now(), its_plan.effects)


@app.command()
def operator(
    store: StoreURL = None,
    state: StateURL = None,
    namespace: Annotated[list[str], typer.Option("-n", "--namespace", help="Watch only these namespaces "
                                                                           "(repeat; default: all).")] = [],  # noqa: B006
    base_dir: Annotated[Path, typer.Option("--base-dir", help="Where relative paths of EvalClusters resolve "
                                                              "(jobsDir, jobScript, ...).")] = Path(),
    interval: Annotated[float, typer.Option("--interval", min=1.0, help="Seconds between passes of an EvalRun "
                                                                       "when nothing changes.")] = RECONCILE_INTERVAL_S,
    standalone: Annotated[bool, typer.Option("--standalone", help="No kopf peering (one replica, e.g. a laptop).")]
    = False,
    peering: Annotated[str, typer.Option("--peering", help="ClusterKopfPeering (all namespaces) or KopfPeering "
                                                           "(with -n) name.")] = "evalrun-operator",
    priority: Annotated[int | None, typer.Option("--priority", help="Among peered replicas, the highest acts; the "
                                                                    "others stand by (default: a random one, so "
                                                                    "replicas started together never tie).")] = None,
    liveness: Annotated[str | None, typer.Option("--liveness", help="Serve a liveness probe, e.g. "
                                                                    "http://0.0.0.0:8080/healthz.")] = None,
    metrics_port: Annotated[int | None, typer.Option("--metrics-port", help="Serve Prometheus metrics on this "
                                                                            "port.")] = None,
    allow_local_scheduler: Annotated[bool, typer.Option(
        "--allow-local-scheduler", help="Let namespaced EvalClusters run jobs or scheduler commands on this host, as "
                                        "the operator (a single-user laptop; never in a shared cluster).")] = False,
    allowed_ssh_host: Annotated[list[str], typer.Option(
        "--allowed-ssh-host", help="A login host (shell pattern) namespaced EvalClusters may reach with their own "
                                   "key Secret (repeat).")] = [],  # noqa: B006
    allowed_path_root: Annotated[list[str], typer.Option(
        "--allowed-path-root", help="A directory absolute local paths of namespaced EvalClusters may point into "
                                    "(repeat).")] = [],  # noqa: B006
    allowed_mlflow_uri: Annotated[list[str], typer.Option(
        "--allowed-mlflow-uri", help="A tracking URI (prefix) the operator's own MLflow login may be sent to "
                                     "(repeat); tenants may name a URI under it whatever its host.")] = [],  # noqa: B006
    allowed_webhook_url: Annotated[list[str], typer.Option(
        "--allowed-webhook-url", help="A webhook URL (prefix) tenants may name whatever its host, e.g. an in-cluster "
                                      "relay (repeat); others must be http(s) on public addresses.")] = [],  # noqa: B006
    allow_model_selector: Annotated[bool, typer.Option(
        "--allow-model-selector", help="Let namespaced EvalRuns use modelSelector: it reads the results DB's models "
                                       "table, with every namespace's model names.")] = False,
    max_evalruns_per_namespace: Annotated[int, typer.Option(
        "--max-evalruns-per-namespace", min=1, help="EvalRuns served per namespace, oldest first; the others are "
                                                    "Stalled (QuotaExceeded).")] = 50,
    max_cells_per_namespace: Annotated[int, typer.Option(
        "--max-cells-per-namespace", min=1, help="Cells (models × benchmarks) served per namespace, oldest "
                                                 "EvalRuns first.")] = 50_000,
    pass_timeout: Annotated[float | None, typer.Option(
        "--pass-timeout", min=1.0, help="Seconds a pass may take; then its EvalRun is Unknown and a hung pass keeps "
                                        "only its own worker (default: 4 intervals, at least 60).")] = None,
    operator_namespace: Annotated[str, typer.Option(
        "--operator-namespace", envvar="POD_NAMESPACE", help="The operator's namespace: where the Secrets of "
                                                             "ClusterEvalClusters are.")] = "evalrun-system",
    verbose: Verbose = 0,
) -> None:
    """Run the Kubernetes operator: reconcile EvalRun resources with the same passes as `reconcile`.

    Deny by default: what a namespace's author writes never runs as the operator (see README "Multi-tenant
    clusters"); the --allow* flags open what the admin decides."""
    configure_logging(verbose, json_lines=True)  # beside kopf's JSON lines
    with _exits():
        from controller.api.tenancy import NamespaceQuota, OperatorPolicy
        from controller.entry import operator as kube_operator  # kopf and the client load only for this command
        from controller.entry.operator_pass import OperatorConfig

        url = store or os.environ.get("EVALCTL_STORE") or DEFAULT_STORE
        state = state or os.environ.get("EVALCTL_STATE") or None
        _store(StoreURLs(url, state), readonly=False).close()  # a store that cannot be opened stops here, in one line
        policy = OperatorPolicy(allow_local_scheduler=allow_local_scheduler,
                                allowed_ssh_hosts=tuple(allowed_ssh_host), allowed_path_roots=tuple(allowed_path_root),
                                allowed_mlflow_uris=tuple(allowed_mlflow_uri),
                                allowed_webhook_urls=tuple(allowed_webhook_url),
                                allow_model_selector=allow_model_selector)
        config = OperatorConfig(store_url=url, state_url=state, base_dir=base_dir.resolve(), interval_s=interval,
                                holder=process_identity(), policy=policy, namespace=operator_namespace,
                                pass_timeout_s=pass_timeout or max(4 * interval, 60.0),
                                quota=NamespaceQuota(max_evalruns=max_evalruns_per_namespace,
                                                     max_cells=max_cells_per_namespace))
        kube_operator.run(config, namespaces=namespace, standalone=standalone, liveness=liveness,
                          metrics_port=metrics_port, peering=peering,
                          priority=priority if priority is not None else kube_operator.random_priority())


db_app = typer.Typer(no_args_is_help=True, help="Look at the results DB as the reconciler reads it.")
app.add_typer(db_app, name="db")


@db_app.command("check")
def db_check(
    store: StoreURL = None,
    output: Annotated[Output, typer.Option("-o", "--output")] = Output.table,
    verbose: Verbose = 0,
) -> None:
    """Report rows the reconciler would read as ambiguous or cannot read; exit 1 if there are any. Read-only."""
    configure_logging(verbose)
    with _exits():
        opened = _store(StoreURLs(store, None), readonly=True)
        try:
            snapshot = opened.results.read_results(None, None)
        finally:
            opened.close()
        findings = check_results(snapshot)
        rows_read = len(snapshot.rows) + len(snapshot.undecodable)
        if output == Output.json:
            print(render.db_findings_json(findings, rows_read))
        else:
            render.db_findings(findings, rows_read, out)
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
    with _exits():
        specs = _load(files)
        urls = StoreURLs(store, state)
        _refuse((apply and _results_url(urls).startswith(SUPABASE_SCHEMES),
                 "--apply cannot mark rows through Supabase's REST API: use --store postgresql://… (the project's "
                 "direct connection), whose migrations create evalrun_row_audit"))
        opened = _store(urls, readonly=True)
        try:
            found = audit_results(specs, opened, load_catalog(), utc_now())
        finally:
            opened.close()
        marked = None
        if apply:
            if found.new:
                writable = _store(urls, readonly=False)
                try:
                    writable.results.mark_rows([entry.mark() for entry in found.new])
                finally:
                    writable.close()
            marked = len(found.new)
        if output == Output.json:
            print(render.audit_json(found, marked=marked))
        else:
            render.audit_table(found, out, marked=marked)
        code = 1 if found.new and not apply else 0
    raise typer.Exit(code)


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
    with _exits():
        specs = _load(files)
        opened = _store(StoreURLs(store, state), readonly=True)
        try:
            built = build_report(specs, opened, load_catalog(), utc_now())
        finally:
            opened.close()
        write_report(built, output)
        cells = sum(len(r.cells) for r in built.runs)
        provisional = sum(1 for r in built.runs for c in r.cells if c.provisional and c.score is not None)
        out.print(f"wrote {output}: {len(built.runs)} EvalRun(s), {cells} cell(s), {provisional} provisional")


models_app = typer.Typer(no_args_is_help=True, help="The results DB's models, as a modelSelector chooses them.")
app.add_typer(models_app, name="models")


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
    with _exits():
        _refuse((bool(files) and any(v is not None for v in (benchmark, size, within)),
                 "use -f SPEC or --benchmark/--size/--within, not both"),
                (not files and benchmark is None, "name a spec with -f, or a benchmark with --benchmark"))
        catalog = load_catalog()
        if files:
            specs = _load(files)
            queries = [(r, specs.cluster_of(r)) for r in specs.evalruns if r.run.spec.model_selector is not None]
            if not queries:
                raise UsageError("no EvalRun in these files has a modelSelector")
        else:
            assert benchmark is not None
            try:
                queries = [flag_query(catalog, benchmark, size, within)]
            except ValueError as error:
                raise UsageError(str(error)) from None
        opened = _store(StoreURLs(store, None), readonly=True)
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
            print(render.candidates_json([(str(run.ref) if files else None, chosen) for run, chosen in found]))
        else:
            for run, chosen in found:
                render.candidates_table(str(run.ref) if files else None, chosen, out)


nodes_app = typer.Typer(no_args_is_help=True, help="Nodes quarantined as bad (refire-elsewhere): see them, lift them.")
app.add_typer(nodes_app, name="nodes")
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
    with _exits():
        opened = _store(StoreURLs(store, state), readonly=True)
        try:
            found = nodes.node_quarantines(opened.state.live_quarantines(), cluster)
        finally:
            opened.close()
        if output == Output.json:
            print(nodes.as_json(found))
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
    with _exits():
        opened = _store(StoreURLs(store, state), readonly=False)
        try:
            released = nodes.release(opened.state, node, cluster)
        except nodes.ClusterNeeded as exc:
            raise UsageError(str(exc)) from None
        finally:
            opened.close()
        out.print(nodes.released_line(released, utc_now()), markup=False, soft_wrap=True)


@app.command()
def crds() -> None:
    """Print the CustomResourceDefinitions generated from the spec models."""
    from controller.api.crds import render_crds

    print(render_crds(), end="")


def _settled(results: list[PassResult]) -> bool:
    """Nothing in flight: every cell Completed or Failed (a human's turn)."""
    return all(r.status.settled for r in results)


def main() -> None:
    # Everything imported so far lives as long as the process: out of the collector's sight, a pass's full
    # collections no longer walk it again and again (the GC's cost grows with all live objects, not the new ones).
    gc.freeze()
    # the last line of defence: whatever a command prints or logs, this process's secrets and token shapes masked
    sys.stdout, sys.stderr = cast(TextIO, MaskedStream(sys.stdout)), cast(TextIO, MaskedStream(sys.stderr))
    app()


if __name__ == "__main__":
    main()
