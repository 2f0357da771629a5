"""HarborRunDirs over real files: hand-built legacy shapes, local paths, file:// and memory:// URLs."""

from __future__ import annotations

import os
import re
import time
from datetime import UTC, datetime
from pathlib import Path

import fsspec
import pytest

from controller.adapters.rundirs.harbor import HarborRunDirs
from controller.adapters.rundirs.harbor_format import model_from_harbor, parse_meta_env, parse_time
from controller.adapters.rundirs.tree import LocalTree
from controller.core.observed import RunDirFacts
from controller.core.ports import JobsDirMissing, ObservationError
from tests.fixtures.harbor_dirs import (
    REFERENCE_ERRORS,
    write_config,
    write_job_result,
    write_meta_env,
    write_synthetic_run_dir,
    write_trial,
)


def observe(jobs_dir: Path | str) -> dict[str, RunDirFacts]:
    return {f.run_tag: f for f in HarborRunDirs(str(jobs_dir), REFERENCE_ERRORS).observe()}


def build_legacy(run_dir: Path) -> None:
    """Old-Harbor dir: legacy stats spelling, one trial of each outcome, and an unfinished trial."""
    write_config(run_dir, model="hosted_vllm/laion/Qwen3-8B", dataset="/scratch/datasets/terminal_bench_2")
    write_job_result(run_dir, n_total=8, legacy_stats=True, n_completed=5, n_errored=3)
    write_trial(run_dir, "pass__aaaaaaa", reward=1.0)
    write_trial(run_dir, "fail__bbbbbbb", reward=0.0)
    write_trial(run_dir, "slow__ccccccc", reward=0.0, exception="AgentTimeoutError")
    write_trial(run_dir, "noreward__ddddddd", exception="RewardFileNotFoundError")
    write_trial(run_dir, "sandbox__eeeeeee", exception="DaytonaError")
    write_trial(run_dir, "running__fffffff", result=False)


def build_torn(run_dir: Path) -> Path:
    """A finished dir of the old listener's whose last trial result was cut off mid-write; returns that file."""
    write_config(run_dir, model="hosted_vllm/laion/Qwen3-8B", dataset="/scratch/datasets/terminal_bench_2")
    write_job_result(run_dir, n_total=2, n_completed=2)
    write_trial(run_dir, "pass__aaaaaaa", reward=1.0)
    torn = write_trial(run_dir, "torn__ggggggg", result=False) / "result.json"
    torn.write_text('{"task_name": "torn", "verif')
    return torn


def test_legacy_dir_exact_counts(tmp_path: Path) -> None:
    build_legacy(tmp_path / "legacy")
    facts = observe(tmp_path)["legacy"]
    assert (facts.n_trial_dirs, facts.n_completed, facts.n_scored) == (6, 5, 3)
    # closed classes: 2 graded, the timeout with a reward is the model's, the unknown class is infra with Daytona
    assert (facts.n_graded, facts.n_benign_errors, facts.n_infra_errors, facts.n_invalid) == (2, 1, 2, 0)
    assert facts.reward_sum == 1.0
    assert facts.tasks == {"pass": (1, 1, 1.0), "fail": (1, 1, 0.0), "slow": (1, 1, 0.0), "noreward": (1, 0, 0.0),
                           "sandbox": (1, 0, 0.0)}
    assert facts.model == "laion/Qwen3-8B"
    assert facts.dataset == "/scratch/datasets/terminal_bench_2"
    assert facts.benchmark_name == "terminal_bench_2"
    assert (facts.agent, facts.timeout_multiplier) == ("terminus-2", 2.0)
    assert (facts.has_config, facts.has_result, facts.n_total, facts.fires) == (True, True, 8, 1)
    assert not facts.no_resume and facts.unreadable == ""
    assert facts.finished_at is not None and facts.finished_at.tzinfo is not None
    assert facts.path == str(tmp_path / "legacy")


def test_a_torn_trial_result_is_unreadable_not_unfinished(tmp_path: Path) -> None:
    """Read as "not completed", the dir would be 1 of 2 done and uploaded as a partial score."""
    torn = build_torn(tmp_path / "legacy")
    facts = observe(tmp_path)["legacy"]
    assert facts.unreadable.startswith(f"{torn}: not JSON: Unterminated string")
    # what matching needs stays, so the old listener's dir still finds its cell; the numbers are not data
    assert (facts.model, facts.benchmark_name, facts.agent, facts.timeout_multiplier) == (
        "laion/Qwen3-8B", "terminal_bench_2", "terminus-2", 2.0)
    assert (facts.n_trial_dirs, facts.n_completed, facts.n_total, facts.has_result, facts.finished_at) == (
        0, 0, None, False, None)


def test_error_breakdown_lists_every_known_class(tmp_path: Path) -> None:
    build_legacy(tmp_path / "legacy")
    breakdown = observe(tmp_path)["legacy"].error_breakdown
    assert set(breakdown) == set(REFERENCE_ERRORS.known) | {"RewardFileNotFoundError"}
    assert {k: v for k, v in breakdown.items() if v} == {
        "AgentTimeoutError": 1, "DaytonaError": 1, "RewardFileNotFoundError": 1}


