"""The contract's PostgreSQL backend: a throwaway database on the lab server, legacy rows planted with psycopg."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from controller.adapters.store.postgres import PostgresStore
from tests.fixtures.legacy_db import LegacyTables
from tests.store.contract.conftest import Backend

JSON_COLUMNS = {"config", "metrics", "stats"}


class PostgresTables(LegacyTables):
    """Values as the lab's jsonb and timestamptz columns hold them; a str in a JSON column is a JSON string."""

    def __init__(self, url: str) -> None:
        self.conn = psycopg.connect(url, autocommit=True)

    def insert(self, table: str, record: dict[str, Any]) -> None:
        values = [Jsonb(value) if column in JSON_COLUMNS and value is not None else value
                  for column, value in record.items()]
        self.conn.execute(f"INSERT INTO {table} ({', '.join(record)}) VALUES ({', '.join(['%s'] * len(record))})",
                          values)

    def allow_shared_benchmark_names(self) -> None:
        """A lab copy whose `benchmarks.name` is not unique."""
        self.conn.execute("ALTER TABLE benchmarks DROP CONSTRAINT benchmarks_name_key")

    def raw_row(self, row_id: str) -> dict[str, Any] | None:
        found = self.conn.execute("SELECT to_jsonb(t) FROM sandbox_jobs t WHERE id::text = %s", (row_id,)).fetchone()
        return None if found is None else dict(found[0])

    def close(self) -> None:
        self.conn.close()


def open_postgres_backend(url: str) -> Iterator[Backend]:
    store = PostgresStore(url)  # creates the OT-Agent tables (uuid, jsonb, timestamptz) and ours
    tables = PostgresTables(url)
    yield Backend("postgres", store, store, tables, tables.raw_row, opaque_text=False,
                  allow_shared_benchmark_names=tables.allow_shared_benchmark_names)
    tables.close()
    store.close()
