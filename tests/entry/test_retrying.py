"""The words `status` and `explain` print to name the specs and store of a release command: never a password."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.entry.retrying import spec_args, store_args
from controller.entry.shell import StoreURLs
from controller.entry.store_location import STATE_ENV, STORE_ENV


def test_the_release_command_names_the_specs_and_store_it_was_given_without_a_password() -> None:
    plain = spec_args([Path("specs/a.yaml"), Path("specs/b.yaml")], StoreURLs("sqlite:///x/s.db", None))
    secret = spec_args([Path("a.yaml")], StoreURLs("postgresql://eval:hunter2@db:5432/lab",
                                                   "postgresql://db/lab?password=hunter2"))

    assert plain == ["-f", "specs/a.yaml", "-f", "specs/b.yaml", "--store", "sqlite:///x/s.db"]
    assert secret == ["-f", "a.yaml", "--store", "postgresql://eval:***@db:5432/lab", "--state", "postgresql://db/lab?password=***"]
    assert spec_args([Path("a.yaml")], StoreURLs(None, None)) == ["-f", "a.yaml"]


def test_a_command_that_reads_no_spec_is_given_the_store_next_to_the_spec(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """`evalctl nodes release` has no -f to find the store by: the one `status` read is named."""
    monkeypatch.delenv(STORE_ENV, raising=False)
    monkeypatch.delenv(STATE_ENV, raising=False)
    spec = tmp_path / "run.yaml"

    assert store_args([spec], StoreURLs(None, None)) == ["--store", f"sqlite:///{tmp_path}/.evalctl/store.db"]
    assert store_args([spec], StoreURLs("postgresql://eval:hunter2@db/lab", None)) == [
        "--store", "postgresql://eval:***@db/lab"]


def test_a_store_the_environment_names_is_left_to_the_environment(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(STORE_ENV, "sqlite:////srv/evalctl.db")
    monkeypatch.delenv(STATE_ENV, raising=False)
    assert store_args([tmp_path / "run.yaml"], StoreURLs(None, None)) == []
