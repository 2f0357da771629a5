"""The operator shares one store across its handler threads only when no half of it is a SQLite file."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from controller.entry.operator_pass import OperatorConfig, Stores

pytestmark = pytest.mark.postgres


def opened_in_threads(stores: Stores) -> list[object]:
    """The store each of two handler threads got (and used: SQLite refuses a connection from another thread)."""
    seen: list[object] = []

    def handler() -> None:
        with stores.open() as store:
            store.state.try_lease("evalrun/x", threading.current_thread().name, 0)
            seen.append(store)

    for _ in range(2):
        thread = threading.Thread(target=handler)
        thread.start()
        thread.join()
    stores.close()
    return seen


def config(store_url: str, state_url: str | None = None) -> OperatorConfig:
    return OperatorConfig(store_url=store_url, state_url=state_url, base_dir=Path("."), interval_s=30, holder="me")


def test_a_postgres_store_is_opened_once_and_shared(pg_url: str) -> None:
    first, second = opened_in_threads(Stores(config(pg_url)))

    assert first is second


@pytest.mark.parametrize("sqlite_half", ["results", "state"])
def test_a_store_with_a_sqlite_half_is_opened_per_pass(pg_url: str, tmp_path: Path, sqlite_half: str) -> None:
    sqlite = f"sqlite:///{tmp_path}/half.db"
    urls = (sqlite, pg_url) if sqlite_half == "results" else (pg_url, sqlite)

    first, second = opened_in_threads(Stores(config(*urls)))

    assert first is not second
