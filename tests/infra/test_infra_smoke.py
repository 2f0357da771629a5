"""Smoke tests of the test infrastructure itself: the real SLURM cluster and eval/slurm/eval_harbor.sbatch
running real Harbor (host environment plugin, tiny 4-task dataset) under it, including a resume after scancel."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]

SBATCH_SCRIPT = REPO / "eval" / "slurm" / "eval_harbor.sbatch"
DATASET = "eval/harbor/tiny-dataset"  # relative to the submit dir (REPO), as a user would pass it
TASKS = {"pass", "fail", "noreward", "slow"}
FINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED")
META_KEYS = {"MODEL", "REPO_ID", "SLURM_JOB_ID", "DB_JOB_ID", "BENCHMARK_ID", "N_CONCURRENT", "N_ATTEMPTS",
             "AGENT_NAME", "TIMEOUT_MULTIPLIER", "BENCHMARK_NAME", "RESUME_COUNT", "SHARD"}


def run(args: list[str], env: dict[str, str], check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, env=env, cwd=REPO, capture_output=True, text=True, check=check, timeout=60,
                          stdin=subprocess.DEVNULL)


def sacct_state(job_id: str, env: dict[str, str]) -> str:
    out = run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State"], env, check=False).stdout.split()
    return out[0] if out else ""  # "CANCELLED by 0" -> "CANCELLED"


def wait_final(job_id: str, env: dict[str, str], timeout: float) -> str:
    return poll(lambda: (s := sacct_state(job_id, env)) in FINAL and s, timeout, what=f"job {job_id} to end")


def job_output(path: Path) -> str:
    """What a job printed, for a failed assertion: it may never have started."""
    return path.read_text() if path.exists() else f"(no {path.name}: the job never started)"


def submit_eval(env: dict[str, str], out_dir: Path, jobs_dir: Path, run_tag: str, **extra: str) -> str:
    exports = {"EVAL_JOBS_DIR": str(jobs_dir), "EVAL_N_CONCURRENT": "2", "EVAL_N_ATTEMPTS": "1",
               "EVAL_DB_JOB_ID": f"db-{run_tag}", **extra}
    export = "ALL," + ",".join(f"{k}={v}" for k, v in exports.items())
    proc = run(["sbatch", "--parsable", f"--job-name={run_tag}", "--time=10", f"--output={out_dir}/%x_%j.out",
                f"--export={export}", str(SBATCH_SCRIPT), "org/tiny-model", DATASET, "bench-1", run_tag],
               {**env, "EVAL_SECRET_TOKEN": "s3cr3t-never-printed"})
    return proc.stdout.strip().split(";")[0]


def poll(check: Callable[[], object], timeout: float, what: str) -> object:
    """Call check() every 0.2 s until it returns something truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}", pytrace=False)
        time.sleep(0.2)
    return value


def trial_results(run_dir: Path) -> dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text()) for p in run_dir.glob("*/result.json")}


def test_sinfo_and_sacct(slurm_env: dict[str, str], tmp_path: Path) -> None:
    line = run(["sinfo", "-h", "-o", "%P %a %T"], slurm_env).stdout.split()
    assert line[:2] == ["debug*", "up"] and line[2] in {"idle", "mixed", "allocated", "completing"}, line
    job = run(["sbatch", "--parsable", "-J", "smoke", "-t", "1", "-o", f"{tmp_path}/%x-%j.out",
               "--wrap", "echo hi"], slurm_env).stdout.strip()
    assert wait_final(job, slurm_env, 60) == "COMPLETED"
    # accounting lags: a job is absent from sacct until it starts, and a very short one can briefly be listed
    # as JobName "allocation" before its start record lands; so poll for the full row
    row = lambda: run(["sacct", "-n", "-X", "-P", "-j", job, "-o", "JobID,JobName,State,ExitCode"],  # noqa: E731
                      slurm_env).stdout.strip()
    poll(lambda: row() == f"{job}|smoke|COMPLETED|0:0", 30, what=f"sacct row of job {job}")


