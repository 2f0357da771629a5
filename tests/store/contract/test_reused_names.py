"""Which row a new row reuses when several `models` (or `benchmarks`) rows share its name, the same on every
backend (ResultsDB.create_row): the canonical one, then the oldest creation_time (none last), then the smallest id."""

from __future__ import annotations

import uuid

import pytest

from controller.core.observed import RowStatus
from controller.core.records import NewRow
from tests.store.contract.conftest import Backend

MODEL = "org/Shared-7B"
BENCHMARK = "shared_bench"
# Lowercase uuids: uuid order, text order and Python's str order agree, so "smallest id" means one thing.
ID = [f"00000000-0000-4000-8000-{n:012d}" for n in range(10)]


def plant_model(backend: Backend, model_id: str, creation_time: str | None, *, duplicate_of: str | None = None,
                name: str = MODEL) -> None:
    backend.legacy.insert("models", {"id": model_id, "name": name, "duplicate_of": duplicate_of,
                                     "created_by": "legacy", "creation_time": creation_time})


def reused(backend: Backend, *, benchmark: str = "dev_set_v2") -> tuple[str | None, str | None]:
    """Create a row of MODEL on `benchmark` and read back which model and benchmark rows it points at."""
    row = NewRow(id=str(uuid.uuid4()), job_name="ev_reuse", username="alice", model_name=MODEL,
                 benchmark_name=benchmark, job_status=RowStatus.PENDING)
    backend.results.create_row(row)
    stored = backend.results.read_row(row.id)
    assert stored is not None
    return stored.model_id, stored.benchmark_id


def test_the_canonical_model_wins_over_older_duplicates_with_smaller_ids(results_backend: Backend) -> None:
    plant_model(results_backend, ID[9], "2024-01-01 00:00:00+00", name="org/Shared-7B-base")
    plant_model(results_backend, ID[1], "2024-06-01 00:00:00+00", duplicate_of=ID[9])
    plant_model(results_backend, ID[5], "2025-06-01 00:00:00+00")
    plant_model(results_backend, ID[2], "2024-03-01 00:00:00+00", duplicate_of=ID[9])

    assert reused(results_backend)[0] == ID[5]


@pytest.mark.parametrize("undated", [None, "not a time"], ids=["null", "unreadable"])
def test_a_model_without_a_creation_time_comes_after_a_dated_one(results_backend: Backend, undated: str | None) -> None:
    if undated is not None and not results_backend.opaque_text:
        pytest.skip(f"{results_backend.name} cannot hold an unreadable timestamp")
    plant_model(results_backend, ID[1], undated)
    plant_model(results_backend, ID[2], "2025-06-01 00:00:00+00")

    assert reused(results_backend)[0] == ID[2]


def test_the_oldest_model_wins_as_a_time_whatever_its_spelling(results_backend: Backend) -> None:
    plant_model(results_backend, ID[1], "2025-01-01 09:00:00+00")
    plant_model(results_backend, ID[2], "2025-01-01T10:00:00+02:00")  # 08:00 UTC: the oldest
    plant_model(results_backend, ID[3], "2025-01-01T08:30:00.000000+00:00")

    assert reused(results_backend)[0] == ID[2]


@pytest.mark.parametrize(("first", "second"), [("infinity", "2025-01-01 00:00:00+00"),
                                               ("2025-01-01 00:00:00+00", "-infinity")])
def test_infinite_times_sort_as_postgres_sorts_them(results_backend: Backend, first: str, second: str) -> None:
    plant_model(results_backend, ID[1], first)
    plant_model(results_backend, ID[2], second)

    assert reused(results_backend)[0] == ID[2]


@pytest.mark.parametrize("creation_time", ["2025-01-01 00:00:00+00", None], ids=["same-time", "no-time"])
def test_models_of_one_age_go_to_the_smallest_id(results_backend: Backend, creation_time: str | None) -> None:
    plant_model(results_backend, ID[7], creation_time)
    plant_model(results_backend, ID[3], creation_time)
    plant_model(results_backend, ID[5], creation_time)

    assert reused(results_backend)[0] == ID[3]


def test_the_canonical_benchmark_wins_then_the_smallest_id(results_backend: Backend) -> None:
    results_backend.allow_shared_benchmark_names()
    for benchmark_id, name, duplicate_of in [(ID[9], "shared_bench_base", None), (ID[1], BENCHMARK, ID[9]),
                                             (ID[5], BENCHMARK, None), (ID[3], BENCHMARK, None)]:
        results_backend.legacy.insert("benchmarks", {"id": benchmark_id, "name": name, "duplicate_of": duplicate_of})

    assert reused(results_backend, benchmark=BENCHMARK)[1] == ID[3]
