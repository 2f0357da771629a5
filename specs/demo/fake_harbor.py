#!/usr/bin/env python3
"""Fake Harbor: the job program of the local demo cluster (stdlib only).

Same contract as our sbatch scripts: `fake_harbor.py <model> <dataset> <benchmark_id> <run_tag>` with EVAL_JOBS_DIR,
EVAL_N_CONCURRENT, EVAL_N_ATTEMPTS, EVAL_AGENT_NAME, EVAL_TIMEOUT_MULTIPLIER, EVAL_RESUME ("1" = resume),
EVAL_RESUME_COUNT, EVAL_DB_JOB_ID, EVAL_PINGGY_URL, EVAL_SHARD. It writes `$EVAL_JOBS_DIR/<run_tag>/` in Harbor
0.25's layout (naive ISO timestamps) so the reconciler can be tested end to end without GPUs, vLLM or Daytona. Like
the sbatch, it points the agent's `api_base` at the leased pinggy URL when there is one (else at the local vLLM), so
the launch-health check of a pinggy cell finds it wired.

Tasks: the subdirectories of <dataset> when it is a directory, else FAKE_HARBOR_TASKS (default 8) tasks task-000...;
each run n_attempts times. EVAL_SHARD=i/K keeps the i-th of every K of them (in byte order), as the sbatch does,
records the subset as the dataset's task_names in config.json (a resume runs it again) and SHARD in meta.env.
Rewards are a deterministic hash of (model, benchmark, task, attempt). By default ~1 in 8 trials hit
AgentTimeoutError (graded, reward 0.0) and ~1 in 12 a DaytonaError (no reward), capped below the default infra
threshold of 10 and at 10% of the job's trials (the default upload.maxInfraErrorFraction), so a default run is
uploaded without a resume.

Fault modes (env): FAKE_HARBOR_TRIAL_SECONDS (0.05 per trial), FAKE_HARBOR_HANG_AFTER=N (hang after
N trials; N ≥ all trials: a zombie that hangs once every trial has a result), FAKE_HARBOR_EXIT_CODE=N (exit N
right after config.json), FAKE_HARBOR_INFRA_ERRORS=N
(exactly N infra errors on a fresh run, none on resume), FAKE_HARBOR_WRITE_AFTER_KILL=N (on SIGTERM
a detached child keeps writing N trial dirs, like Daytona sandboxes after a SLURM kill, one every
FAKE_HARBOR_LATE_TRIAL_SECONDS).

Launch-health modes (env; unset, the job behaves as above): FAKE_HARBOR_INSTANT_FAIL=1 (a dead launch: every
trial raises `litellm.APIConnectionError` at once, as Harbor records it when the served model is unreachable:
exception_info set, agent_result with null token counts, agent_execution finished as soon as it started, no
verifier and no reward; no benign or infra errors then), FAKE_HARBOR_API_BASE=URL (the agent's `api_base`, in the
job and trial configs, instead of the one derived from EVAL_PINGGY_URL: an unwired pinggy cell),
FAKE_HARBOR_PRINT=TEXT (printed to stdout, flushed, as the job starts, before its run dir and any trial: what a
tunnel or server started by the job would print; it comes before an exit of FAKE_HARBOR_EXIT_CODE too).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import signal
import string
import sys
import time
import uuid
from datetime import datetime
from pathlib import Path

# What our sbatch passes to `harbor jobs resume -f ...`: RULES §3 infra errors.
RESUME_FILTER = frozenset({
    "DaytonaError", "DaytonaAuthenticationError", "DaytonaAuthorizationError", "DaytonaNotFoundError",
    "DaytonaSandboxStopError", "DaytonaRateLimitError", "EnvironmentStartTimeoutError",
    "ServiceUnavailableError", "CancelledError", "SandboxBuildFailedError", "AgentKilledBySignalError",
    "AgentEnvironmentTimeoutError", "VerificationNotCompletedError", "TrialNotScoredError", "AddTestsDirError",
})
INFRA_CAP = 9  # hash-chosen infra errors stay under the default infraErrorThreshold (10)
INFRA_SHARE_CAP = 0.1  # ... and within the default upload.maxInfraErrorFraction of the job's trials
BENIGN_RATE = 1 / 8
INFRA_RATE = 1 / 12
# What Harbor records (ExceptionInfo.from_exception: the class name, str(exc)) when litellm cannot reach the server.
INSTANT_FAILURE = ("APIConnectionError", "litellm.APIConnectionError: Hosted_vllmException - Connection error.")


def now() -> str:
    return datetime.now().isoformat()  # naive local time, as Harbor writes it


def unit(*parts: object) -> float:
    """A deterministic number in [0, 1) from the parts."""
    digest = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def write_json(path: Path, doc: object) -> None:
    """Atomic, so a reader never sees half a document from us (real Harbor is not this careful)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(doc, indent=4))
    os.replace(tmp, path)