def test_eval_harbor_sbatch_completes(slurm_env: dict[str, str], eval_env: Path, tmp_path: Path) -> None:
    jobs_dir = tmp_path / "jobs"
    job = submit_eval(slurm_env, tmp_path, jobs_dir, "smoke-run")
    assert wait_final(job, slurm_env, 180) == "COMPLETED", job_output(tmp_path / f"smoke-run_{job}.out")

    run_dir = jobs_dir / "smoke-run"
    meta = dict(line.split("=", 1) for line in (run_dir / "meta.env").read_text().splitlines())
    assert set(meta) == META_KEYS
    assert meta["SLURM_JOB_ID"] == job and meta["BENCHMARK_NAME"] == "tiny-dataset" and meta["RESUME_COUNT"] == "0"
    assert (run_dir / "config.json").is_file()
    result = json.loads((run_dir / "result.json").read_text())
    assert result["finished_at"] and result["n_total_trials"] == 4
    trials = trial_results(run_dir)
    assert {t["task_name"] for t in trials.values()} == TASKS
    exc = {t["task_name"]: (t["exception_info"] or {}).get("exception_type") for t in trials.values()}
    assert exc == {"pass": None, "fail": None, "noreward": "RewardFileNotFoundError", "slow": "AgentTimeoutError"}
    # secrets travel by environment only: nothing the job wrote may contain one
    leaked = run(["grep", "-rl", "s3cr3t-never-printed", str(tmp_path)], slurm_env, check=False).stdout
    assert leaked == ""


def test_eval_harbor_resume_after_scancel(slurm_env: dict[str, str], eval_env: Path, tmp_path: Path) -> None:
    jobs_dir, tag = tmp_path / "jobs", "resume-run"
    run_dir = jobs_dir / tag
    # timeout x2: the "slow" task's agent now runs 6 s, long enough to cancel the job while it is in flight
    job = submit_eval(slurm_env, tmp_path, jobs_dir, tag, EVAL_TIMEOUT_MULTIPLIER="2")
    poll(lambda: len(trial_results(run_dir)) >= 3, 120, what="3 finished trials")
    run(["scancel", job], slurm_env)
    assert wait_final(job, slurm_env, 60) == "CANCELLED"
    before = {name: t["id"] for name, t in trial_results(run_dir).items()
              if (t["exception_info"] or {}).get("exception_type") != "CancelledError"}
    assert len(before) >= 3
    assert json.loads((run_dir / "result.json").read_text())["finished_at"] is None

    job2 = submit_eval(slurm_env, tmp_path, jobs_dir, tag, EVAL_TIMEOUT_MULTIPLIER="2",
                       EVAL_RESUME="1", EVAL_RESUME_COUNT="1")
    assert wait_final(job2, slurm_env, 180) == "COMPLETED", job_output(tmp_path / f"{tag}_{job2}.out")
    after = trial_results(run_dir)
    assert {t["task_name"] for t in after.values()} == TASKS and len(after) == 4
    assert all(after[name]["id"] == tid for name, tid in before.items()), "a finished trial was re-run"
    assert json.loads((run_dir / "result.json").read_text())["finished_at"]
    meta = (run_dir / "meta.env").read_text()
    assert f"SLURM_JOB_ID={job2}\n" in meta and "RESUME_COUNT=1\n" in meta


def test_slurmctld_stop_start(slurm_lab_alone: dict[str, str]) -> None:
    slurm_env = slurm_lab_alone
    ctl = ["bash", str(REPO / "scripts" / "slurmctld.sh")]
    try:
        run([*ctl, "stop"], slurm_env)
        assert run([*ctl, "status"], slurm_env, check=False).returncode == 1
        assert "is DOWN" in run(["scontrol", "ping"], slurm_env, check=False).stdout
    finally:
        run([*ctl, "start"], slurm_env)
    assert "is UP" in run(["scontrol", "ping"], slurm_env).stdout
    assert run(["sinfo", "-h", "-o", "%a"], slurm_env).stdout.strip() == "up"


