"""`spec.modelSelector` end to end: models chosen from a legacy-shaped results DB, sticky in the controller state,
and nothing new when the DB cannot be read. `evalctl models unevaluated` runs the same query."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest

from controller.adapters.store import open_store
from controller.adapters.store.sqlite import SqliteStore
from controller.api.catalog import load_catalog
from controller.api.loader import load_specs
from controller.core.records import ResultsSnapshot
from controller.core.store import Store
from controller.entry.passes import pass_targets
from controller.entry.wiring import utc_now
from tests.e2e.conftest import Cluster
from tests.fixtures.legacy_db import LegacyDB, LegacyTables, terminus_config
from tests.fixtures.postgres import PgServer, pg_start, pg_stop, throwaway_database
from tests.store.contract.postgres_backend import PostgresTables

NOW = datetime.now(UTC)
SCORED = [{"name": "accuracy", "value": 0.4}]
SELECTOR = """  modelSelector:
    namePatterns: ["lab/*"]
    sizeBand: {minB: 7, maxB: 9}
    createdWithin: 14d
    exclude: ["*kappa*"]
    limit: LIMIT
"""
# Newest first among the admitted: alpha (1 d), [beta: scored by bob], gamma (3 d, bob's row has no metrics),
# zeta (4 d), eta (5 d). The others fail a rule: size, window, pattern, size unknown, excluded, a duplicate's name.
EXPECTED = ["lab/alpha-8B", "lab/gamma-7B", "lab/zeta-8B"]


def days_ago(days: float) -> datetime:
    return NOW - timedelta(days=days)


class Lab:
    """The legacy population: model and benchmark families, other users' rows, models of many sizes and ages."""

    def __init__(self, db: LegacyTables) -> None:
        self.db = db
        self.tiny = db.add_benchmark("tiny")
        self.tiny_legacy = db.add_benchmark("tiny_legacy", duplicate_of=self.tiny)
        self.ids: dict[str, str] = {}
        for name, age in [("lab/alpha-8B", 1), ("lab/beta-8B", 2), ("lab/gamma-7B", 3), ("lab/delta-32B", 1),
                          ("lab/eps-8B", 20), ("lab/zeta-8B", 4), ("lab/eta-8B", 5), ("lab/theta", 2),
                          ("other/iota-8B", 1), ("lab/kappa-8B", 2)]:
            self.ids[name] = db.add_model(name, created=days_ago(age))
        db.add_model("lab/alpha-8B-copy", duplicate_of=self.ids["lab/alpha-8B"], created=days_ago(0.5))
        # bob scored beta on the family's other name; his gamma row finished without metrics
        self.score("lab/beta-8B", benchmark=self.tiny_legacy)
        db.add_row(self.ids["lab/gamma-7B"], self.tiny, username="bob", config=terminus_config(), metrics=None)

    def score(self, model: str, benchmark: str | None = None) -> None:
        self.db.add_row(self.ids[model], benchmark or self.tiny, username="bob", config=terminus_config(),
                        metrics=SCORED, ended_at=NOW)


def write(cluster: Cluster, limit: int = 3) -> None:
    cluster.write(models=[], datasets=["DCAgent/tiny"], env={"FAKE_HARBOR_TASKS": "2"},
                  extra_run=SELECTOR.replace("LIMIT", str(limit)))


def plan_json(cluster: Cluster) -> dict:
    [evalrun] = json.loads(cluster.evalctl("plan", "-o", "json").stdout)["evalruns"]
    return evalrun


def unevaluated(cluster: Cluster) -> list[str]:
    result = cluster.evalctl("models", "unevaluated", "-f", str(cluster.spec), "--store", cluster.store, "-o", "list")
    return result.stdout.split()


class StopsMidSelection(Store):
    """The real store; the database is stopped after the selector read the models and before it reads their rows."""

    def __init__(self, inner: Store, server: PgServer) -> None:
        super().__init__(inner.results, inner.state)
        real_read = inner.results.read_results

        def stop_then_read(models: list[str] | None, benchmarks: list[str] | None) -> ResultsSnapshot:
            pg_stop(server=server)
            return real_read(models, benchmarks)

        self.results.read_results = stop_then_read  # type: ignore[method-assign]


@pytest.fixture
def pg_lab(cluster: Cluster, pg_private_server: PgServer) -> Iterator[tuple[Cluster, Lab, PostgresTables]]:
    """On this session's own server: the test stops it, and the shared one serves the tests running beside it."""
    with throwaway_database(pg_private_server) as url:
        open_store(url).close()  # the lab's tables (uuid, jsonb, timestamptz) and ours
        tables = PostgresTables(url)
        cluster.store = url
        yield cluster, Lab(tables), tables
        tables.close()


