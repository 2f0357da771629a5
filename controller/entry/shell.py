"""What every `evalctl` command shares: its options, how failures map to exit codes and one-line messages (the
codes are listed in exit_codes.py), how it reaches the stores, and one pass (dry or acting) over the specs it was
given."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path
from types import FrameType
from typing import Annotated, NamedTuple, NoReturn

import typer
from rich.console import Console
from ruamel.yaml import YAML

from controller.adapters.process import identity_is_dead, process_identity
from controller.adapters.store import UnsupportedStoreURL, open_store
from controller.api.catalog import load_catalog
from controller.api.errors import SpecErrors
from controller.api.loader import SpecSet, load_specs
from controller.core.ports import ObservationError, StoreUnavailable
from controller.core.reconcile import PassResult
from controller.core.store import Store
from controller.entry.exit_codes import BAD_INPUT, UNOBSERVED
from controller.entry.passes import run_pass
from controller.entry.store_location import NoDefaultStore, missing_file, shown, state_url, store_url
from controller.entry.wiring import utc_now

DEFAULT_STORE = "sqlite:///.evalctl/store.db"  # the operator's (its working directory); `evalctl`'s follows the spec
BUSY_TIMEOUT_ENV = "EVALCTL_STORE_BUSY_TIMEOUT_S"  # how long a store write waits for another process's lock
RECONCILE_INTERVAL_S = 30.0
WATCH_INTERVAL_S = 10.0
RETRY_MAX_S = 300.0  # a failed --loop pass is retried after 2, 4, 8 … intervals, at most this long
SIGNALS = (signal.SIGINT, signal.SIGTERM)
out = Console(highlight=False)
LOG_WIDTH = 10_000  # off a terminal: wide enough that no row wraps, so a log line holds a whole name or run tag


def fit_output_to_logs() -> None:
    """Off a terminal (cron, CI, a pipe) and without COLUMNS, rich would wrap tables at 80 columns mid-token: a
    run tag split over two lines is not found by grep. There, each row stays on one line, full names included."""
    if not out.is_terminal and "COLUMNS" not in os.environ:
        out.width = LOG_WIDTH


class Output(StrEnum):
    table = "table"
    json = "json"
    yaml = "yaml"


def print_document(json_text: str, output: Output) -> None:
    """A command's document as `-o json` or `-o yaml` asked; the YAML holds the same keys and values."""
    if output == Output.yaml:
        yaml = YAML(typ="rt")  # keeps the keys in the order the document has them
        yaml.default_flow_style = False
        yaml.dump(json.loads(json_text), sys.stdout)
    else:
        print(json_text)
    sys.stdout.flush()  # `status --watch` shows each document as it is made


Files = Annotated[list[Path], typer.Option("-f", "--file", help="Spec files or directories (multi-document YAML).")]
StoreURL = Annotated[str | None, typer.Option("--store", help="The results DB: sqlite:///path.db, postgresql://… or "
                                              "supabase://… (default $EVALCTL_STORE, else .evalctl/store.db next to "
                                              "the spec: in the -f directory, or the -f file's; a relative sqlite "
                                              "path here or in $EVALCTL_STORE is the working directory's). The "
                                              "first stderr line names the store used.")]
StateURL = Annotated[str | None, typer.Option("--state", help="The controller's own state, when it is not kept in the "
                                              "--store DB: sqlite:///… or postgresql://… (default $EVALCTL_STATE; "
                                              "with supabase:// it defaults to .evalctl/state.db next to the spec).")]
Verbose = Annotated[int, typer.Option("-v", "--verbose", count=True, help="More log output (-v info, -vv debug).")]


class UsageError(Exception):
    """Bad input that is not a spec error (e.g. an unknown store URL, flags that do not go together): exit 2."""


