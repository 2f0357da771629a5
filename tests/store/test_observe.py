"""observe: families in both directions, only their rows, tolerant decoding, a fixed number of queries."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

from controller.adapters.store.sqlite import SqliteStore
from controller.core.ports import ObservationError
from controller.core.types import Metric
from tests.fixtures.legacy_db import Families, LegacyDB
from tests.store.builders import new_row, submission

MODEL = "laion/Qwen3-8B-sft-v3"
V2_FAMILY = {"dev_set_v2", "DCAgent_dev_set_v2", "dev_set_v2_2.0x"}


def observe(path: Path, models: list[str], benchmarks: list[str], evalrun: str = "qwen-evals"):
    store = SqliteStore(path, readonly=True)
    try:
        return store.observe(evalrun, models, benchmarks)
    finally:
        store.close()


@pytest.mark.parametrize("asked", ["dev_set_v2", "DCAgent_dev_set_v2", "dev_set_v2_2.0x"])
def test_any_member_name_brings_the_whole_benchmark_family(
    legacy: tuple[LegacyDB, Families], db_path: Path, asked: str
) -> None:
    snapshot = observe(db_path, [MODEL], [asked])

    assert {b.name for b in snapshot.benchmarks} == V2_FAMILY


@pytest.mark.parametrize("asked", [MODEL, "laion/Qwen3-8B-sft-v3-copy"])
def test_any_member_name_brings_the_whole_model_family(
    legacy: tuple[LegacyDB, Families], db_path: Path, asked: str
) -> None:
    _, fam = legacy

    snapshot = observe(db_path, [asked], ["dev_set_v2"])

    assert {(m.id, m.duplicate_of) for m in snapshot.models} == {(fam.qwen, None), (fam.qwen_dup, fam.qwen)}


def test_rows_across_families_are_returned_and_rows_outside_are_not(
    legacy: tuple[LegacyDB, Families], db_path: Path
) -> None:
    db, fam = legacy
    inside = {
        db.add_row(fam.qwen, fam.v2),
        db.add_row(fam.qwen_dup, fam.v2_dcagent, username="bob"),
        db.add_row(fam.qwen, fam.v2_2x, job_status="Pending", slurm_job_id="pending"),
    }
    db.add_row(fam.other_model, fam.v2)  # other model family
    db.add_row(fam.qwen, fam.tb2)  # benchmark not asked for
    db.add_row(None, fam.v2)  # orphan row without a model

    snapshot = observe(db_path, ["laion/Qwen3-8B-sft-v3-copy"], ["dev_set_v2_2.0x"])

    assert {r.id for r in snapshot.rows} == inside
    assert {r.username for r in snapshot.rows} == {"alice", "bob"}


def test_unknown_names_give_an_empty_snapshot(legacy: tuple[LegacyDB, Families], db_path: Path) -> None:
    db, fam = legacy
    db.add_row(fam.qwen, fam.v2)

    snapshot = observe(db_path, ["nobody/Nothing-1B"], ["dev_set_v2"])

    assert snapshot.models == snapshot.rows == ()


def test_submissions_are_only_those_of_the_evalrun(store: SqliteStore) -> None:
    store.record_intent(submission("ours", evalrun="qwen-evals"), None)
    store.record_intent(submission("theirs", evalrun="other-evals"), None)

    snapshot = store.observe("qwen-evals", [], [])

    assert [s.name for s in snapshot.submissions] == ["ours"]
    assert snapshot.submissions[0] == submission("ours", evalrun="qwen-evals")


@pytest.mark.parametrize(
    ("stored", "expected"),
    [
        ("2025-03-01 10:00:00.123456+00", datetime(2025, 3, 1, 10, 0, 0, 123456, tzinfo=UTC)),
        ("2025-03-01T10:00:00Z", datetime(2025, 3, 1, 10, tzinfo=UTC)),
        ("2025-03-01T12:00:00+02:00", datetime(2025, 3, 1, 10, tzinfo=UTC)),
        ("2025-03-01T10:00:00", datetime(2025, 3, 1, 10, tzinfo=UTC)),
        ("2025-03-01 10:00:00.12+00", datetime(2025, 3, 1, 10, 0, 0, 120000, tzinfo=UTC)),
        (None, None),
        ("", None),
    ],
)
def test_timestamps_in_every_spelling_come_back_as_aware_utc(
    legacy: tuple[LegacyDB, Families], db_path: Path, stored: str | None, expected: datetime | None
) -> None:
    db, fam = legacy
    db.add_row(fam.qwen, fam.v2, job_status="Started", started_at=stored)

    (row,) = observe(db_path, [MODEL], ["dev_set_v2"]).rows

    assert row.started_at == expected
    assert expected is None or row.started_at.utcoffset() == timedelta(0)


@pytest.mark.parametrize(
    ("stored", "expected"),
    [
        ([{"name": "accuracy", "value": 0.5}], (Metric(name="accuracy", value=0.5),)),
        ({"accuracy": 0.5}, (Metric(name="accuracy", value=0.5),)),  # legacy dict, read as its list
        (json.dumps(json.dumps([{"name": "accuracy", "value": 0.5}])), (Metric(name="accuracy", value=0.5),)),
        ([{"name": "accuracy", "value": None}], (Metric(name="accuracy", value=None),)),
        ([], ()),
        ({}, ()),
        ("null", None),
        (None, None),
        ("", None),
    ],
)
def test_metrics_variants(
    legacy: tuple[LegacyDB, Families], db_path: Path, stored: object, expected: tuple[Metric, ...] | None
) -> None:
    db, fam = legacy
    db.add_row(fam.qwen, fam.v2, metrics=stored)

    (row,) = observe(db_path, [MODEL], ["dev_set_v2"]).rows

    assert row.metrics == expected


@pytest.mark.parametrize(
    "column",
    [
        {"started_at": "yesterday-ish"},
        {"metrics": "{not json"},
        {"metrics": [0.5]},
        {"config": "[1, 2]"},
    ],
)
def test_undecodable_values_fail_closed(legacy: tuple[LegacyDB, Families], db_path: Path, column: dict) -> None:
    db, fam = legacy
    row = db.add_row(fam.qwen, fam.v2, **column)

    with pytest.raises(ObservationError, match=row):
        observe(db_path, [MODEL], ["dev_set_v2"])


def test_unreadable_file_is_an_observation_error(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    path.write_bytes(b"this is not a database" * 100)

    with pytest.raises(ObservationError):
        observe(path, [MODEL], ["dev_set_v2"])


def test_query_count_per_observe_does_not_grow_with_the_number_of_names(store: SqliteStore) -> None:
    for i in range(500):
        store.create_row(new_row(f"row-{i}", model=f"org/model-{i}", benchmark=f"bench-{i % 7}"))
    store.record_intent(submission(), None)

    def queries_for(n: int) -> tuple[int, int]:
        before = store.queries
        snapshot = store.observe("qwen-evals", [f"org/model-{i}" for i in range(n)], [f"bench-{i}" for i in range(7)])
        return store.queries - before, len(snapshot.rows)

    assert queries_for(10) == (6, 10)
    assert queries_for(500) == (6, 500)


def test_naive_and_offset_datetimes_written_by_us_read_back_as_utc(store: SqliteStore) -> None:
    store.record_intent(
        submission().model_copy(update={"created_at": datetime(2025, 6, 1, 14, tzinfo=timezone(timedelta(hours=2)))}),
        None,
    )

    (sub,) = store.observe("qwen-evals", [], []).submissions

    assert sub.created_at == datetime(2025, 6, 1, 12, tzinfo=UTC)
    assert sub.created_at.tzinfo == UTC