def api_base() -> str:
    """What the sbatch patches into the agent's kwargs: the leased pair's public URL, else the local vLLM
    (FAKE_HARBOR_API_BASE, when set, instead: a job that ignores its pair)."""
    override = os.environ.get("FAKE_HARBOR_API_BASE", "").strip()
    if override:
        return override
    pinggy = os.environ.get("EVAL_PINGGY_URL", "").strip().rstrip("/")
    return f"{pinggy}/v1" if pinggy else "http://localhost:8000/v1"


def env_int(name: str, default: int | None = None) -> int | None:
    value = os.environ.get(name, "").strip()
    return int(value) if value else default


class BadInput(Exception):
    """The job's arguments or environment break the contract: exit 2 before anything is written."""


class FakeJob:
    def __init__(self, model: str, dataset: str, benchmark_id: str, run_tag: str) -> None:
        self.model = model
        self.dataset = dataset
        self.benchmark_id = benchmark_id
        self.run_tag = run_tag
        self.run_dir = Path(os.environ["EVAL_JOBS_DIR"]) / run_tag
        self.n_attempts = env_int("EVAL_N_ATTEMPTS", 1)
        self.n_concurrent = env_int("EVAL_N_CONCURRENT", 1)
        self.agent = os.environ.get("EVAL_AGENT_NAME") or "terminus-2"
        self.timeout_multiplier = float(os.environ.get("EVAL_TIMEOUT_MULTIPLIER") or 1.0)
        self.trial_seconds = float(os.environ.get("FAKE_HARBOR_TRIAL_SECONDS") or 0.05)
        self.instant_fail = os.environ.get("FAKE_HARBOR_INSTANT_FAIL", "").strip() == "1"
        self.served_id = str(10000 + int(unit("served", model) * 90000))  # vLLM's numeric served name
        self.benchmark_name = dataset.rstrip("/").rsplit("/", 1)[-1]
        self.shard = os.environ.get("EVAL_SHARD", "").strip()
        self.tasks = self._tasks()
        self.job_id = str(uuid.uuid4())
        self.results: list[dict] = []
        self.started_at = now()

    def _tasks(self) -> list[str]:
        if os.path.isdir(self.dataset):
            tasks = sorted(p.name for p in Path(self.dataset).iterdir() if p.is_dir() and not p.name.startswith("."))
        else:
            tasks = [f"task-{i:03d}" for i in range(env_int("FAKE_HARBOR_TASKS", 8))]
        if not self.shard:
            return tasks
        match = re.fullmatch(r"(\d+)/(\d+)", self.shard)
        if match is None or int(match[1]) >= int(match[2]):
            raise BadInput(f"EVAL_SHARD must be i/K with 0 <= i < K, e.g. 0/2 (got '{self.shard}')")
        subset = tasks[int(match[1])::int(match[2])]
        if not subset:
            raise BadInput(f"EVAL_SHARD={self.shard} selects no task: {self.dataset} has {len(tasks)}")
        return subset

    @property
    def n_total(self) -> int:
        return len(self.tasks) * self.n_attempts

    # ------------------------------------------------------------------ job files

    def job_config(self) -> dict:
        return {
            "job_name": self.run_tag,
            "jobs_dir": str(self.run_dir.parent),
            "n_attempts": self.n_attempts,
            "timeout_multiplier": self.timeout_multiplier,
            "orchestrator": {"n_concurrent_trials": self.n_concurrent, "quiet": True},
            "environment": {"type": "daytona"},
            "agents": [{
                "name": self.agent,
                "model_name": f"hosted_vllm/{self.model}",
                "kwargs": {"api_base": api_base()},
            }],
            "datasets": [{"path": self.dataset, "task_names": self.tasks if self.shard else None}],
        }

    def write_meta_env(self, resume_count: int) -> None:
        values = {
            "MODEL": self.model, "REPO_ID": self.dataset, "SLURM_JOB_ID": os.environ.get("SLURM_JOB_ID", ""),
            "DB_JOB_ID": os.environ.get("EVAL_DB_JOB_ID", ""), "BENCHMARK_ID": self.benchmark_id,
            "N_CONCURRENT": self.n_concurrent, "N_ATTEMPTS": self.n_attempts, "AGENT_NAME": self.agent,
            "TIMEOUT_MULTIPLIER": self.timeout_multiplier, "BENCHMARK_NAME": self.benchmark_name,
            "RESUME_COUNT": resume_count, "SHARD": self.shard,
        }
        path = self.run_dir / "meta.env"
        if path.exists():  # a resume keeps what the first fire recorded, except the fire's own facts
            old = dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
            values = old | {"SLURM_JOB_ID": values["SLURM_JOB_ID"], "RESUME_COUNT": resume_count}
        path.write_text("".join(f"{k}={v}\n" for k, v in values.items()))

    def write_job_result(self, finished: bool) -> None:
        evals: dict = {}
        n_errored = 0
        for r in self.results:
            key = f"{r['agent_info']['name']}__{r['agent_info']['model_info']['name']}__{r['source']}"
            stats = evals.setdefault(
                key, {"n_trials": 0, "n_errors": 0, "metrics": [], "reward_stats": {}, "exception_stats": {}}
            )
            reward = (r["verifier_result"] or {}).get("rewards", {}).get("reward")
            if reward is not None:
                stats["n_trials"] += 1
                stats["reward_stats"].setdefault("reward", {}).setdefault(str(reward), []).append(r["trial_name"])
            if r["exception_info"]:
                n_errored += 1
                stats["n_errors"] += 1
                exc = r["exception_info"]["exception_type"]
                stats["exception_stats"].setdefault(exc, []).append(r["trial_name"])
        for stats in evals.values():
            rewards = [float(v) for v, names in stats["reward_stats"].get("reward", {}).items() for _ in names]
            stats["metrics"] = [{"mean": sum(rewards) / len(rewards) if rewards else 0.0}]
        stamp = now()
        write_json(self.run_dir / "result.json", {
            "id": self.job_id,
            "started_at": self.started_at,
            "updated_at": stamp,
            "finished_at": stamp if finished else None,
            "n_total_trials": self.n_total,
            "stats": {
                "n_completed_trials": len(self.results), "n_errored_trials": n_errored, "n_running_trials": 0,
                "n_pending_trials": max(self.n_total - len(self.results), 0), "n_cancelled_trials": 0,
                "n_retries": 0, "evals": evals,
            },
        })

    # ------------------------------------------------------------------ trials

    def new_trial(self, task: str) -> tuple[str, Path, str, dict]:
        """A trial dir as Harbor creates it when the trial starts: agent/, verifier/ and its config.json."""
        name = f"{task[:32]}__{''.join(random.choices(string.ascii_letters + string.digits, k=7))}"
        trial_dir = self.run_dir / name
        (trial_dir / "agent").mkdir(parents=True)
        (trial_dir / "verifier").mkdir()
        task_path = os.path.join(self.dataset, task)
        trial_config = {
            "task": {"path": task_path, "source": self.benchmark_name},
            "trial_name": name,
            "trials_dir": str(self.run_dir),
            "timeout_multiplier": self.timeout_multiplier,
            "agent": self.job_config()["agents"][0],
            "environment": {"type": "daytona"},
            "job_id": self.job_id,
        }
        write_json(trial_dir / "config.json", trial_config)
        return name, trial_dir, task_path, trial_config

    def run_trial(self, task: str, attempt: int, infra: bool) -> dict:
        if self.instant_fail:
            return self.run_instant_failure(task)
        name, trial_dir, task_path, trial_config = self.new_trial(task)
        started = now()
        time.sleep(self.trial_seconds)
        n_steps = 2 + int(unit("steps", self.model, task, attempt) * 10)
        write_json(trial_dir / "agent" / "trajectory.json", {
            "schema_version": "ATIF-v1.2",
            "session_id": str(uuid.uuid4()),
            "agent": {"name": self.agent, "version": "0.0.0", "model_name": f"hosted_vllm/{self.model}"},
            "steps": [
                {"step_id": i + 1, "source": "user" if i == 0 else "agent", "message": f"step {i + 1} of {task}"}
                for i in range(n_steps)
            ],
        })
        agent_done = now()
        exception = None
        reward: float | None = 1.0 if unit("reward", self.model, self.benchmark_name, task, attempt) < self.pass_rate() else 0.0
        if infra:
            exception, reward = ("DaytonaError", "Failed to create sandbox: 503 Service Unavailable"), None
        elif unit("benign", self.model, task, attempt) < BENIGN_RATE:
            exception, reward = ("AgentTimeoutError", "Agent execution timed out after 900.0 seconds"), 0.0
        if reward is not None:
            (trial_dir / "verifier" / "reward.txt").write_text(f"{reward:g}\n")
        exception_info = None
        if exception:
            traceback = f"Traceback (most recent call last):\n  ...\n{exception[0]}: {exception[1]}\n"
            (trial_dir / "exception.txt").write_text(traceback)
            exception_info = {
                "exception_type": exception[0], "exception_message": exception[1],
                "exception_traceback": traceback, "occurred_at": now(),
            }
        finished = now()
        (trial_dir / "trial.log").write_text(f"{started} trial {name} started\n{finished} trial {name} finished\n")
        result = self.trial_result(task, name, trial_dir, task_path, trial_config) | {
            "agent_result": {"n_input_tokens": 1000 * n_steps, "n_cache_tokens": 0,
                             "n_output_tokens": 200 * n_steps, "cost_usd": 0.0, "metadata": {"n_episodes": n_steps}},
            "verifier_result": None if reward is None else {"rewards": {"reward": reward}},
            "exception_info": exception_info,
            "started_at": started,
            "finished_at": finished,
            "environment_setup": {"started_at": started, "finished_at": started},
            "agent_setup": {"started_at": started, "finished_at": started},
            "agent_execution": {"started_at": started, "finished_at": agent_done},
            "verifier": None if infra else {"started_at": agent_done, "finished_at": finished},
        }
        write_json(trial_dir / "result.json", result)
        return result

    def run_instant_failure(self, task: str) -> dict:
        """A trial whose agent raised on its first call to the model: the sandbox came up (the trial's time goes
        there), the agent ran for no time, wrote nothing and used no token, and nothing was verified."""
        name, trial_dir, task_path, trial_config = self.new_trial(task)
        started = now()
        time.sleep(self.trial_seconds)  # environment setup
        agent_started = now()
        exception, message = INSTANT_FAILURE
        traceback = f"Traceback (most recent call last):\n  ...\nlitellm.exceptions.{exception}: {message}\n"
        agent_done = now()
        (trial_dir / "exception.txt").write_text(traceback)
        finished = now()
        (trial_dir / "trial.log").write_text(f"{started} trial {name} started\n{finished} trial {name} finished\n")
        result = self.trial_result(task, name, trial_dir, task_path, trial_config) | {
            "agent_result": {"n_input_tokens": None, "n_cache_tokens": None, "n_output_tokens": None,
                             "cost_usd": None, "metadata": None},
            "verifier_result": None,
            "exception_info": {"exception_type": exception, "exception_message": message,
                               "exception_traceback": traceback, "occurred_at": agent_started},
            "started_at": started,
            "finished_at": finished,
            "environment_setup": {"started_at": started, "finished_at": agent_started},
            "agent_setup": {"started_at": agent_started, "finished_at": agent_started},
            "agent_execution": {"started_at": agent_started, "finished_at": agent_done},
            "verifier": None,
        }
        write_json(trial_dir / "result.json", result)
        return result

    def trial_result(self, task: str, name: str, trial_dir: Path, task_path: str, trial_config: dict) -> dict:
        """What every TrialResult says of the trial itself; the caller adds how it went."""
        return {
            "id": str(uuid.uuid4()),
            "task_name": task,
            "trial_name": name,
            "trial_uri": trial_dir.resolve().as_uri(),
            "task_id": {"path": task_path},
            "source": self.benchmark_name,
            "task_checksum": hashlib.sha256(task.encode()).hexdigest(),
            "config": trial_config,
            "agent_info": {"name": self.agent, "version": "0.0.0",
                           "model_info": {"name": self.served_id, "provider": "hosted_vllm"}},
        }

    def pass_rate(self) -> float:
        return 0.25 + 0.5 * unit("skill", self.model, self.benchmark_name)  # stable per model and benchmark

    # ------------------------------------------------------------------ resume

    def prune_for_resume(self) -> None:
        """Like `harbor jobs resume -f <infra classes>`: drop unfinished and infra-errored trials, keep the rest."""
        for trial_dir in sorted(p for p in self.run_dir.iterdir() if p.is_dir() and "__" in p.name):
            try:
                result = json.loads((trial_dir / "result.json").read_text())
            except (OSError, ValueError):
                shutil.rmtree(trial_dir)
                continue
            if (result.get("exception_info") or {}).get("exception_type") in RESUME_FILTER:
                shutil.rmtree(trial_dir)
            else:
                self.results.append(result)

    def pending(self) -> list[tuple[str, int]]:
        """(task, attempt) pairs still to run, attempts numbered after the kept ones."""
        done: dict[str, int] = {}
        for r in self.results:
            done[r["task_name"]] = done.get(r["task_name"], 0) + 1
        return [(t, a) for t in self.tasks for a in range(done.get(t, 0), self.n_attempts)]


