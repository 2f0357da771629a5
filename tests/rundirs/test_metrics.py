"""core.metrics: accuracy with errored trials as 0, sample stderr from sums, None on empty dirs."""

from __future__ import annotations

import math
import statistics
from datetime import UTC, datetime
from pathlib import Path

import pytest

from controller.adapters.rundirs.harbor import HarborRunDirs
from controller.core.metrics import run_metrics
from controller.core.types import RunDirFacts
from tests.fixtures.harbor_dirs import REFERENCE_ERRORS, write_trial


def facts_for(rewards: list[float], n_infra_errors: int = 0) -> RunDirFacts:
    return RunDirFacts(run_tag="r", path="/r", n_completed=len(rewards) + n_infra_errors, n_infra_errors=n_infra_errors,
                       reward_sum=sum(rewards), reward_sq_sum=sum(r * r for r in rewards))


def test_errored_trials_count_as_zero_and_infra_is_excluded(tmp_path: Path) -> None:
    run = tmp_path / "r"
    write_trial(run, "a__aaaaaaa", reward=1.0)
    write_trial(run, "b__bbbbbbb", reward=1.0)
    write_trial(run, "c__ccccccc", reward=0.0, exception="AgentTimeoutError")
    write_trial(run, "d__ddddddd", exception="RewardFileNotFoundError")  # no reward: a 0
    write_trial(run, "e__eeeeeee", exception="DaytonaError")  # infra: not a valid trial
    (facts,) = HarborRunDirs(str(tmp_path), REFERENCE_ERRORS).observe()
    result = run_metrics(facts, REFERENCE_ERRORS)
    values = {m.name: m.value for m in result.metrics}
    assert values["accuracy"] == 0.5 and result.score == 0.5
    assert values["n_valid_trials"] == 4
    assert values["accuracy_stderr"] == pytest.approx(statistics.stdev([1, 1, 0, 0]) / math.sqrt(4))
    assert result.stats.n_trials == 4 and result.stats.n_infra_errors == 1
    infra = sorted(REFERENCE_ERRORS.infra)
    assert result.stats.infra_error_breakdown == {name: int(name == "DaytonaError") for name in infra}
    assert result.stats.n_errors_by_class["RewardFileNotFoundError"] == 1
    assert set(result.stats.n_errors_by_class) == set(REFERENCE_ERRORS.known) | {"RewardFileNotFoundError"}


@pytest.mark.parametrize("rewards", [[0.0, 1.0, 1.0, 0.25, 0.5, 0.0, 1.0], [1.0] * 10, [0.3, 0.9]])
def test_stderr_matches_the_textbook_formula(rewards: list[float]) -> None:
    result = run_metrics(facts_for(rewards), REFERENCE_ERRORS)
    values = {m.name: m.value for m in result.metrics}
    assert values["accuracy"] == pytest.approx(statistics.fmean(rewards))
    assert values["accuracy_stderr"] == pytest.approx(statistics.stdev(rewards) / math.sqrt(len(rewards)), abs=1e-12)


def test_empty_dir_scores_none() -> None:
    result = run_metrics(facts_for([]), REFERENCE_ERRORS)
    assert result.score is None
    assert [(m.name, m.value) for m in result.metrics] == [
        ("accuracy", None), ("accuracy_stderr", None), ("n_valid_trials", 0.0)]
    assert result.stats.infra_error_breakdown == dict.fromkeys(sorted(REFERENCE_ERRORS.infra), 0)


def test_only_infra_errors_scores_none() -> None:
    assert run_metrics(facts_for([], n_infra_errors=3), REFERENCE_ERRORS).score is None


def test_single_trial_has_score_but_no_stderr() -> None:
    values = {m.name: m.value for m in run_metrics(facts_for([1.0]), REFERENCE_ERRORS).metrics}
    assert (values["accuracy"], values["accuracy_stderr"]) == (1.0, None)


def test_upload_carries_a_list_and_the_stats_dict() -> None:
    ended = datetime(2026, 11, 29, tzinfo=UTC)
    upload = run_metrics(facts_for([1.0, 0.0]), REFERENCE_ERRORS).upload(ended_at=ended, is_overlong=True)
    assert [m.name for m in upload.metrics] == ["accuracy", "accuracy_stderr", "n_valid_trials"]
    assert upload.n_trials == 2 and upload.ended_at == ended and upload.is_overlong
    assert set(upload.stats) == {"n_trials", "n_infra_errors", "infra_error_breakdown", "n_errors_by_class"}
