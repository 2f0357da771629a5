"""The words `status` and `explain` print to name the specs and store of a release command: never a password."""

from __future__ import annotations

from pathlib import Path

from controller.entry.retrying import spec_args
from controller.entry.shell import StoreURLs


def test_the_release_command_names_the_specs_and_store_it_was_given_without_a_password() -> None:
    plain = spec_args([Path("specs/a.yaml"), Path("specs/b.yaml")], StoreURLs("sqlite:///x/s.db", None))
    secret = spec_args([Path("a.yaml")], StoreURLs("postgresql://eval:hunter2@db:5432/lab",
                                                   "postgresql://db/lab?password=hunter2"))

    assert plain == ["-f", "specs/a.yaml", "-f", "specs/b.yaml", "--store", "sqlite:///x/s.db"]
    assert secret == ["-f", "a.yaml", "--store", "postgresql://eval:***@db:5432/lab", "--state", "postgresql://db/lab?password=***"]
    assert spec_args([Path("a.yaml")], StoreURLs(None, None)) == ["-f", "a.yaml"]
