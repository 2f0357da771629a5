"""Opening a writable store creates what is missing and nothing else, however often it happens."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from controller.adapters.store.sqlite import SqliteStore
from tests.fixtures.legacy_db import Families, LegacyDB

ALL_TABLES = {"models", "benchmarks", "sandbox_jobs", "evalrun_submissions", "evalrun_leases",
              "evalrun_tunnel_leases", "evalrun_cell_owners", "evalrun_cell_memory"}


def schema(path: Path) -> list[tuple]:
    with sqlite3.connect(path) as conn:
        return conn.execute("SELECT type, name, sql FROM sqlite_master ORDER BY name").fetchall()


def test_open_creates_every_table_and_reopening_changes_nothing(db_path: Path) -> None:
    SqliteStore(db_path).close()
    first = schema(db_path)
    SqliteStore(db_path).close()
    SqliteStore(db_path).close()

    assert {name for kind, name, _ in first if kind == "table"} == ALL_TABLES
    assert schema(db_path) == first


def test_store_uses_wal_for_two_processes(db_path: Path) -> None:
    SqliteStore(db_path).close()

    with sqlite3.connect(db_path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)


def test_writable_open_of_a_legacy_db_adds_own_tables_and_keeps_rows(
    legacy: tuple[LegacyDB, Families], db_path: Path
) -> None:
    db, fam = legacy
    row = db.add_row(fam.qwen, fam.v2, metrics=[{"name": "accuracy", "value": 0.5}])

    store = SqliteStore(db_path)
    snapshot = store.read_results(["laion/Qwen3-8B-sft-v3"], ["dev_set_v2"])
    store.close()

    assert {name for kind, name, _ in schema(db_path) if kind == "table"} == ALL_TABLES
    assert [r.id for r in snapshot.rows] == [row]


def test_parent_directories_are_created(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "store.db"

    SqliteStore(path).close()

    assert path.exists()
