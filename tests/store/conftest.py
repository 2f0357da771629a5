from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.adapters.store.sqlite import SqliteStore
from tests.fixtures.legacy_db import Families, LegacyDB, build_families


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "store.db"


@pytest.fixture
def store(db_path: Path) -> Iterator[SqliteStore]:
    opened = SqliteStore(db_path)
    yield opened
    opened.close()


@pytest.fixture
def legacy(db_path: Path) -> Iterator[tuple[LegacyDB, Families]]:
    db, families = build_families(db_path)
    yield db, families
    db.close()
