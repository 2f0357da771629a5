"""The contract's Supabase backend: `SupabaseResults` against the loopback PostgREST stand-in (results only)."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

from controller.adapters.store.supabase import SupabaseResults
from tests.fixtures.legacy_db import LegacyTables
from tests.fixtures.postgrest import FakePostgrest
from tests.store.contract.conftest import Backend


class PostgrestTables(LegacyTables):
    """Rows planted as the REST API would return them: JSON values as they are, timestamps as text."""

    def __init__(self, fake: FakePostgrest) -> None:
        self.fake = fake

    def insert(self, table: str, record: dict[str, Any]) -> None:
        self.fake.insert(table, copy.deepcopy(record))

    def raw_row(self, row_id: str) -> dict[str, Any] | None:
        found = next((row for row in self.fake.tables["sandbox_jobs"] if row["id"] == row_id), None)
        return copy.deepcopy(found)


def open_supabase_backend(fake: FakePostgrest) -> Iterator[Backend]:
    results = SupabaseResults(fake.url, fake.key, sleep=lambda _: None)
    tables = PostgrestTables(fake)
    yield Backend("supabase", results, None, tables, tables.raw_row)
    results.close()
