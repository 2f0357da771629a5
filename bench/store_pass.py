"""Bench: the store's share of a pass over 2,000 cells, on SQLite and on PostgreSQL, side by side.

Usage: python bench/store_pass.py [--models 50] [--datasets 40] [--repeat 5]
Starts the lab PostgreSQL (scripts/pg-up.sh), fills a SQLite file and a fresh Postgres database with the same
history (each cell: its submission and our Finished row; plus as many rows of other users), then times a plan
pass (act=False: observe the store, the local queue and an empty jobs dir; match; plan) on each, and counts
the statements and round trips Postgres served. Also runs a pass over a tenth of the cells, to show the round
trips do not grow with the number of cells. Prints figures; asserts nothing about time.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fleet import write_fleet_spec  # noqa: E402

from controller.adapters.store import open_store  # noqa: E402
from controller.adapters.store.postgres import PostgresStore  # noqa: E402
from controller.api.catalog import load_catalog  # noqa: E402
from controller.api.loader import SpecSet, load_specs  # noqa: E402
from controller.core.actor import row_config, row_id_for  # noqa: E402
from controller.core.observed import Metric, RowStatus, Submission  # noqa: E402
from controller.core.ports import SqlBackend  # noqa: E402
from controller.core.reconcile import reconcile_pass  # noqa: E402
from controller.core.records import NewRow, ResultUpload  # noqa: E402
from controller.core.run_target import RunTarget  # noqa: E402
from controller.core.store import Store  # noqa: E402
from controller.entry.wiring import cluster_ports, targets_for  # noqa: E402


def fleet(root: Path, models: int, datasets: int) -> tuple[SpecSet, RunTarget]:
    spec = write_fleet_spec(root, models, datasets, suspend=True)
    (root / "jobs").mkdir(exist_ok=True)
    catalog = load_catalog()
    specs = load_specs([spec], catalog)
    [target] = targets_for(specs, catalog)
    return specs, target


def fill(store: SqlBackend, target: RunTarget) -> None:
    now = datetime.now(UTC)
    upload = ResultUpload(metrics=(Metric(name="accuracy", value=0.5),), stats={}, n_trials=100, ended_at=now)
    for index, cell in enumerate(target.cells):
        tag = cell.run_tag(1)
        row_id = row_id_for(tag)
        store.record_submission(Submission(name=tag, run_tag=tag, evalrun="fleet", cell_key=cell.key, attempt=1,
                                           fire=1, row_id=row_id, job_id=str(index + 1), created_at=now))
        store.create_row(NewRow(id=row_id, job_name=tag, username="bench", model_name=cell.model,
                                benchmark_name=cell.benchmark_name, job_status=RowStatus.STARTED, submitted_at=now,
                                config=row_config(cell, tag)))
        store.upload_result(row_id, upload, owner="bench")
        store.create_row(NewRow(id=str(uuid.uuid4()), job_name=f"legacy_{index}", username="someone-else",
                                model_name=cell.model, benchmark_name=cell.benchmark_name,
                                job_status=RowStatus.FINISHED, submitted_at=now, config={"agent": "other"}))


def timed_pass(specs: SpecSet, target: RunTarget, store: Store) -> float:
    catalog = load_catalog()
    started = time.perf_counter()
    [result] = reconcile_pass([target], store, cluster_ports(specs, store, catalog), datetime.now(UTC), act=False)
    elapsed = time.perf_counter() - started
    assert sum(1 for c in result.plan.cells if c.phase.value == "Completed") == len(target.cells)
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=50)
    parser.add_argument("--datasets", type=int, default=40)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    server = subprocess.run([str(REPO / "scripts" / "pg-up.sh")], check=True, capture_output=True,
                            text=True).stdout.strip().splitlines()[-1]
    root = Path(tempfile.mkdtemp(prefix="evalrun-store-bench-"))
    specs, target = fleet(root, args.models, args.datasets)
    database = f"bench_{uuid.uuid4().hex[:8]}"
    subprocess.run(["psql", server, "-qc", f"CREATE DATABASE {database}"], check=True)
    pg_url = server.rsplit("/", 1)[0] + f"/{database}"
    started = time.perf_counter()
    sqlite_url = f"sqlite:///{root}/store.db"
    for url in (sqlite_url, pg_url):
        filled = open_store(url)
        fill(filled.results, target)  # type: ignore[arg-type]  # both backends hold both halves
        filled.close()
    print(f"fleet: {len(target.cells)} cells, {2 * len(target.cells)} sandbox_jobs rows per store "
          f"(filled in {time.perf_counter() - started:.0f} s)")
    small = target.model_copy(update={"cells": target.cells[: len(target.cells) // 10]})
    figures = {}
    for name, url in (("sqlite", sqlite_url), ("postgres", pg_url)):
        store = open_store(url)
        timed_pass(specs, target, store)  # warm-up: imports, connection, page cache
        backend = store.results
        figures[name] = statistics.median(timed_pass(specs, target, store) for _ in range(args.repeat))
        if isinstance(backend, PostgresStore):
            counts = []
            for subject in (small, target):
                before = (backend.queries, backend.round_trips)
                timed_pass(specs, subject, store)
                counts.append((len(subject.cells), backend.queries - before[0], backend.round_trips - before[1]))
            for cells, queries, trips in counts:
                print(f"postgres, {cells} cells: {queries} statements in {trips} round trips per pass")
        store.close()
    print(f"plan pass over {len(target.cells)} cells, median of {args.repeat}: sqlite {figures['sqlite']:.3f} s, "
          f"postgres {figures['postgres']:.3f} s (ratio {figures['postgres'] / figures['sqlite']:.2f})")
    subprocess.run(["psql", server, "-qc", f"DROP DATABASE {database} WITH (FORCE)"], check=True)


if __name__ == "__main__":
    main()
