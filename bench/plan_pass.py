"""Bench: one `plan` pass over a synthetic fleet of ≥1,000 cells and ≥100,000 Harbor trial dirs.

Usage: python bench/plan_pass.py [--root DIR] [--models 25] [--datasets 40] [--trials 100]
Builds the fleet once (reused while its parameters match), then times, each in a fresh process: a cold pass
(page cache dropped when we are root; otherwise said so; no run-dir cache), a warm pass (page cache warm, no
run-dir cache), and a cached pass (a fresh process with the run-dir cache the pass before wrote, as cron and
`reconcile --once` run), and prints the store queries per pass. Prints figures; asserts nothing about time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fleet import drop_page_cache, write_fleet_spec  # noqa: E402


def build(root: Path, models: int, datasets: int, trials: int) -> None:
    from datetime import UTC, datetime

    from controller.adapters.store.sqlite import SqliteStore
    from controller.api.catalog import load_catalog
    from controller.api.loader import load_specs
    from controller.core.actor import row_config, row_id_for
    from controller.core.observed import Metric, RowStatus, Submission
    from controller.core.records import NewRow, ResultUpload
    from controller.entry.wiring import targets_for
    from tests.fixtures.harbor_dirs import write_synthetic_run_dir

    stamp = root / "fleet.json"
    wanted = {"models": models, "datasets": datasets, "trials": trials}
    if stamp.exists() and json.loads(stamp.read_text()) == wanted:
        return
    root.mkdir(parents=True, exist_ok=True)
    spec = write_fleet_spec(root, models, datasets)
    [target] = targets_for(load_specs([spec], load_catalog()), load_catalog())
    store = SqliteStore(root / "store.db")
    now = datetime.now(UTC)
    started = time.perf_counter()
    for index, cell in enumerate(target.cells):
        tag = cell.run_tag(1)
        write_synthetic_run_dir(root / "jobs" / tag, trials, infra_every=17, benign_every=9, model=cell.model,
                                dataset=cell.dataset)
        row_id = row_id_for(tag)
        store.record_submission(
            Submission(name=tag, run_tag=tag, evalrun="fleet", cell_key=cell.key, attempt=1, fire=1, row_id=row_id,
                       job_id=str(index + 1), created_at=now))
        store.create_row(NewRow(id=row_id, job_name=tag, username="bench", model_name=cell.model,
                                benchmark_name=cell.benchmark_name, job_status=RowStatus.STARTED, submitted_at=now,
                                config=row_config(cell, tag)))
        if index % 5 < 3:  # 60% already uploaded: the planner skips them, the other 40% want an upload
            store.upload_result(row_id, ResultUpload(metrics=(Metric(name="accuracy", value=0.5),), stats={},
                                                     n_trials=trials, ended_at=now), owner="bench")
        if index % 100 == 99:
            print(f"  built {index + 1}/{len(target.cells)} cells", file=sys.stderr)
    store.close()
    print(f"built {len(target.cells)} cells, {len(target.cells) * trials} trial dirs in "
          f"{time.perf_counter() - started:.1f} s", file=sys.stderr)
    stamp.write_text(json.dumps(wanted))


def measure(root: Path) -> dict:
    """One plan pass in this process: observe every source once, plan every cell."""
    from controller.adapters.store.sqlite import SqliteStore
    from controller.api.catalog import load_catalog
    from controller.api.loader import load_specs
    from controller.core.store import Store
    from controller.entry.passes import run_pass
    from controller.entry.wiring import utc_now

    catalog = load_catalog()
    specs = load_specs([root / "fleet.yaml"], catalog)
    sqlite = SqliteStore(root / "store.db", readonly=True)
    store = Store(sqlite, sqlite)
    started = time.perf_counter()
    [result] = run_pass(specs, store, utc_now(), act=False, catalog=catalog)
    elapsed = time.perf_counter() - started
    phases: dict[str, int] = {}
    for cell in result.plan.cells:
        phases[cell.phase.value] = phases.get(cell.phase.value, 0) + 1
    return {"seconds": round(elapsed, 2), "store_queries": sqlite.queries, "cells": len(result.plan.cells),
            "phases": phases}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path("/tmp/evalrun-bench"))
    parser.add_argument("--models", type=int, default=25)
    parser.add_argument("--datasets", type=int, default=40)
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.root)))
        return
    build(args.root, args.models, args.datasets, args.trials)

    def run(cache: str) -> dict:
        out = subprocess.run([sys.executable, __file__, "--measure", "--root", str(args.root)], check=True,
                             capture_output=True, text=True, env={**os.environ, "EVALCTL_CACHE_DIR": cache}).stdout
        return json.loads(out)

    cold_is_cold = drop_page_cache()
    cold = run("")  # "": no run-dir cache
    warm = run("")
    with tempfile.TemporaryDirectory() as cache:
        run(cache)  # writes it
        cached = run(cache)
    trial_dirs = cold["cells"] * args.trials
    print(f"fleet: {cold['cells']} cells, {trial_dirs} trial dirs ({args.root})")
    print(f"cold plan pass: {cold['seconds']:.2f} s" + ("" if cold_is_cold else " (page cache NOT dropped: not root)"))
    print(f"warm plan pass: {warm['seconds']:.2f} s")
    print(f"cached plan pass (fresh process, run-dir cache): {cached['seconds']:.2f} s")
    print(f"store queries per pass: {warm['store_queries']}")
    print(f"phases: {warm['phases']}")


if __name__ == "__main__":
    main()