def test_agent_timeout_without_reward_is_infra(tmp_path: Path) -> None:
    write_trial(tmp_path / "r", "t__aaaaaaa", exception="AgentTimeoutError")  # never graded: not the model's 0
    write_trial(tmp_path / "r", "t__bbbbbbb", exception="ContextLengthExceededError")  # benign without reward
    facts = observe(tmp_path)["r"]
    assert (facts.n_benign_errors, facts.n_infra_errors, facts.n_graded, facts.n_scored) == (1, 1, 0, 0)
    assert facts.error_breakdown["AgentTimeoutError"] == 1
    assert facts.tasks == {"t": (2, 1, 0.0)} and facts.reward_sum == 0.0, "the model's failure scores a 0"


def test_infra_trial_reward_stays_out_of_the_sums(tmp_path: Path) -> None:
    write_trial(tmp_path / "r", "t__aaaaaaa", reward=1.0, exception="VerificationNotCompletedError")
    write_trial(tmp_path / "r", "t__bbbbbbb", reward=1.0)
    facts = observe(tmp_path)["r"]
    assert (facts.n_scored, facts.n_infra_errors, facts.reward_sum) == (2, 1, 1.0)


def test_early_kill_meta_env_only(tmp_path: Path) -> None:
    write_meta_env(tmp_path / "early", MODEL="Qwen/Qwen3-32B", REPO_ID="DCAgent/dev_set_v2",
                   BENCHMARK_NAME="dev_set_v2", AGENT_NAME="terminus-2", TIMEOUT_MULTIPLIER=16.0, RESUME_COUNT=1)
    facts = observe(tmp_path)["early"]
    assert facts.model_dump(include={"model", "dataset", "benchmark_name", "agent", "timeout_multiplier"}) == {
        "model": "Qwen/Qwen3-32B", "dataset": "DCAgent/dev_set_v2", "benchmark_name": "dev_set_v2",
        "agent": "terminus-2", "timeout_multiplier": 16.0}
    assert (facts.has_config, facts.has_result, facts.n_total, facts.n_trial_dirs, facts.fires) == (
        False, False, None, 0, 2)
    assert facts.started_at is None and facts.last_progress_at is None


def test_meta_env_wins_for_model_and_benchmark(tmp_path: Path) -> None:
    run = tmp_path / "r"
    write_config(run, model="hosted_vllm/48213", dataset="/scratch/hf/snapshots/3f2a9c")
    (run / "meta.env").write_text('export MODEL="laion/Qwen3-8B-sft"\n# comment\nREPO_ID=DCAgent2/swebench\n'
                                  "BENCHMARK_NAME=swebench-verified-random-100-folders\ngarbage line\n")
    facts = observe(tmp_path)["r"]
    assert (facts.model, facts.dataset, facts.benchmark_name) == (
        "laion/Qwen3-8B-sft", "DCAgent2/swebench", "swebench-verified-random-100-folders")
    assert facts.fires == 1  # config.json but no RESUME_COUNT


def test_corrupt_config_is_unreadable(tmp_path: Path) -> None:
    run = tmp_path / "r"
    write_meta_env(run, MODEL="org/m")
    (run / "config.json").write_text("{not json")
    facts = observe(tmp_path)["r"]
    assert facts.unreadable.startswith(f"{run / 'config.json'}: not JSON: Expecting property name")
    assert facts.model == "org/m"  # meta.env still says which cell it is


@pytest.mark.parametrize("marker", ["empty", "text", "dir"])
def test_no_resume_is_a_marker_whatever_it_holds(tmp_path: Path, marker: str) -> None:
    run = tmp_path / "r"
    write_meta_env(run, MODEL="m", RESUME_COUNT=0)
    if marker == "dir":
        (run / ".no-resume").mkdir()
    else:
        (run / ".no-resume").write_text("" if marker == "empty" else "operator: keep as is\n")
    facts = observe(tmp_path)["r"]
    assert (facts.no_resume, facts.unreadable) == (True, "")


def test_settling_shape_more_completed_than_total(tmp_path: Path) -> None:
    write_synthetic_run_dir(tmp_path / "r", 5, n_total=3, finished=False)
    facts = observe(tmp_path)["r"]
    assert (facts.n_completed, facts.n_total, facts.finished_at) == (5, 3, None)


def test_last_progress_is_newest_trial_result_mtime(tmp_path: Path) -> None:
    run = tmp_path / "r"
    for name, mtime in (("a__aaaaaaa", 1_800_000_000), ("b__bbbbbbb", 1_800_000_500), ("c__ccccccc", 1_700_000_000)):
        os.utime(write_trial(run, name, reward=1.0) / "result.json", (mtime, mtime))
    assert observe(tmp_path)["r"].last_progress_at == datetime.fromtimestamp(1_800_000_500, UTC)


def test_synthetic_run_counts(tmp_path: Path) -> None:
    written = write_synthetic_run_dir(tmp_path / "s", 60, infra_every=7, benign_every=5, resume_count=1)
    facts = observe(tmp_path)["s"]
    assert (facts.n_completed, facts.n_scored, facts.n_infra_errors, facts.n_benign_errors) == (
        60, written.n_scored, written.n_infra, written.n_benign)
    assert facts.reward_sum == written.reward_sum
    assert facts.fires == 2