class Interrupted(BaseException):
    """SIGINT or SIGTERM. A BaseException, so no `except Exception` on the way (the actor's per-action guard)
    mistakes it for a failed action: it unwinds to `exits`, and every store is closed on the way."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


# Errors that waiting does not cure: `reconcile --loop` stops on them instead of retrying. (A missing secret
# fails the submissions that need it, action by action: another EvalRun can still progress.)
FATAL = (NotImplementedError,)


@contextmanager
def exits() -> Iterator[None]:
    """Map failures to exit codes with a one-line message; a traceback only with EVALCTL_DEBUG=1."""
    try:
        with _signals():
            yield
    except Interrupted as exc:
        name = signal.Signals(exc.signum).name
        error_line(f"evalctl: interrupted ({name}); the next pass picks up where this one stopped")
        raise typer.Exit(128 + exc.signum) from None
    except SpecErrors as exc:
        for error in exc.errors:
            error_line(str(error))
        raise typer.Exit(BAD_INPUT) from None
    except (UsageError, UnsupportedStoreURL, NoDefaultStore) as exc:
        error_line(f"evalctl: {exc}")
        raise typer.Exit(BAD_INPUT) from None
    except (StoreUnavailable, ObservationError) as exc:  # a store that cannot be opened or read: not observed
        error_line(f"evalctl: not observed: {one_line(exc)}")
        raise typer.Exit(UNOBSERVED) from None
    except typer.Exit:  # a command's own exit code (click's Exit is a RuntimeError): not a failure to report
        raise
    except Exception as exc:
        if os.environ.get("EVALCTL_DEBUG") == "1":
            raise
        expected = isinstance(exc, OSError | RuntimeError)  # MissingSecret, StoreUnavailable, … say it all
        error_line(f"evalctl: {one_line(exc)}" if expected else
               f"evalctl: internal error ({type(exc).__name__}: {one_line(exc)}); EVALCTL_DEBUG=1 shows the traceback")
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


def error_line(line: str) -> None:
    """Errors go out unwrapped, one per line, so editors and CI can jump to FILE:LINE:COL."""
    print(line, file=sys.stderr)


def one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def refuse(*combinations: tuple[bool, str]) -> None:
    """Flags that do not apply are refused, not silently ignored: the user meant something else."""
    for given, message in combinations:
        if given:
            raise UsageError(message)


def load(files: list[Path], *, preflight: bool = False) -> SpecSet:
    """`preflight`: for the commands that would submit (see `load_specs`)."""
    if not files:
        raise UsageError("name at least one spec file or directory with -f")
    return load_specs(files, load_catalog(), preflight=preflight)


class StoreURLs(NamedTuple):
    """The --store and --state a command was given, and its -f paths (the default store lives next to them)."""

    results: str | None
    state: str | None
    files: tuple[Path, ...] = ()


def results_url(urls: StoreURLs) -> str:
    return store_url(urls.results, urls.files)[0]


_said: set[str] = set()  # what this process already told stderr: a loop or a notifier reconnects, the line is once


def say_once(line: str) -> None:
    if line not in _said:
        _said.add(line)
        error_line(line)


def connect(urls: StoreURLs, *, readonly: bool, missing_note: bool = True) -> Store:
    """Open the stores `urls` name, telling stderr once which (its first line). A read-only command never creates a
    SQLite store: a missing one reads as empty, which `missing_note` says (none ran with this store)."""
    url, source = store_url(urls.results, urls.files)
    state = state_url(urls.state, url, urls.files)
    say_once(f"store: {shown(url)} ({source})" + (f"; state: {shown(state)}" if state else ""))
    if readonly and missing_note and (path := missing_file(url)) is not None:
        say_once(f"evalctl: no store at {path}: nothing has run from here")
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


def one_pass(specs: SpecSet, store: Store, *, act: bool) -> list[PassResult]:
    return run_pass(specs, store, utc_now(), act=act, holder=process_identity(), holder_is_dead=identity_is_dead)


def dry_pass(specs: SpecSet, urls: StoreURLs, *, missing_note: bool = True) -> list[PassResult]:
    """A pass that plans and acts on nothing (plan, status, explain, --dry-run)."""
    store = connect(urls, readonly=True, missing_note=missing_note)
    try:
        return one_pass(specs, store, act=False)
    finally:
        store.close()
