"""One contract, every backend: the fixtures that give each test a fresh store of each kind.

`results_backend` runs a test against SQLite, PostgreSQL (a throwaway database on the lab server) and the
Supabase backend (its HTTP layer against the loopback PostgREST stand-in, tests/fixtures/postgrest.py).
`state_backend` runs against the backends that can hold the controller's state: SQLite and PostgreSQL.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from controller.adapters.store.sqlite import SqliteStore
from controller.core.ports import ControllerState, ResultsDB
from tests.fixtures.legacy_db import Families, LegacyTables


@dataclass
class Backend:
    """A store under test, a way to plant legacy rows in it, and a raw view to prove a row was not touched."""

    name: str
    results: ResultsDB
    state: ControllerState | None
    legacy: LegacyTables
    raw_row: Callable[[str], dict[str, Any] | None]
    opaque_text: bool = True  # columns hold any text: undecodable timestamps can be planted
    # before planting: let benchmarks share a name (drop UNIQUE (name); planting into the fake never checks it)
    allow_shared_benchmark_names: Callable[[], None] = lambda: None
    _families: Families | None = None

    @property
    def families(self) -> Families:
        if self._families is None:
            self._families = Families(self.legacy)
        return self._families


class SqliteTables(LegacyTables):
    def __init__(self, path: Path) -> None:
        self.conn = sqlite3.connect(path, isolation_level=None)

    def insert(self, table: str, record: dict[str, Any]) -> None:
        values = [json.dumps(v) if isinstance(v, dict | list) else v for v in record.values()]
        self.conn.execute(f"INSERT INTO {table} ({', '.join(record)}) VALUES ({', '.join('?' * len(record))})", values)

    def allow_shared_benchmark_names(self) -> None:
        """Rebuild the (still empty) `benchmarks` without UNIQUE (name), as a lab copy may have it."""
        self.conn.executescript("DROP TABLE benchmarks; CREATE TABLE benchmarks "
                                "(id TEXT PRIMARY KEY, name TEXT NOT NULL, duplicate_of TEXT REFERENCES benchmarks(id));")

    def raw_row(self, row_id: str) -> dict[str, Any] | None:
        self.conn.row_factory = sqlite3.Row
        found = self.conn.execute("SELECT * FROM sandbox_jobs WHERE id = ?", (row_id,)).fetchone()
        return None if found is None else dict(found)

    def close(self) -> None:
        self.conn.close()


@pytest.fixture
def sqlite_backend(tmp_path: Path) -> Iterator[Backend]:
    store = SqliteStore(tmp_path / "store.db")
    tables = SqliteTables(tmp_path / "store.db")
    yield Backend("sqlite", store, store, tables, tables.raw_row,
                  allow_shared_benchmark_names=tables.allow_shared_benchmark_names)
    tables.close()
    store.close()


@pytest.fixture
def postgres_backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    from tests.store.contract.postgres_backend import open_postgres_backend

    yield from open_postgres_backend(request.getfixturevalue("pg_url"))


@pytest.fixture
def supabase_backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    from tests.store.contract.supabase_backend import open_supabase_backend

    yield from open_supabase_backend(request.getfixturevalue("postgrest"))


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres), "supabase"])
def results_backend(request: pytest.FixtureRequest) -> Backend:
    backend: Backend = request.getfixturevalue(f"{request.param}_backend")
    return backend


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def state_backend(request: pytest.FixtureRequest) -> ControllerState:
    backend: Backend = request.getfixturevalue(f"{request.param}_backend")
    assert backend.state is not None
    return backend.state