def test_ignores_files_and_hidden_dirs_in_jobs_dir(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / ".trash").mkdir()
    write_meta_env(tmp_path / "r", MODEL="m")
    (tmp_path / "r" / "post_eval_report.txt").write_text("x")
    assert list(observe(tmp_path)) == ["r"]
    assert observe(tmp_path)["r"].n_trial_dirs == 0


@pytest.mark.parametrize("where", ["local", "memory"])
def test_missing_jobs_dir_is_jobs_dir_missing_not_empty(tmp_path: Path, where: str) -> None:
    """Fresh or unmounted: read as empty, every finished cell would look "killed before any trial"."""
    jobs_dir = str(tmp_path / "nope") if where == "local" else "memory://no-such-jobs-dir"
    with pytest.raises(JobsDirMissing, match=f"^jobs dir {re.escape(jobs_dir)} does not exist"):
        HarborRunDirs(jobs_dir, REFERENCE_ERRORS).observe()


def test_unlistable_jobs_dir_raises(tmp_path: Path) -> None:
    (tmp_path / "jobs").write_text("a file, not a dir")
    with pytest.raises(ObservationError, match="cannot list jobs dir") as raised:
        observe(tmp_path / "jobs")
    assert not isinstance(raised.value, JobsDirMissing)  # it is there: something is wrong, not "nothing ran yet"


def test_run_dir_vanishing_mid_pass_is_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_meta_env(tmp_path / "r", MODEL="m")
    monkeypatch.setattr(LocalTree, "run_tags", lambda self: ["gone", "r"])
    assert list(observe(tmp_path)) == ["r"]


def test_memory_url_matches_local(tmp_path: Path) -> None:
    build_legacy(tmp_path / "legacy")
    build_torn(tmp_path / "torn")
    write_meta_env(tmp_path / "early", MODEL="m", RESUME_COUNT=0)
    (tmp_path / "legacy" / ".no-resume").touch()
    fs = fsspec.filesystem("memory")
    fs.put(str(tmp_path) + "/", "/jobs-rd-test/", recursive=True)
    try:
        remote = observe("memory://jobs-rd-test")
    finally:
        fs.rm("/jobs-rd-test", recursive=True)
    local = observe(tmp_path)
    assert remote.keys() == local.keys() == {"legacy", "torn", "early"}
    for tag in local:
        assert remote[tag].model_dump(exclude={"path", "last_progress_at", "unreadable"}) == local[tag].model_dump(
            exclude={"path", "last_progress_at", "unreadable"})
        assert remote[tag].unreadable == local[tag].unreadable.replace(str(tmp_path), "memory://jobs-rd-test")
    assert remote["torn"].unreadable.startswith("memory://jobs-rd-test/torn/torn__ggggggg/result.json: not JSON")
    assert remote["legacy"].path == "memory://jobs-rd-test/legacy"
    assert remote["legacy"].last_progress_at is not None


def test_file_url_uses_local_reader(tmp_path: Path) -> None:
    build_legacy(tmp_path / "legacy")
    via_url = observe(f"file://{tmp_path}")["legacy"]
    assert via_url == observe(tmp_path)["legacy"]


@pytest.fixture
def kolkata(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TZ", "Asia/Kolkata")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.mark.usefixtures("kolkata")
def test_naive_timestamps_are_local_time() -> None:
    assert parse_time("2026-11-29T13:33:23.227737") == datetime(2026, 11, 29, 8, 3, 23, 227737, tzinfo=UTC)
    assert parse_time("2026-11-29T13:33:23Z") == datetime(2026, 11, 29, 13, 33, 23, tzinfo=UTC)
    assert parse_time("yesterday") is None and parse_time(None) is None


@pytest.mark.usefixtures("kolkata")
def test_job_result_times_come_back_utc(tmp_path: Path) -> None:
    write_job_result(tmp_path / "r", n_total=1)  # started 2026-11-29T12:00:00 naive
    facts = observe(tmp_path)["r"]
    assert facts.started_at == datetime(2026, 11, 29, 6, 30, tzinfo=UTC)


@pytest.mark.parametrize(("name", "model"), [
    ("hosted_vllm/laion/Qwen3-8B", "laion/Qwen3-8B"),
    ("openai/Qwen/Qwen3-32B", "Qwen/Qwen3-32B"),
    ("hosted_vllm/Qwen3-8B", "hosted_vllm/Qwen3-8B"),
    ("Qwen/Qwen3-32B", "Qwen/Qwen3-32B"),
    ("gpt-5", "gpt-5"),
])
def test_model_prefix_goes_only_when_an_org_remains(name: str, model: str) -> None:
    assert model_from_harbor(name) == model


def test_meta_env_parsing() -> None:
    parsed = parse_meta_env(b"A=1\nexport B='two words'\n\n#C=3\nD=x=y\nnoise\n")
    assert parsed == {"A": "1", "B": "two words", "D": "x=y"}
