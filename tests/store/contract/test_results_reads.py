"""Reading the lab's results DB: families in both directions, only their rows, tolerant decoding, fail closed."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from controller.core.observed import Metric
from controller.core.ports import ObservationError
from controller.core.store import Store
from tests.store.contract.conftest import Backend

MODEL = "laion/Qwen3-8B-sft-v3"
V2_FAMILY = {"dev_set_v2", "DCAgent_dev_set_v2", "dev_set_v2_2.0x"}


@pytest.mark.parametrize("asked", ["dev_set_v2", "DCAgent_dev_set_v2", "dev_set_v2_2.0x"])
def test_any_member_name_brings_the_whole_benchmark_family(results_backend: Backend, asked: str) -> None:
    results_backend.families  # noqa: B018 — plants them

    snapshot = results_backend.results.read_results([MODEL], [asked])

    assert {b.name for b in snapshot.benchmarks} == V2_FAMILY


@pytest.mark.parametrize("asked", [MODEL, "laion/Qwen3-8B-sft-v3-copy"])
def test_any_member_name_brings_the_whole_model_family(results_backend: Backend, asked: str) -> None:
    fam = results_backend.families

    snapshot = results_backend.results.read_results([asked], ["dev_set_v2"])

    assert {(m.id, m.duplicate_of) for m in snapshot.models} == {(fam.qwen, None), (fam.qwen_dup, fam.qwen)}


def test_rows_across_families_are_returned_and_rows_outside_are_not(results_backend: Backend) -> None:
    db, fam = results_backend.legacy, results_backend.families
    inside = {
        db.add_row(fam.qwen, fam.v2),
        db.add_row(fam.qwen_dup, fam.v2_dcagent, username="bob"),
        db.add_row(fam.qwen, fam.v2_2x, job_status="Pending", slurm_job_id="pending"),
    }
    outside = {db.add_row(fam.other_model, fam.v2), db.add_row(fam.qwen, fam.tb2)}

    snapshot = results_backend.results.read_results(["laion/Qwen3-8B-sft-v3-copy"], ["dev_set_v2_2.0x"])
    everything = results_backend.results.read_results(None, None)

    assert {r.id for r in snapshot.rows} == inside
    assert {r.username for r in snapshot.rows} == {"alice", "bob"}
    assert {r.id for r in everything.rows} == inside | outside
    assert len(everything.models) == 3 and len(everything.benchmarks) == 4


def test_unknown_names_give_an_empty_snapshot(results_backend: Backend) -> None:
    fam = results_backend.families
    results_backend.legacy.add_row(fam.qwen, fam.v2)

    snapshot = results_backend.results.read_results(["nobody/Nothing-1B"], ["dev_set_v2"])

    assert snapshot.models == snapshot.rows == ()


@pytest.mark.parametrize(
    ("stored", "expected"),
    [
        ("2025-03-01 10:00:00.123456+00", datetime(2025, 3, 1, 10, 0, 0, 123456, tzinfo=UTC)),
        ("2025-03-01T10:00:00Z", datetime(2025, 3, 1, 10, tzinfo=UTC)),
        ("2025-03-01T12:00:00+02:00", datetime(2025, 3, 1, 10, tzinfo=UTC)),
        ("2025-03-01 10:00:00.12+00", datetime(2025, 3, 1, 10, 0, 0, 120000, tzinfo=UTC)),
        (None, None),
    ],
)
def test_timestamps_in_every_spelling_come_back_as_aware_utc(
    results_backend: Backend, stored: str | None, expected: datetime | None
) -> None:
    fam = results_backend.families
    results_backend.legacy.add_row(fam.qwen, fam.v2, job_status="Started", started_at=stored)

    (row,) = results_backend.results.read_results([MODEL], ["dev_set_v2"]).rows

    assert row.started_at == expected
    assert expected is None or row.started_at.utcoffset() == timedelta(0)


@pytest.mark.parametrize(
    ("stored", "expected"),
    [
        ([{"name": "accuracy", "value": 0.5}], (Metric(name="accuracy", value=0.5),)),
        ({"accuracy": 0.5}, (Metric(name="accuracy", value=0.5),)),  # legacy dict, read as its list
        (json.dumps([{"name": "accuracy", "value": 0.5}]), (Metric(name="accuracy", value=0.5),)),  # double-encoded
        ([{"name": "accuracy", "value": None}], (Metric(name="accuracy", value=None),)),
        ([], ()),
        ({}, ()),
        (None, None),
    ],
)
def test_metrics_variants(results_backend: Backend, stored: object, expected: tuple[Metric, ...] | None) -> None:
    fam = results_backend.families
    results_backend.legacy.add_row(fam.qwen, fam.v2, metrics=stored)

    (row,) = results_backend.results.read_results([MODEL], ["dev_set_v2"]).rows

    assert row.metrics == expected


@pytest.mark.parametrize("column", [{"metrics": "{not json"}, {"metrics": [0.5]}, {"config": [1, 2]},
                                    {"started_at": "yesterday-ish"}])
def test_undecodable_rows_are_named_and_fail_the_pass_closed(results_backend: Backend, column: dict) -> None:
    if "started_at" in column and not results_backend.opaque_text:
        pytest.skip(f"{results_backend.name} cannot hold an undecodable timestamp")
    db, fam = results_backend.legacy, results_backend.families
    bad = db.add_row(fam.qwen, fam.v2, **column)
    good = db.add_row(fam.qwen, fam.v2)

    snapshot = results_backend.results.read_results([MODEL], ["dev_set_v2"])

    assert [r.id for r in snapshot.rows] == [good]
    assert len(snapshot.undecodable) == 1 and bad in snapshot.undecodable[0]
    store = Store(results_backend.results, _NoState())
    with pytest.raises(ObservationError, match=bad):
        store.observe("qwen-evals", [MODEL], ["dev_set_v2"])


class _NoState:
    """Only the results half is under test here."""

    def read_state(self, *_: object) -> object:
        from controller.core.records import StateSnapshot

        return StateSnapshot()

    def close(self) -> None: ...
