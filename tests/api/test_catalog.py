"""The shipped catalog loads, can be overridden file by file, and a broken file is reported by position."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from controller.api.catalog import CATALOG_DIR_ENV, SHIPPED_DIR, ModelServing, load_catalog
from controller.api.errors import SpecErrors


def test_error_classes_are_data() -> None:
    classes = load_catalog().error_classes
    assert classes.classify("DaytonaRateLimitError", has_reward=False) == "infra"
    assert classes.classify("ContextLengthExceededError", has_reward=False) == "benign"
    assert classes.classify("AgentTimeoutError", has_reward=True) == "benign"
    assert classes.classify("AgentTimeoutError", has_reward=False) == "infra", "ungraded: not the model's 0"
    assert classes.classify("ValueError", has_reward=False) == "infra", "closed: an unknown class is infra"
    assert len(classes.infra) == 18 and {"InstantFailure", "Ungraded", "NoModelOutput"} <= classes.infra


@pytest.mark.parametrize(("exception_type", "qualified", "kind"), [
    ("BadRequestError", "litellm.BadRequestError", "benign"),  # litellm's: the model's context overflow
    ("BadRequestError", "litellm.exceptions.BadRequestError", "benign"),
    ("BadRequestError", "daytona_api_client.exceptions.BadRequestError", "infra"),  # a sandbox SDK's
    ("BadRequestError", None, "infra"),  # nothing says whose: not explicitly the model's
    ("daytona.common.errors.DaytonaError", "daytona.common.errors.DaytonaError", "infra"),
    ("harbor.llms.ContextLengthExceededError", "harbor.llms.ContextLengthExceededError", "benign"),
])
def test_a_qualified_model_failure_matches_only_its_package(exception_type: str, qualified: str | None,
                                                            kind: str) -> None:
    classes = load_catalog().error_classes
    assert classes.classify(exception_type, has_reward=True, qualified=qualified) == kind


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


def test_a_config_yaml_path_is_refused_at_its_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Path doubling (RULES §9): the job script prepends its configs dir to the name."""
    (tmp_path / "presets.yaml").write_text(
        "presets:\n  bfcl:\n    dataset: DCAgent2/bfcl-parity\n    n_concurrent: 32\n"
        "    config_yaml: /home/me/eval/configs/dcagent_eval_config_no_override.yaml\n"
    )
    monkeypatch.setenv(CATALOG_DIR_ENV, str(tmp_path))
    with pytest.raises(SpecErrors) as caught:
        load_catalog()
    [error] = [str(e) for e in caught.value.errors]
    assert error.startswith(f"{tmp_path / 'presets.yaml'}:5:18: presets.bfcl.config_yaml: must be a bare file name")
    assert "doubled" in error


@pytest.mark.parametrize(("extra_args", "message"), [
    ("--enable-prefix-caching --tool-call-parser hermes", "sets --tool-call-parser, which has its own field: write "
                                                          "`tool_call_parser`"),
    ("--chat-template=${DCFT}/t.jinja", "does not expand variables"),
    ("--override-generation-config '{\"temperature\":0.6}", "close the quote"),
])
def test_extra_args_cannot_smuggle_what_has_a_field(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    extra_args: str, message: str) -> None:
    (tmp_path / "model_registry.yaml").write_text(
        f"models:\n  org/m-8B:\n    serving:\n      extra_args: {json.dumps(extra_args)}\n")
    monkeypatch.setenv(CATALOG_DIR_ENV, str(tmp_path))
    with pytest.raises(SpecErrors) as caught:
        load_catalog()
    [error] = [str(e) for e in caught.value.errors]
    assert error.startswith(f"{tmp_path / 'model_registry.yaml'}:4:19: models.org/m-8B.serving.extra_args: ")
    assert message in error


def test_a_registry_pattern_harnesses_do_not_know_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "model_registry.yaml").write_text(
        "models:\n  org/m-8B:\n    serving:\n      patterns:\n        toolcalls: {tool_call_parser: hermes}\n")
    monkeypatch.setenv(CATALOG_DIR_ENV, str(tmp_path))
    with pytest.raises(SpecErrors) as caught:
        load_catalog()
    assert [str(e) for e in caught.value.errors] == [
        f"{tmp_path / 'model_registry.yaml'}:5:9: unknown serving pattern toolcalls; harnesses.yaml knows text, sera, "
        "tool_calls, native_coder"]


def test_a_pattern_serving_overrides_the_entry_field_by_field() -> None:
    serving = ModelServing.model_validate({"tool_call_parser": "hermes", "swap_space": 16,
                                           "patterns": {"text": {"tool_call_parser": None}}})
    assert (serving.for_pattern("text").tool_call_parser, serving.for_pattern("text").swap_space) == (None, 16)
    assert serving.for_pattern("sera").tool_call_parser == "hermes"
    assert serving.where("text", "tool_call_parser") == ("patterns", "text", "tool_call_parser")
    assert serving.where("sera", "tool_call_parser") == ("tool_call_parser",)