def detach_and_keep_writing(job: FakeJob, n: int) -> None:
    """Fork a child in its own session that outlives the kill and adds `n` trial dirs slowly."""
    if os.fork() != 0:
        return
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    pause = float(os.environ.get("FAKE_HARBOR_LATE_TRIAL_SECONDS", "0"))
    for i in range(n):
        time.sleep(pause)
        job.run_trial(job.tasks[i % len(job.tasks)] if job.tasks else f"late-{i:03d}", job.n_attempts + i, infra=False)
    os._exit(0)


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print("usage: fake_harbor.py <model> <dataset> <benchmark_id> <run_tag>", file=sys.stderr)
        return 2
    try:
        job = FakeJob(*argv)
    except BadInput as error:
        print(f"fake_harbor: {error}", file=sys.stderr)
        return 2
    resume = os.environ.get("EVAL_RESUME") == "1" and (job.run_dir / "config.json").exists()
    if not resume and (job.run_dir / "config.json").exists():
        print(f"{job.run_dir} already holds a job; set EVAL_RESUME=1 to resume it", file=sys.stderr)
        return 3
    banner = os.environ.get("FAKE_HARBOR_PRINT")
    if banner:
        print(banner, flush=True)

    write_after_kill = env_int("FAKE_HARBOR_WRITE_AFTER_KILL")

    def on_sigterm(signum: int, frame: object) -> None:
        if write_after_kill:
            detach_and_keep_writing(job, write_after_kill)
        os._exit(128 + signum)  # killed: result.json keeps finished_at null

    signal.signal(signal.SIGTERM, on_sigterm)

    job.run_dir.mkdir(parents=True, exist_ok=True)
    if resume:
        old = json.loads((job.run_dir / "config.json").read_text())  # never rewritten on resume
        job.n_attempts = old.get("n_attempts", job.n_attempts)
        job.tasks = old["datasets"][0].get("task_names") or job.tasks  # Harbor resumes the subset it was given
        result_path = job.run_dir / "result.json"
        previous = json.loads(result_path.read_text()) if result_path.exists() else {}
        job.job_id = previous.get("id", job.job_id)
        job.started_at = previous.get("started_at", job.started_at)
        old_meta = (job.run_dir / "meta.env").read_text() if (job.run_dir / "meta.env").exists() else ""
        old_count = next((int(v) for k, _, v in (ln.partition("=") for ln in old_meta.splitlines())
                          if k == "RESUME_COUNT"), 0)
        job.write_meta_env(env_int("EVAL_RESUME_COUNT", old_count + 1))
        job.prune_for_resume()
    else:
        job.write_meta_env(env_int("EVAL_RESUME_COUNT", 0))
        write_json(job.run_dir / "config.json", job.job_config())
        exit_code = env_int("FAKE_HARBOR_EXIT_CODE")
        if exit_code is not None:
            return exit_code

    forced_infra = env_int("FAKE_HARBOR_INFRA_ERRORS")
    if forced_infra is not None and resume:
        forced_infra = 0
    hang_after = env_int("FAKE_HARBOR_HANG_AFTER")
    fire = env_int("EVAL_RESUME_COUNT", 0) if resume else 0
    job.write_job_result(finished=False)
    n_infra = 0
    for n_run, (task, attempt) in enumerate(job.pending()):
        if hang_after is not None and n_run >= hang_after:
            while True:
                time.sleep(3600)
        if forced_infra is not None:
            infra = n_infra < forced_infra
        else:
            cap = min(INFRA_CAP, int(job.n_total * INFRA_SHARE_CAP))
            infra = n_infra < cap and unit("infra", job.model, task, attempt, fire) < INFRA_RATE
        n_infra += infra
        job.results.append(job.run_trial(task, attempt, infra))
        job.write_job_result(finished=False)
    if hang_after is not None and hang_after >= len(job.results):  # a zombie: every trial done, the job runs on
        while True:
            time.sleep(3600)
    job.write_job_result(finished=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
