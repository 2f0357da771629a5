"""open_store picks the backend from the URL; later backends fail with a clear, exit-2-able error."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.adapters.store import UnsupportedStoreURL, open_store
from controller.adapters.store.sqlite import SqliteStore


def test_relative_sqlite_url_is_relative_to_the_working_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)

    store = open_store("sqlite:///.evalctl/store.db")
    store.close()

    assert (tmp_path / ".evalctl" / "store.db").exists()


def test_absolute_sqlite_url(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "store.db"

    store = open_store(f"sqlite:///{path}")
    store.close()

    assert isinstance(store.results, SqliteStore) and store.state is store.results
    assert path.exists()


def test_read_only_url_creates_neither_file_nor_directory(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path}/deep/store.db", readonly=True)
    assert store.observe("r", ["m"], ["b"]).rows == ()
    store.close()

    assert not (tmp_path / "deep").exists()


def test_memory_url_is_a_working_store() -> None:
    store = open_store("sqlite:///:memory:")
    assert store.state.try_lease("r", "me", 60)
    store.close()


def test_supabase_without_a_key_says_which_variable_to_set() -> None:
    with pytest.raises(UnsupportedStoreURL, match="SUPABASE_SERVICE_KEY"):
        open_store("supabase://project.supabase.co", env={})


def test_supabase_cannot_hold_the_controller_state(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedStoreURL, match="results only"):
        open_store(f"sqlite:///{tmp_path}/r.db", state_url="supabase://project.supabase.co",
                   env={"SUPABASE_SERVICE_KEY": "k"})


@pytest.mark.parametrize("url", ["mysql://db/evals", "sqlite:///", "sqlite://relative.db", "store.db"])
def test_unknown_urls_are_rejected(url: str) -> None:
    with pytest.raises(UnsupportedStoreURL, match="not supported"):
        open_store(url)
