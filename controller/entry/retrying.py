"""`evalctl retry`: a human's lever on held cells (RULES §13). It plans (as `status` does) to find which of the named
cells are held, records one retry request per held cell, and says so; the next acting pass releases each hold once.
A cell that is not held is reported and nothing is recorded for it: a request waiting for a hold that has not
happened would release it later, unasked."""

from __future__ import annotations

import getpass
import os
import uuid
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from controller.api.catalog import load_catalog
from controller.core.levers import retried
from controller.core.reconcile import PassResult
from controller.core.retry import RetryRequest
from controller.core.vocabulary import CellPlan, Phase
from controller.entry.explaining import names_cell, nearest_cells, specs_holding
from controller.entry.shell import StoreURLs, UsageError, connect, load, one_pass, refuse
from controller.entry.store_location import STATE_ENV, STORE_ENV, NoDefaultStore, shown, state_url, store_url
from controller.entry.wiring import utc_now


def spec_args(files: Sequence[Path], urls: StoreURLs) -> list[str]:
    """How a command was told its specs and store, for the command it prints: a store's password never (a URL with
    one is shown without it; the user adds it back, or sets EVALCTL_STORE)."""
    given = [("--store", urls.results), ("--state", urls.state)]
    return [*(w for f in files for w in ("-f", str(f))), *(w for flag, url in given if url for w in (flag, shown(url)))]


def store_args(files: Sequence[Path], urls: StoreURLs) -> list[str]:
    """The --store and --state of the store a command used, for a command it prints that reads no spec (`evalctl
    nodes release`): that one cannot find the store next to the spec. What $EVALCTL_STORE or $EVALCTL_STATE names
    it reads as well, so that is left out; a password never shown (see `spec_args`)."""
    try:
        url, source = store_url(urls.results, tuple(files))
    except NoDefaultStore:
        return []
    state = state_url(urls.state, url, tuple(files))
    given = [("--store", None if source == f"${STORE_ENV}" else url),
             ("--state", None if urls.state is None and os.environ.get(STATE_ENV) else state)]
    return [word for flag, value in given if value for word in (flag, shown(value))]


def requester() -> str:
    """Who asks: the OS user of this process (what `evalctl` also runs jobs as)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return f"uid {os.getuid()}"


def chosen(results: Sequence[PassResult], model: str | None, benchmark: str | None, *, held: bool,
           all_failed: bool) -> list[CellPlan]:
    """The cells the arguments name: one cell (model and benchmark), every held one, or every Failed one."""
    cells = [c for r in results for c in r.plan.cells]
    if held:
        return [c for c in cells if c.held]
    if all_failed:
        return [c for c in cells if c.phase == Phase.FAILED]
    assert model is not None and benchmark is not None
    named = [c for c in cells if names_cell(c.cell, model, benchmark)]
    if not named:
        raise UsageError(f"no cell {model} × {benchmark} in these specs"
                         + nearest_cells([c.cell for c in cells], model, benchmark))
    return named


def retry(files: list[Path], model: str | None, benchmark: str | None, *, held: bool, all_failed: bool, reason: str,
          urls: StoreURLs, console: Console) -> None:
    named = model is not None or benchmark is not None
    refuse((named and (model is None or benchmark is None), "name a cell as MODEL BENCHMARK (both)"),
           (sum((named, held, all_failed)) != 1, "name one cell (MODEL BENCHMARK), or --held, or --all-failed"))
    specs = load(files, preflight=True)  # a job script still missing would only fail again
    if model is not None and benchmark is not None:
        specs = specs_holding(specs, load_catalog(), model, benchmark)
    store = connect(urls, readonly=False)
    try:
        results = one_pass(specs, store, act=False)
        plans = [c for r in results for c in r.plan.cells]
        targets = chosen(results, model, benchmark, held=held, all_failed=all_failed)
        if not targets:
            console.print(f"nothing to retry: no {'held' if held else 'Failed'} cell in these specs",
                          highlight=False)
            return
        now, who = utc_now(), requester()
        for target in targets:
            c = target.cell
            if not target.held:
                console.print(f"nothing to retry: {c.label} is {target.phase.value} ({target.reason})",
                              markup=False, highlight=False)
                continue
            for asked in retried(target, plans):
                request = RetryRequest(id=uuid.uuid4().hex, cell_key=asked.key, evalrun=asked.evalrun,
                                       requested_by=who, requested_at=now, reason=reason)
                store.state.request_retry(request)
                console.print(f"recorded: retry {asked.label} (EvalRun {asked.evalrun}), {request.line()}; "
                              f"{'it was' if asked == c else f'its cell {c.label} was'} held: {target.reason}",
                              markup=False, highlight=False)
        if any(t.held for t in targets):
            console.print("the next pass releases each once, as one new attempt: evalctl reconcile "
                          + " ".join(spec_args(files, urls)), markup=False, highlight=False)
    finally:
        store.close()