@pytest.mark.postgres
def test_a_selector_on_a_legacy_postgres_db(pg_lab: tuple[Cluster, Lab, PostgresTables],
                                            pg_private_server: PgServer) -> None:
    cluster, lab, tables = pg_lab
    write(cluster)

    assert unevaluated(cluster) == EXPECTED
    planned = plan_json(cluster)
    assert [c["model"] for c in planned["cells"]] == EXPECTED
    assert planned["modelSelector"]["note"].startswith("would select 3 new model(s)")
    assert tables.conn.execute("SELECT count(*) FROM evalrun_model_selections").fetchone() == (0,), \
        "plan records nothing"

    lab.score("lab/gamma-7B")  # bob evaluates gamma between the plan and the pass
    cluster.evalctl("reconcile", "--once")

    selected = [m for (m,) in tables.conn.execute("SELECT model FROM evalrun_model_selections ORDER BY model")]
    assert selected == ["lab/alpha-8B", "lab/eta-8B", "lab/zeta-8B"], "gamma was evaluated meanwhile: not taken"
    submitted = sorted(key.split("|")[0] for (key,) in tables.conn.execute("SELECT cell_key FROM evalrun_submissions"))
    assert submitted == selected, "one launch per selected model; nothing for the one someone else evaluated"

    # alpha leaves the window; the limit is raised and a new model registered: alpha stays, lambda joins
    tables.conn.execute("UPDATE models SET creation_time = now() - interval '30 days' WHERE name = 'lab/alpha-8B'")
    lab.ids["lab/lambda-8B"] = tables.add_model("lab/lambda-8B", created=days_ago(0.1))
    write(cluster, limit=5)
    catalog = load_catalog()
    specs = load_specs([cluster.spec], catalog)
    store = open_store(cluster.store)
    try:
        [target] = pass_targets(specs, catalog, StopsMidSelection(store, pg_private_server), utc_now(), act=True)
    finally:
        pg_start(pg_private_server)
        store.close()
    assert target.intake.startswith("nothing new selected: the results DB cannot be read"), target.intake
    assert sorted(s.model for s in target.selections) == selected, "what was taken before is still its cells"
    assert {c.model for c in target.cells} == set(selected)
    with psycopg.connect(cluster.store, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM evalrun_model_selections").fetchone() == (3,)

    planned = plan_json(cluster)
    assert "lab/alpha-8B" in [c["model"] for c in planned["cells"]], "selected earlier: stays after the window"
    assert planned["modelSelector"]["note"] == "would select 1 new model(s): lab/lambda-8B"
    by_model = {s["model"]: s for s in planned["modelSelector"]["selected"]}
    assert by_model["lab/alpha-8B"]["rule"] == ("newest names lab/*, 7–9B, registered within 14d, unevaluated")


def test_a_selector_converges_on_sqlite_and_the_flags_query_agrees(cluster: Cluster) -> None:
    db = LegacyDB(Path(cluster.store.removeprefix("sqlite:///")))
    Lab(db)
    db.close()
    write(cluster, limit=2)

    flags = cluster.evalctl("models", "unevaluated", "--benchmark", "DCAgent/tiny", "--size", "8", "--within", "14d",
                            "--store", cluster.store, "-o", "json")
    found = [m["model"] for m in json.loads(flags.stdout)["models"]]
    # the 8B class of the size policy is 0–14B: no pattern, so iota and kappa count too
    assert found == ["lab/alpha-8B", "other/iota-8B", "lab/kappa-8B", "lab/gamma-7B", "lab/zeta-8B", "lab/eta-8B"]

    result = cluster.evalctl("reconcile", "--loop", "--interval", "0.3", "--until-done")
    assert "converged after" in result.stdout
    store = SqliteStore(cluster.store.removeprefix("sqlite:///"), readonly=True)
    try:
        assert [s.model for s in store.read_selections(load_specs([cluster.spec]).evalruns[0].ref)] == EXPECTED[:2]
    finally:
        store.close()
    status = cluster.evalctl("status")
    assert "modelSelector: 2 of limit 2 selected" in status.stdout
    assert "lab/alpha-8B: selected " in status.stdout and "by newest names lab/*" in status.stdout
    assert unevaluated(cluster) == ["lab/zeta-8B", "lab/eta-8B"], "alpha and gamma are scored now"


def test_selections_that_cannot_be_read_make_the_evalrun_unknown_and_nothing_is_done(cluster: Cluster) -> None:
    db = LegacyDB(Path(cluster.store.removeprefix("sqlite:///")))
    Lab(db)
    db.close()
    write(cluster)
    SqliteStore(cluster.store.removeprefix("sqlite:///")).close()  # our tables
    with sqlite3.connect(cluster.store.removeprefix("sqlite:///")) as conn:
        conn.execute("INSERT INTO evalrun_model_selections VALUES ('e2e', 'lab/alpha-8B', 'by hand', 'not a time')")

    result = cluster.evalctl("reconcile", "--once", check=False)

    assert "the models its modelSelector took cannot be read" in result.stdout + result.stderr
    with sqlite3.connect(cluster.store.removeprefix("sqlite:///")) as conn:
        assert conn.execute("SELECT count(*) FROM evalrun_submissions").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM evalrun_model_selections").fetchone() == (1,)
    assert not cluster.scheduler.observe(), "nothing submitted"
