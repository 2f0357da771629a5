"""specs/demo/fake_harbor.py run as a real subprocess, read back through HarborRunDirs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

from controller.adapters.rundirs.harbor import HarborRunDirs
from controller.core.health import count_instant_failures, is_dead_launch
from controller.core.observed import RunDirFacts
from controller.core.trial_errors import INSTANT_FAILURE
from tests.fixtures.harbor_dirs import REFERENCE_ERRORS

FAKE = Path(__file__).resolve().parents[2] / "specs" / "demo" / "fake_harbor.py"
MODEL = "laion/Qwen3-8B"
DEADLINE_S = 30.0


def fake_env(jobs: Path, **extra: object) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EVAL_", "FAKE_HARBOR_"))}
    env |= {"EVAL_JOBS_DIR": str(jobs), "EVAL_N_ATTEMPTS": "2", "EVAL_N_CONCURRENT": "4",
            "EVAL_AGENT_NAME": "terminus-2", "EVAL_TIMEOUT_MULTIPLIER": "2.0", "EVAL_DB_JOB_ID": "row-1",
            "FAKE_HARBOR_TRIAL_SECONDS": "0"}
    return env | {k: str(v) for k, v in extra.items()}


def run_fake(jobs: Path, run_tag: str = "run", model: str = MODEL, dataset: str = "DCAgent2/terminal_bench_2",
             **extra: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(FAKE), model, dataset, "tb2", run_tag], check=False, env=fake_env(jobs, **extra),
                          capture_output=True, text=True, timeout=DEADLINE_S)


def start_fake(jobs: Path, run_tag: str = "run", **extra: object) -> subprocess.Popen[bytes]:
    return subprocess.Popen([str(FAKE), MODEL, "DCAgent2/terminal_bench_2", "tb2", run_tag],
                            env=fake_env(jobs, **extra), start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def observe(jobs: Path) -> dict[str, RunDirFacts]:
    return {f.run_tag: f for f in HarborRunDirs(str(jobs), REFERENCE_ERRORS).observe()}


def poll(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def trial_dirs(run: Path) -> set[str]:
    return {p.name for p in run.iterdir() if p.is_dir() and "__" in p.name} if run.is_dir() else set()


def finished_trials(run: Path) -> set[str]:
    return {name for name in trial_dirs(run) if (run / name / "result.json").is_file()}


def exception_type(trial: Path) -> str | None:
    return (json.loads((trial / "result.json").read_text())["exception_info"] or {}).get("exception_type")


def job_result(run: Path) -> dict:
    return json.loads((run / "result.json").read_text())


def test_fresh_run_completes_and_matches_harbor_stats(tmp_path: Path) -> None:
    proc = run_fake(tmp_path)
    assert proc.returncode == 0, proc.stderr
    run = tmp_path / "run"
    facts = observe(tmp_path)["run"]
    result = job_result(run)
    assert result["finished_at"] is not None and facts.finished_at is not None
    assert facts.n_total == facts.n_completed == facts.n_trial_dirs == 16  # 8 tasks x 2 attempts
    assert (facts.model, facts.dataset, facts.benchmark_name, facts.agent) == (
        MODEL, "DCAgent2/terminal_bench_2", "terminal_bench_2", "terminus-2")
    assert (facts.timeout_multiplier, facts.fires, facts.has_config, facts.has_result) == (2.0, 1, True, True)
    (evals,) = result["stats"]["evals"].values()  # Harbor's own bookkeeping, an independent count
    exceptions = {k: len(v) for k, v in evals["exception_stats"].items()}
    assert facts.n_scored == evals["n_trials"]
    assert facts.n_infra_errors == exceptions.get("DaytonaError", 0) < 10
    assert facts.n_benign_errors == exceptions.get("AgentTimeoutError", 0)
    assert result["stats"]["n_errored_trials"] == facts.n_infra_errors + facts.n_benign_errors
    assert facts.reward_sum == sum(float(v) * len(names) for v, names in evals["reward_stats"]["reward"].items())
    trial = json.loads((run / sorted(finished_trials(run))[0] / "result.json").read_text())
    assert trial["agent_info"]["model_info"]["name"].isdigit()  # vLLM's served id, never the model name
    config = json.loads((run / "config.json").read_text())
    assert config["agents"][0]["model_name"] == f"hosted_vllm/{MODEL}"
    assert config["orchestrator"]["n_concurrent_trials"] == 4
    assert all(len(name.split("__")[1]) == 7 for name in trial_dirs(run))
    # every demo trial produced tokens: none is taken for an instant failure (launch health), all started
    assert (facts.quiet_failures, facts.n_started_trials, facts.api_base) == ((), 16, "http://localhost:8000/v1")


def test_trials_call_the_leased_pinggy_url_as_the_sbatch_wires_it(tmp_path: Path) -> None:
    assert run_fake(tmp_path, EVAL_PINGGY_URL="https://pair-1.a.pinggy.link/").returncode == 0
    assert observe(tmp_path)["run"].api_base == "https://pair-1.a.pinggy.link/v1"


def test_instant_fail_writes_every_trial_as_harbor_records_an_unreachable_model(tmp_path: Path) -> None:
    proc = run_fake(tmp_path, FAKE_HARBOR_INSTANT_FAIL=1, FAKE_HARBOR_INFRA_ERRORS=3)
    assert proc.returncode == 0, proc.stderr
    run = tmp_path / "run"
    trials = sorted(finished_trials(run))
    assert len(trials) == 16
    for name in trials:
        result = json.loads((run / name / "result.json").read_text())
        assert result["exception_info"]["exception_type"] == "APIConnectionError", name  # the knob beats the others
        assert result["exception_info"]["exception_message"].startswith("litellm.APIConnectionError"), name
        assert result["agent_result"]["n_output_tokens"] is None and result["verifier_result"] is None, name
        execution = result["agent_execution"]
        assert execution["started_at"] <= execution["finished_at"] <= result["finished_at"], name
        assert not (run / name / "verifier" / "reward.txt").exists() and not any((run / name / "agent").iterdir())
    (evals,) = job_result(run)["stats"]["evals"].values()
    assert (evals["n_trials"], evals["n_errors"], list(evals["exception_stats"])) == (0, 16, ["APIConnectionError"])
    facts = observe(tmp_path)["run"]
    assert (facts.n_completed, facts.n_scored, facts.n_started_trials, facts.finished_at is not None) == (16, 0, 16, True)
    assert [q.exception_type for q in facts.quiet_failures] == ["APIConnectionError"] * 16
    assert all(q.agent_seconds is not None and q.agent_seconds < 1 and q.reward is None for q in facts.quiet_failures)
    counted = count_instant_failures(facts, timedelta(seconds=10))
    assert is_dead_launch(counted) and counted.error_breakdown.get(INSTANT_FAILURE) == 16


def test_api_base_overrides_the_url_the_pinggy_pair_would_give(tmp_path: Path) -> None:
    proc = run_fake(tmp_path, EVAL_PINGGY_URL="https://pair-1.a.pinggy.link", FAKE_HARBOR_API_BASE="http://10.1.2.3:8000/v1")
    assert proc.returncode == 0, proc.stderr
    run = tmp_path / "run"
    assert observe(tmp_path)["run"].api_base == "http://10.1.2.3:8000/v1"
    assert json.loads((run / "config.json").read_text())["agents"][0]["kwargs"]["api_base"] == "http://10.1.2.3:8000/v1"


def test_print_goes_to_stdout_before_anything_else_and_nothing_is_printed_by_default(tmp_path: Path) -> None:
    line = "Error: A tunnel with the same token (xyz) is already active."
    printed = run_fake(tmp_path / "a", FAKE_HARBOR_PRINT=line, FAKE_HARBOR_EXIT_CODE=7)
    assert (printed.returncode, printed.stdout) == (7, f"{line}\n"), "printed even by a job that exits at once"
    assert trial_dirs(tmp_path / "a" / "run") == set()
    proc = subprocess.Popen([str(FAKE), MODEL, "DCAgent2/terminal_bench_2", "tb2", "run"], start_new_session=True,
                            env=fake_env(tmp_path / "b", FAKE_HARBOR_PRINT=line, FAKE_HARBOR_HANG_AFTER=0),
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == f"{line}\n", "flushed while the job runs"
        poll(lambda: (tmp_path / "b" / "run" / "result.json").exists(), "the job result")
        assert proc.poll() is None and trial_dirs(tmp_path / "b" / "run") == set()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=DEADLINE_S)
        proc.stdout.close()
    assert run_fake(tmp_path / "c").stdout == ""


def test_scores_are_stable_per_model_and_differ_across_models(tmp_path: Path) -> None:
    for tag, model in (("a", MODEL), ("b", MODEL), ("c", "Qwen/Qwen3-32B")):
        assert run_fake(tmp_path, tag, model, FAKE_HARBOR_TASKS=40).returncode == 0
    facts = observe(tmp_path)
    assert facts["a"].reward_sum == facts["b"].reward_sum != facts["c"].reward_sum
    assert facts["a"].error_breakdown == facts["b"].error_breakdown


def test_dataset_directory_gives_the_tasks(tmp_path: Path) -> None:
    dataset = tmp_path / "tiny-dataset"
    for task in ("pass", "fail", "a-very-long-task-name-that-exceeds-thirty-two-chars"):
        (dataset / task).mkdir(parents=True)
    assert run_fake(tmp_path / "jobs", dataset=str(dataset), EVAL_N_ATTEMPTS=1).returncode == 0
    names = trial_dirs(tmp_path / "jobs" / "run")
    assert {n.split("__")[0] for n in names} == {"pass", "fail", "a-very-long-task-name-that-excee"}
    assert observe(tmp_path / "jobs")["run"].benchmark_name == "tiny-dataset"


def test_resume_reruns_only_infra_and_unfinished_trials(tmp_path: Path) -> None:
    assert run_fake(tmp_path, FAKE_HARBOR_INFRA_ERRORS=11).returncode == 0
    run = tmp_path / "run"
    assert observe(tmp_path)["run"].n_infra_errors == 11
    infra = {n for n in finished_trials(run) if exception_type(run / n) == "DaytonaError"}
    interrupted = sorted(finished_trials(run) - infra)[0]
    (run / interrupted / "result.json").unlink()  # as if the job was killed mid-trial
    kept = trial_dirs(run) - infra - {interrupted}
    config_before = (run / "config.json").read_bytes()

    proc = run_fake(tmp_path, EVAL_RESUME=1, EVAL_RESUME_COUNT=1, FAKE_HARBOR_INFRA_ERRORS=11)

    assert proc.returncode == 0, proc.stderr
    after = trial_dirs(run)
    assert kept <= after and not (infra | {interrupted}) & after
    assert len(after - kept) == len(infra) + 1
    assert (run / "config.json").read_bytes() == config_before
    assert "RESUME_COUNT=1\n" in (run / "meta.env").read_text()
    facts = observe(tmp_path)["run"]
    assert (facts.n_completed, facts.n_total, facts.n_infra_errors, facts.fires) == (16, 16, 0, 2)
    assert facts.finished_at is not None


def test_fresh_run_refuses_an_existing_job_dir(tmp_path: Path) -> None:
    assert run_fake(tmp_path).returncode == 0
    assert run_fake(tmp_path).returncode == 3


def test_exit_code_leaves_an_early_kill_dir(tmp_path: Path) -> None:
    assert run_fake(tmp_path, FAKE_HARBOR_EXIT_CODE=7).returncode == 7
    facts = observe(tmp_path)["run"]
    assert (facts.has_config, facts.has_result, facts.n_trial_dirs, facts.fires) == (True, False, 0, 1)


def test_hang_after_n_trials_leaves_finished_at_null(tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = start_fake(tmp_path, FAKE_HARBOR_HANG_AFTER=3)
    try:
        poll(lambda: len(finished_trials(run)) >= 3, "3 finished trials")
        poll(lambda: job_result(run)["stats"]["n_completed_trials"] == 3, "the job result to count 3")
        assert proc.poll() is None
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=DEADLINE_S)
    assert proc.returncode == 128 + signal.SIGTERM
    facts = observe(tmp_path)["run"]
    assert (facts.n_completed, facts.n_trial_dirs, facts.n_total, facts.finished_at) == (3, 3, 16, None)


def test_write_after_kill_keeps_adding_trial_dirs(tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = start_fake(tmp_path, FAKE_HARBOR_TASKS=2, EVAL_N_ATTEMPTS=1, FAKE_HARBOR_TRIAL_SECONDS=0.2,
                      FAKE_HARBOR_WRITE_AFTER_KILL=3)
    try:
        poll(lambda: len(finished_trials(run)) >= 1, "a finished trial")
        at_kill = finished_trials(run)  # the next trial needs 0.2 s more, the kill lands well before
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=DEADLINE_S)
    assert proc.returncode == 128 + signal.SIGTERM
    poll(lambda: len(finished_trials(run) - at_kill) >= 3, "3 trials written after the kill")
    facts = observe(tmp_path)["run"]
    assert facts.finished_at is None
    assert facts.n_completed > facts.n_total == 2  # the settling shape


def test_shards_run_disjoint_task_subsets_that_cover_the_dataset_and_resume_their_own(tmp_path: Path) -> None:
    """EVAL_SHARD=i/K (the job contract): the i-th of every K tasks, as the sbatch picks them; a resume runs the
    subset its config.json holds, whatever EVAL_SHARD says then."""
    jobs = tmp_path / "jobs"
    for run_tag, shard in (("whole", ""), ("s0", "0/3"), ("s1", "1/3"), ("s2", "2/3")):  # no infra error: its cap
        done = run_fake(jobs, run_tag, FAKE_HARBOR_TASKS=8, FAKE_HARBOR_INFRA_ERRORS=0, EVAL_SHARD=shard)  # is per job
        assert done.returncode == 0, done.stderr
    seen = observe(jobs)
    shards = [set(seen[tag].tasks) for tag in ("s0", "s1", "s2")]
    assert shards == [{"task-000", "task-003", "task-006"}, {"task-001", "task-004", "task-007"},
                      {"task-002", "task-005"}]
    assert set(seen["whole"].tasks) == set().union(*shards)
    for tag in ("s0", "s1", "s2"):  # the same trials as the unsharded run: same counts and rewards per task
        assert all(seen[tag].tasks[task] == seen["whole"].tasks[task] for task in seen[tag].tasks)
        assert seen[tag].n_total == len(seen[tag].tasks) * 2
    assert "SHARD=1/3\n" in (jobs / "s1" / "meta.env").read_text()

    for trial in trial_dirs(jobs / "s1"):
        if trial.startswith("task-004"):
            (jobs / "s1" / trial / "result.json").unlink()
    assert run_fake(jobs, "s1", FAKE_HARBOR_TASKS=8, EVAL_RESUME="1", EVAL_SHARD="").returncode == 0
    assert set(observe(jobs)["s1"].tasks) == {"task-001", "task-004", "task-007"}


def test_a_shard_outside_the_contract_exits_2_and_writes_nothing(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    for shard, says in (("2/2", "EVAL_SHARD must be i/K with 0 <= i < K"), ("1/x", "EVAL_SHARD must be i/K"),
                        ("5/9", "EVAL_SHARD=5/9 selects no task: DCAgent2/terminal_bench_2 has 4")):
        done = run_fake(jobs, "bad", FAKE_HARBOR_TASKS=4, EVAL_SHARD=shard)
        assert (done.returncode, says in done.stderr) == (2, True), done.stderr
    assert not (jobs / "bad").exists()
