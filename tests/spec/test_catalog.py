"""The shipped catalog loads, can be overridden file by file, and a broken file is reported by position."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.spec.catalog import CATALOG_DIR_ENV, SHIPPED_DIR, load_catalog
from controller.spec.errors import SpecErrors


def test_error_classes_are_data() -> None:
    classes = load_catalog().error_classes
    assert classes.classify("DaytonaRateLimitError", has_reward=False) == "infra"
    assert classes.classify("ContextLengthExceededError", has_reward=False) == "benign"
    assert classes.classify("AgentTimeoutError", has_reward=True) == "benign"
    assert classes.classify("AgentTimeoutError", has_reward=False) == "other"
    assert classes.classify("ValueError", has_reward=False) == "other"
    assert len(classes.infra) == 16 and "InstantFailure" in classes.infra, "the 15 of REFERENCE §3 and our own"


def test_catalog_is_cached() -> None:
    assert load_catalog() is load_catalog()


def test_override_dir_replaces_only_the_files_it_has(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "presets.yaml").write_text("presets:\n  tiny: {dataset: local/tiny, n_concurrent: 2, tasks: 4}\n")
    monkeypatch.setenv(CATALOG_DIR_ENV, str(tmp_path))
    catalog = load_catalog()
    assert list(catalog.presets.presets) == ["tiny"]
    assert catalog.size_policy.choose("Qwen/Qwen3-32B").rule.timeout_multiplier == 16.0


def test_broken_catalog_file_is_reported_with_position(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "presets.yaml").write_text(
        "presets:\n  tb2: {dataset: x/y, n_concurrent: many}\naliases:\n  id: [tb2, nope]\n"
    )
    (tmp_path / "size_policy.yaml").write_text("size_token: '('\nbands: []\n")
    monkeypatch.setenv(CATALOG_DIR_ENV, str(tmp_path))
    with pytest.raises(SpecErrors) as caught:
        load_catalog()
    shown = [str(e) for e in caught.value.errors]
    assert shown[0].startswith(
        f"{tmp_path / 'presets.yaml'}:2:37: presets.tb2.n_concurrent: Input should be a valid integer"
    )
    assert shown[1].startswith(f"{tmp_path / 'size_policy.yaml'}:1:1: missing required field `default`")
    assert shown[2].startswith(f"{tmp_path / 'size_policy.yaml'}:1:13: size_token: size_token is not a valid regular")
    assert len(shown) == 3


def test_alias_must_name_known_presets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "presets.yaml").write_text(
        "presets:\n  tb2: {dataset: x/y, n_concurrent: 1}\naliases:\n  id: [tb2, nope]\n"
    )
    monkeypatch.setenv(CATALOG_DIR_ENV, str(tmp_path))
    with pytest.raises(SpecErrors) as caught:
        load_catalog()
    assert [str(e) for e in caught.value.errors] == [
        f"{tmp_path / 'presets.yaml'}:4:13: aliases.id[1]: unknown preset nope"
    ]


def test_shipped_files_are_all_there() -> None:
    names = {p.name for p in SHIPPED_DIR.glob("*.yaml")}
    assert names == {"presets.yaml", "error_classes.yaml", "size_policy.yaml", "model_registry.yaml", "harnesses.yaml",
                     "failures.yaml"}
