"""What only the SQLite file shows: text spellings, a file that is not a database, a fixed number of statements.

The backend-independent rules are in tests/store/contract.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from controller.adapters.store import open_store
from controller.adapters.store.sqlite import SqliteStore
from controller.core.ports import ObservationError
from controller.core.store import Store
from tests.fixtures.legacy_db import Families, LegacyDB
from tests.store.builders import new_row, submission

MODEL = "laion/Qwen3-8B-sft-v3"
V2_FAMILY = {"dev_set_v2", "DCAgent_dev_set_v2", "dev_set_v2_2.0x"}


def observe(path: Path, models: list[str], benchmarks: list[str], evalrun: str = "qwen-evals"):
    store = open_store(f"sqlite:///{path}", readonly=True)
    try:
        return store.observe(evalrun, models, benchmarks)
    finally:
        store.close()


@pytest.mark.parametrize(
    ("stored", "expected"),
    [
        ("2025-03-01T10:00:00", datetime(2025, 3, 1, 10, tzinfo=UTC)),  # naive text = UTC (the old listener)
        ("", None),
    ],
)
def test_text_only_timestamp_spellings(legacy: tuple[LegacyDB, Families], db_path: Path, stored: str,
                                       expected: datetime | None) -> None:
    db, fam = legacy
    db.add_row(fam.qwen, fam.v2, job_status="Started", started_at=stored)

    (row,) = observe(db_path, [MODEL], ["dev_set_v2"]).rows

    assert row.started_at == expected


def test_unreadable_file_is_an_observation_error(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    path.write_bytes(b"this is not a database" * 100)

    with pytest.raises(ObservationError):
        observe(path, [MODEL], ["dev_set_v2"])


def test_query_count_per_observe_does_not_grow_with_the_number_of_names(store: SqliteStore) -> None:
    for i in range(500):
        store.create_row(new_row(f"row-{i}", model=f"org/model-{i}", benchmark=f"bench-{i % 7}"))
    store.record_submission(submission())
    both = Store(store, store)

    def queries_for(n: int) -> tuple[int, int]:
        before = store.queries
        snapshot = both.observe("qwen-evals", [f"org/model-{i}" for i in range(n)], [f"bench-{i}" for i in range(7)],
                                [f"cell-{i}" for i in range(n)])
        return store.queries - before, len(snapshot.rows)

    # results: tables, families, rows; state: tables, submissions, owners, tunnels, memory, quarantines, retry
    # requests, GPU history
    assert queries_for(10) == (11, 10)
    assert queries_for(500) == (11, 500)


