"""`evalctl get evalruns|cells`: what the store knows, without a spec (core/inventory.py says what that is)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from datetime import datetime
from enum import StrEnum

from rich.console import Console
from rich.table import Table
from rich.text import Text

from controller.adapters.store import DEFAULT_STATE_FOR_SUPABASE, SUPABASE_SCHEMES, redact
from controller.core.inventory import CellRecord, EvalRunRecord, cell_records, evalrun_records
from controller.core.ports import ObservationError
from controller.core.store import Store
from controller.entry.humanize import NOTHING, duration
from controller.entry.shell import StoreURLs, results_url


class Kind(StrEnum):
    evalruns = "evalruns"
    cells = "cells"


class NoStore(RuntimeError):
    """Nothing was ever recorded at the store's place: no file or no tables of the controller (exit 1)."""


def read_cells(store: Store, urls: StoreURLs) -> tuple[CellRecord, ...]:
    """Every submitted cell and the rows its submissions name: two reads. Raises NoStore, ObservationError."""
    inventory = store.state.read_inventory()
    if inventory is None:
        raise NoStore(f"no store at {state_place(urls)}: nothing has been recorded there (a reconcile records there; --store, "
                      "--state or $EVALCTL_STORE name another place)")
    models = sorted({s.model for s in inventory.submissions if s.model})
    benchmarks = sorted({s.benchmark for s in inventory.submissions if s.benchmark})
    results = store.results.read_results(models, benchmarks) if models and benchmarks else None
    if results is not None and results.undecodable:  # guessing a row's status would mislead: fail the read
        raise ObservationError("; ".join(results.undecodable[:3]))
    return cell_records(inventory, results.rows if results is not None else ())


def state_place(urls: StoreURLs) -> str:
    """Where the controller state was looked for (open_store's choice), without a password."""
    results = results_url(urls)
    state = urls.state or os.environ.get("EVALCTL_STATE")
    return redact(state or (DEFAULT_STATE_FOR_SUPABASE if results.startswith(SUPABASE_SCHEMES) else results))


def get_document(kind: Kind, cells: Sequence[CellRecord]) -> str:
    """`-o json|yaml`: {"evalruns": [...]} or {"cells": [...]}, every field of the records."""
    records: Sequence[CellRecord | EvalRunRecord] = evalrun_records(cells) if kind == Kind.evalruns else cells
    return json.dumps({kind.value: [r.model_dump(mode="json") for r in records]}, indent=2)


def get_table(kind: Kind, cells: Sequence[CellRecord], console: Console, now: datetime) -> None:
    if kind == Kind.evalruns:
        table = Table("EVALRUN", "CELLS", "STATUS", "SCORED", "PROVISIONAL", "CLUSTERS", "AGE", box=None,
                      expand=False, pad_edge=False)
        for run in evalrun_records(cells):
            table.add_row(*map(Text, (run.evalrun, str(run.cells),
                                      ", ".join(f"{n} {status}" for status, n in run.statuses.items()),
                                      str(run.scored), str(run.provisional), ", ".join(run.clusters) or NOTHING,
                                      duration(now - run.submitted_at))))
    else:
        table = Table("EVALRUN", "MODEL", "BENCHMARK", "CLUSTER", "STATUS", "SCORE", "N", "PROVISIONAL", "ATTEMPT",
                      "JOB", "AGE", box=None, expand=False, pad_edge=False)
        for cell in cells:
            table.add_row(*map(Text, (
                cell.evalrun, cell.model or cell.cell_key, cell.benchmark or NOTHING, cell.cluster or NOTHING,
                cell.status, NOTHING if cell.score is None else f"{cell.score:.3f}",
                NOTHING if cell.n_scored is None else str(cell.n_scored),
                NOTHING if cell.provisional is None else ("yes" if cell.provisional else "no"), str(cell.attempts),
                cell.job_id or NOTHING, duration(now - cell.submitted_at))))
    if not cells:
        console.print(f"no {kind.value} recorded in this store yet")
        return
    console.print(table)
