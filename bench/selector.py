"""Bench: a modelSelector's share of a pass over 20,000 registered models and 200,000 sandbox_jobs rows on PostgreSQL.

Usage: python bench/selector.py [--models 20000] [--rows 200000] [--repeat 5]
Starts the lab PostgreSQL (scripts/pg-up.sh), fills a fresh database with a legacy-shaped population (model and
benchmark families, sizes 0.5–70B, registered over a year, rows of ten users, half of them scored), then times
what the selector does before a pass (read what it took before, read the models, check the admitted ones'
rows batch by batch) for three rules, counting statements and round trips. `plan` mode: nothing is recorded.
Prints figures; asserts nothing about time.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from controller.adapters.store import open_store  # noqa: E402
from controller.adapters.store.postgres import PostgresStore  # noqa: E402
from controller.api.catalog import load_catalog  # noqa: E402
from controller.api.loader import load_specs  # noqa: E402
from controller.entry.passes import pass_targets  # noqa: E402

SIZES = (0.5, 1.5, 7, 8, 8, 14, 32, 70)
RULES = {
    "8B-class, 30 d, limit 20": "sizeBand: {minB: 7, maxB: 9}\n    createdWithin: 30d\n    limit: 20",
    "every size, 1 y, limit 200": "limit: 200",
    "one org's 32B, limit 5": "namePatterns: ['org06/*']\n    sizeBand: {minB: 28, maxB: 42}\n    limit: 5",
}


def fill(url: str, models: int, rows: int) -> None:
    """COPY the population in: a tenth of the models are duplicates (another name of a canonical one)."""
    rng = random.Random(7)
    now = datetime.now(UTC)
    model_ids = [str(uuid.uuid4()) for _ in range(models)]
    with psycopg.connect(url, autocommit=True) as conn:
        with conn.cursor().copy("COPY models (id, name, duplicate_of, created_by, creation_time) FROM STDIN") as copy:
            for index, model_id in enumerate(model_ids):
                duplicate = model_ids[index - 1] if index % 10 == 9 else None
                copy.write_row((model_id, f"org{index % 40:02d}/model-{index:05d}-{SIZES[index % len(SIZES)]:g}B",
                                duplicate, "bench", now - timedelta(days=rng.uniform(0, 365))))
        benchmarks = [str(uuid.uuid4()) for _ in range(12)]
        names = ["terminal_bench_2", "DCAgent2_terminal_bench_2", "terminal_bench_2_v0", *(f"bench_{i}" for i in
                                                                                             range(9))]
        with conn.cursor().copy("COPY benchmarks (id, name, duplicate_of) FROM STDIN") as copy:
            for index, (benchmark_id, name) in enumerate(zip(benchmarks, names, strict=True)):
                copy.write_row((benchmark_id, name, benchmarks[0] if index in (1, 2) else None))
        config = json.dumps({"agent": "terminus-2", "timeout_multiplier": 2.0})
        scored = json.dumps([{"name": "accuracy", "value": 0.5}])
        with conn.cursor().copy("COPY sandbox_jobs (id, created_at, job_name, username, job_status, config, metrics,"
                                " model_id, benchmark_id) FROM STDIN") as copy:
            for index in range(rows):
                finished = rng.random() < 0.5
                copy.write_row((str(uuid.uuid4()), now, f"legacy_{index}", f"user{index % 10}",
                                "Finished" if finished else "Started", config, scored if finished else None,
                                rng.choice(model_ids), rng.choice(benchmarks)))
        conn.execute("ANALYZE")


def spec(root: Path, rule: str) -> Path:
    path = root / "selector.yaml"
    path.write_text(f"""apiVersion: evalrun.io/v1alpha1
kind: EvalCluster
metadata: {{name: bench}}
spec: {{scheduler: {{type: local}}, jobsDir: {root}/jobs, logsDir: {root}/logs, jobScript: /bin/true, username: bench}}
---
apiVersion: evalrun.io/v1alpha1
kind: EvalRun
metadata: {{name: selector}}
spec:
  cluster: bench
  presets: [tb2]
  modelSelector:
    {rule}
""")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=20_000)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--profile", action="store_true", help="cProfile the last rule's selection once")
    args = parser.parse_args()
    server = subprocess.run([str(REPO / "scripts" / "pg-up.sh")], check=True, capture_output=True,
                            text=True).stdout.strip().splitlines()[-1]
    database = f"bench_{uuid.uuid4().hex[:8]}"
    subprocess.run(["psql", server, "-qc", f"CREATE DATABASE {database}"], check=True)
    url = server.rsplit("/", 1)[0] + f"/{database}"
    try:
        open_store(url).close()  # the lab's tables and ours
        started = time.perf_counter()
        fill(url, args.models, args.rows)
        print(f"population: {args.models:,} models, {args.rows:,} rows (filled in {time.perf_counter() - started:.0f} s)")
        root = Path(tempfile.mkdtemp(prefix="evalrun-selector-bench-"))
        catalog = load_catalog()
        store = open_store(url)
        backend = store.results
        assert isinstance(backend, PostgresStore)
        for label, rule in RULES.items():
            specs = load_specs([spec(root, rule)], catalog)
            times, counts = [], (0, 0)
            for _ in range(args.repeat + 1):  # the first warms the connection and the server's cache
                before = (backend.queries, backend.round_trips)
                began = time.perf_counter()
                [target] = pass_targets(specs, catalog, store, datetime.now(UTC), act=False)
                times.append(time.perf_counter() - began)
                counts = (backend.queries - before[0], backend.round_trips - before[1])
            print(f"{label}: {len(target.selections)} selected, {len(target.cells)} cells; median "
                  f"{statistics.median(times[1:]) * 1e3:.0f} ms (min {min(times[1:]) * 1e3:.0f}, max "
                  f"{max(times[1:]) * 1e3:.0f}); {counts[0]} statements in {counts[1]} round trips")
        if args.profile:
            import cProfile
            cProfile.runctx("pass_targets(specs, catalog, store, datetime.now(UTC), act=False)",
                            globals(), locals(), sort="cumtime")
        store.close()
    finally:
        subprocess.run(["psql", server, "-qc", f"DROP DATABASE {database} WITH (FORCE)"], check=True)


if __name__ == "__main__":
    main()
