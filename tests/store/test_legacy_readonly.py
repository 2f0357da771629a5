"""A legacy OT-Agent DB opened read-only: rows are visible, nothing is remembered, nothing is touched."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

import pytest

from controller.adapters.store import open_store
from controller.adapters.store.errors import WriteRefused
from controller.adapters.store.sqlite import SqliteStore
from controller.core.observed import Metric, RowStatus
from tests.fixtures.legacy_db import Families, LegacyDB, terminus_config
from tests.store.builders import new_row, submission


def fingerprint(directory: Path) -> dict[str, tuple[bytes, int]]:
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(directory.iterdir())}


def test_legacy_store_read_only_yields_rows_and_no_submissions(
    legacy: tuple[LegacyDB, Families], db_path: Path
) -> None:
    db, fam = legacy
    finished = db.add_row(
        fam.qwen,
        fam.v2,
        created_at=datetime(2025, 3, 1, 10, tzinfo=UTC),
        ended_at=datetime(2025, 3, 1, 18, tzinfo=UTC),
        config=terminus_config(),
        metrics=[{"name": "accuracy", "value": 0.41}, {"name": "accuracy_stderr", "value": 0.02}],
        slurm_job_id="123456",
    )
    db.close()
    before = fingerprint(db_path.parent)

    store = open_store(f"sqlite:///{db_path}", readonly=True)
    snapshot = store.observe("qwen-evals", ["laion/Qwen3-8B-sft-v3"], ["dev_set_v2"], ["some-cell"])
    store.close()

    (row,) = snapshot.rows
    assert row.id == finished
    assert row.job_status == "Finished"
    assert row.created_at == datetime(2025, 3, 1, 10, tzinfo=UTC)
    assert row.metrics == (Metric(name="accuracy", value=0.41), Metric(name="accuracy_stderr", value=0.02))
    assert row.config == terminus_config()
    assert row.slurm_job_id == "123456"
    assert snapshot.submissions == ()
    assert fingerprint(db_path.parent) == before  # same bytes, same mtime, no -wal/-shm, no new tables


def test_read_only_store_refuses_every_write(legacy: tuple[LegacyDB, Families], db_path: Path) -> None:
    store = SqliteStore(db_path, readonly=True)

    with pytest.raises(WriteRefused):
        store.record_submission(submission())
    with pytest.raises(WriteRefused):
        store.create_row(new_row())
    with pytest.raises(WriteRefused):
        store.update_row("row-1", owner="alice", status=RowStatus.STARTED)
    with pytest.raises(WriteRefused):
        store.try_lease("qwen-evals", "me", 60)
    store.close()


def test_missing_file_read_only_is_an_empty_store_and_creates_nothing(tmp_path: Path) -> None:
    path = tmp_path / "nowhere" / "store.db"

    store = open_store(f"sqlite:///{path}", readonly=True)
    snapshot = store.observe("qwen-evals", ["laion/Qwen3-8B-sft-v3"], ["dev_set_v2"])
    assert store.results.read_row("row-1") is None
    store.close()

    assert snapshot.rows == snapshot.models == snapshot.submissions == ()
    assert os.listdir(tmp_path) == []


def test_read_only_store_sees_a_file_created_after_it_opened(db_path: Path) -> None:
    reader = open_store(f"sqlite:///{db_path}", readonly=True)
    assert reader.observe("qwen-evals", [], []).submissions == ()

    writer = SqliteStore(db_path)
    writer.record_submission(submission())

    assert len(reader.observe("qwen-evals", [], []).submissions) == 1
    reader.close()
    writer.close()
