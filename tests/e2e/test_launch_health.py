"""Launch health (issue 16) end to end on the local scheduler: what a dead, unwired or locked launch does.

Real parts: `evalctl` as a subprocess (one pass per `--once`, or `--loop --until-done`), real local-scheduler
jobs running specs/demo/fake_harbor.py, and the SQLite store, which the tests read back. The job program fakes
only Harbor's trials, in Harbor's layout: FAKE_HARBOR_INSTANT_FAIL (every trial raises litellm's
APIConnectionError at once, no output token, no reward), FAKE_HARBOR_API_BASE (an agent that does not call its
pinggy pair), FAKE_HARBOR_PRINT (a line in the job's output, e.g. pinggy's lock message), FAKE_HARBOR_HANG_AFTER
(a job that keeps running). Synchronisation is on observable state only (trial files, the job's output and state,
store rows), with `wait_until`'s bounded polls; nothing waits on time alone.
"""

from __future__ import annotations

import json
import signal
import sqlite3
from pathlib import Path

import pytest

from controller.core.observed import JobState, ObservedJob
from tests.e2e.conftest import Cluster
from tests.fixtures.evalctl import wait_until

MODEL = "org/health-8B"
DATASET = "DCAgent/demo_tiny_a"
FAST = {"FAKE_HARBOR_TASKS": "4", "FAKE_HARBOR_TRIAL_SECONDS": "0.02"}
TRIALS = 4 * 3  # FAST's tasks × the EvalRun's default nAttempts
# A dead launch of 3 tasks × 3 attempts: fewer trials than the default deadLaunchTrials (10), so no pass can catch
# the job running with enough of them to cancel it: the rule for an ended dir of instant failures is what decides.
INSTANT = {**FAST, "FAKE_HARBOR_TASKS": "3", "FAKE_HARBOR_INSTANT_FAIL": "1"}
INSTANT_TRIALS = 3 * 3
REFIRE_ONCE = "  health: {maxRefires: 1, refireBackoffMinutes: 0}"
PAIR_URLS = {"pair-1": "https://pair-1.a.pinggy.link", "pair-2": "https://pair-2.a.pinggy.link"}
INSTALLED_AGENT = """  agent: openhands
  pinggy:
    pairs:
      - {name: pair-1, url: "https://pair-1.a.pinggy.link", secretRef: {name: pinggy-1, key: token}}
      - {name: pair-2, url: "https://pair-2.a.pinggy.link", secretRef: {name: pinggy-2, key: token}}"""
LOCKED_LINE = "Error: A tunnel with the same token (xyz) is already active."


@pytest.fixture
def pinggy_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pairs' tokens, where the CLI reads secrets (evalctl inherits the test's environment)."""
    monkeypatch.setenv("EVALCTL_SECRET_PINGGY_1_TOKEN", "tok-pair-1")
    monkeypatch.setenv("EVALCTL_SECRET_PINGGY_2_TOKEN", "tok-pair-2")


# --------------------------------------------------------------------------- helpers


def flat(text: str) -> str:
    """Rich wraps long lines at the terminal width: compare with whitespace collapsed."""
    return " ".join(text.split())


def once(cluster: Cluster) -> str:
    """One acting pass (exit 0); its output, flattened."""
    result = cluster.evalctl("reconcile", "--once")
    text = flat(result.stdout + result.stderr)
    assert "Traceback" not in text, text
    return text


def converge(cluster: Cluster, held: int = 0) -> str:
    """Passes until every cell is Completed or Failed (`held` of them: exit 4, saying so); their output, flattened."""
    result = cluster.evalctl("reconcile", "--loop", "--interval", "0.3", "--until-done", check=False)
    assert "converged after" in result.stdout, result.stdout[-4000:]
    assert (result.returncode, result.stderr.splitlines()[-1]) == (
        (4, f"evalctl: {held} held — see `evalctl retry`") if held else (0, result.stderr.splitlines()[-1])), \
        result.stderr
    return flat(result.stdout)


def status_cell(cluster: Cluster) -> dict:
    [run] = json.loads(cluster.evalctl("status", "-o", "json").stdout)["evalruns"]
    [cell] = run["cells"]
    return cell


def sql(cluster: Cluster, query: str, *params: object) -> list[tuple]:
    with sqlite3.connect(cluster.root / "store.db") as conn:
        return conn.execute(query, params).fetchall()


def submissions(cluster: Cluster) -> list[tuple[str, int, str | None]]:
    """(name, attempt, job_id) of every submission, in attempt order."""
    return sql(cluster, "SELECT name, attempt, job_id FROM evalrun_submissions ORDER BY attempt, fire")


def remedies(cluster: Cluster) -> list[tuple[str, str, str]]:
    """(run_tag, cause, kind) of every remedy the (single) cell remembers."""
    rows = sql(cluster, "SELECT memory FROM evalrun_cell_memory")
    assert len(rows) <= 1, rows
    return [(r["run_tag"], r["cause"], r["kind"]) for (doc,) in rows for r in json.loads(doc).get("remedies", [])]


def trial_results(cluster: Cluster, run_tag: str | None = None) -> list[Path]:
    return sorted((cluster.root / "jobs").glob(f"{run_tag or '*'}/*__*/result.json"))


def trial_configs(cluster: Cluster, run_tag: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((cluster.root / "jobs" / run_tag).glob("*__*/config.json"))]


def the_job(cluster: Cluster, name: str) -> ObservedJob:
    [job] = cluster.jobs_named(name)
    return job


def running(cluster: Cluster, name: str) -> bool:
    return [j.state for j in cluster.jobs_named(name)] == [JobState.RUNNING]


def ended(cluster: Cluster, name: str) -> JobState | None:
    """The job's end state once it ended (None while it is queued or running)."""
    jobs = cluster.jobs_named(name)
    return jobs[0].state if len(jobs) == 1 and not jobs[0].state.active else None


def job_output(cluster: Cluster, name: str) -> str:
    job = the_job(cluster, name)
    path = cluster.root / "logs" / f"{name}_{job.job_id}.out"
    return path.read_text() if path.exists() else ""


def leases(cluster: Cluster) -> list[tuple[str, str]]:
    return sql(cluster, "SELECT pair, holder FROM evalrun_tunnel_leases ORDER BY pair")


def first_submission(cluster: Cluster) -> str:
    """After the first pass: the single submission's name (= run tag = job name), attempt 1."""
    [(name, attempt, job_id)] = submissions(cluster)
    assert attempt == 1 and job_id is not None and name.endswith("__a1"), (name, attempt, job_id)
    return name


def attempt(first: str, n: int) -> str:
    return f"{first.removesuffix('1')}{n}"


# --------------------------------------------------------------------------- 1. dead launches


def test_a_dead_launch_is_refired_once_then_held_and_never_uploaded(cluster: Cluster) -> None:
    cluster.write(models=[MODEL], datasets=[DATASET], env=INSTANT, extra_run=REFIRE_ONCE)

    output = converge(cluster, held=1)

    cell = status_cell(cluster)
    assert cell["phase"] == "Failed" and cell["rule"] == "RefiresExhausted", cell
    assert f"dead launch: {INSTANT_TRIALS} instant failures, 0 real trials" in cell["reason"], cell
    assert "not refired again: 1 refire(s) used (health.maxRefires)" in cell["reason"], cell
    names = [name for name, _, _ in submissions(cluster)]
    a1 = names[0]
    assert names == [a1, attempt(a1, 2)], names
    jobs = cluster.scheduler.observe()
    assert sorted(j.name for j in jobs) == names and all(j.state == JobState.COMPLETED for j in jobs), jobs
    assert remedies(cluster) == [(name, "dead-launch", "refire") for name in names]
    for name in names:  # each attempt ran to its end: every trial an instant failure
        assert len(trial_results(cluster, name)) == INSTANT_TRIALS, name
    rows = sql(cluster, "SELECT job_name, job_status, metrics FROM sandbox_jobs")
    assert sorted(name for name, _, _ in rows) == names, rows
    assert not [row for row in rows if row[1] == "Finished" or row[2] is not None], f"uploaded: {rows}"
    assert "upload" not in output and "analyze" not in output, output[-3000:]


def test_a_running_dead_launch_is_cancelled_in_one_pass(cluster: Cluster) -> None:
    cluster.write(models=[MODEL], datasets=[DATASET], env={**INSTANT, "FAKE_HARBOR_HANG_AFTER": "3"},
                  extra_run="  health: {deadLaunchTrials: 3}")
    once(cluster)
    a1 = first_submission(cluster)
    wait_until(lambda: len(trial_results(cluster, a1)) >= 3, "3 instant failures")
    assert running(cluster, a1), "the job hangs after its 3 trials"

    output = once(cluster)

    job_id = the_job(cluster, a1).job_id
    assert f"cancel: cancelled job {job_id}: dead launch: 3 instant failures, 0 real trials" in output, output
    assert wait_until(lambda: ended(cluster, a1), "the job to end") == JobState.CANCELLED
    assert remedies(cluster) == [(a1, "dead-launch", "refire")]
    cell = status_cell(cluster)  # ended: the refire waits out refireBackoffMinutes (5 by default)
    assert cell["phase"] == "Pending" and "refire after" in cell["reason"] and "dead launch" in cell["reason"], cell
    assert [name for name, _, _ in submissions(cluster)] == [a1] and len(cluster.scheduler.observe()) == 1


# --------------------------------------------------------------------------- 2. no false positives


def test_a_healthy_launch_converges_and_uploads_its_zeros_and_benign_errors(cluster: Cluster) -> None:
    cluster.write(models=[MODEL], datasets=[DATASET], env={**FAST, "FAKE_HARBOR_TASKS": "24"}, extra_run=REFIRE_ONCE)

    converge(cluster)

    cell = status_cell(cluster)
    assert cell["phase"] == "Completed", cell
    [(a1, _, _)] = submissions(cluster)
    assert [j.state for j in cluster.scheduler.observe()] == [JobState.COMPLETED]
    assert remedies(cluster) == []
    # what the dir holds, read independently: genuine zeros, benign errors (reward 0), infra errors (no reward)
    results = [json.loads(p.read_text()) for p in trial_results(cluster, a1)]
    kinds = [(r["exception_info"] or {}).get("exception_type") for r in results]
    rewards = [(r["verifier_result"] or {}).get("rewards", {}).get("reward") for r in results]
    valid = [reward or 0.0 for kind, reward in zip(kinds, rewards, strict=True) if kind != "DaytonaError"]
    assert kinds.count("AgentTimeoutError") >= 1 and valid.count(0.0) > kinds.count("AgentTimeoutError"), kinds
    [(status, metrics, stats)] = sql(cluster, "SELECT job_status, metrics, stats FROM sandbox_jobs")
    uploaded = {m["name"]: m["value"] for m in json.loads(metrics)}
    stats = json.loads(stats)
    assert status == "Finished" and uploaded["accuracy"] == pytest.approx(sum(valid) / len(valid)), uploaded
    assert cell["score"] == pytest.approx(uploaded["accuracy"]), cell
    assert stats["n_trials"] == len(valid) and stats["n_errors_by_class"]["InstantFailure"] == 0, stats
    assert stats["n_errors_by_class"]["AgentTimeoutError"] == kinds.count("AgentTimeoutError"), stats
    assert stats["n_infra_errors"] == kinds.count("DaytonaError"), stats


@pytest.mark.parametrize(("trials", "health"), [
    pytest.param(0, "launching (0 min of 30 min)", id="slow-start-inside-the-grace"),
    pytest.param(3, "alive: ", id="scoring-past-deadLaunchTrials"),
])
def test_a_running_job_that_is_not_dead_is_left_running(cluster: Cluster, trials: int, health: str) -> None:
    """A job with no trial yet, well inside `launchGraceMinutes`; a job with as many real trials as
    `deadLaunchTrials` (its zeros, benign and infra errors are no instant failures)."""
    cluster.write(models=[MODEL], datasets=[DATASET], env={**FAST, "FAKE_HARBOR_HANG_AFTER": str(trials)},
                  extra_run="  health: {deadLaunchTrials: 3}")
    once(cluster)
    a1 = first_submission(cluster)
    wait_until(lambda: running(cluster, a1) and (cluster.root / "jobs" / a1 / "result.json").exists()
               and len(trial_results(cluster, a1)) == trials, f"the job to run, {trials} trial(s) done")

    output = once(cluster)

    assert "cancel" not in output and "1 × wait: job 1 running" in output, output
    assert running(cluster, a1) and len(trial_results(cluster, a1)) == trials
    cell = status_cell(cluster)
    assert cell["phase"] == "Running" and cell["rule"] == "InFlight", cell
    assert cell["health"]["note"].startswith(health), cell
    assert remedies(cluster) == []


# --------------------------------------------------------------------------- 3. pinggy not wired


@pytest.mark.usefixtures("pinggy_tokens")
@pytest.mark.parametrize(("api_base", "why"), [
    pytest.param("http://localhost:8000/v1", "is an internal address", id="internal"),
    pytest.param(f"{PAIR_URLS['pair-2']}/v1", f"is not the leased pair's URL {PAIR_URLS['pair-1']}", id="other-pair"),
])
def test_an_installed_agent_not_calling_its_pair_is_cancelled_held_and_its_pair_released(
        cluster: Cluster, api_base: str, why: str) -> None:
    cluster.write(models=[MODEL], datasets=[DATASET], extra_run=INSTALLED_AGENT,
                  env={**FAST, "FAKE_HARBOR_API_BASE": api_base, "FAKE_HARBOR_HANG_AFTER": "1"})
    once(cluster)
    a1 = first_submission(cluster)
    assert leases(cluster) == [("pair-1", a1)]
    wait_until(lambda: trial_configs(cluster, a1), "the first trial dir (its config.json)")
    assert running(cluster, a1)

    output = once(cluster)

    job_id = the_job(cluster, a1).job_id
    assert f"cancel: cancelled job {job_id}: pinggy not wired: api_base {api_base} {why}" in output, output
    assert "public URL (EVAL_PINGGY_URL)" in output, output
    assert wait_until(lambda: ended(cluster, a1), "the job to end") == JobState.CANCELLED
    assert leases(cluster) == [("pair-1", a1)], "released by the pass that sees the job over"

    once(cluster)

    assert leases(cluster) == []
    cell = status_cell(cluster)
    assert cell["phase"] == "Failed" and cell["rule"] == "PinggyNotWired", cell
    assert f"pinggy not wired: api_base {api_base} {why}" in cell["reason"], cell
    assert [a["kind"] for a in cell["actions"]] == ["hold"], cell
    assert [name for name, _, _ in submissions(cluster)] == [a1], "held, not refired"
    assert remedies(cluster) == [(a1, "pinggy-not-wired", "hold")]


# --------------------------------------------------------------------------- 4. pinggy pair locked


@pytest.mark.usefixtures("pinggy_tokens")
def test_a_locked_pinggy_pair_is_quarantined_and_the_refire_gets_the_other_pair(cluster: Cluster) -> None:
    def write(env: dict[str, str]) -> None:
        cluster.write(models=[MODEL], datasets=[DATASET], env={**FAST, **env},
                      extra_run=INSTALLED_AGENT + "\n  health: {refireBackoffMinutes: 0}")

    write({"FAKE_HARBOR_PRINT": LOCKED_LINE, "FAKE_HARBOR_HANG_AFTER": "0"})
    once(cluster)
    a1 = first_submission(cluster)
    assert leases(cluster) == [("pair-1", a1)]
    wait_until(lambda: LOCKED_LINE in job_output(cluster, a1), "pinggy's lock line in the job's output")
    assert running(cluster, a1)

    output = once(cluster)

    job_id = the_job(cluster, a1).job_id
    assert "quarantine: pinggy-pair pair-1 quarantined for 1 h: pinggy pair locked" in output, output
    assert f"cancel: cancelled job {job_id}: pinggy pair locked: a tunnel with the same token is already active " \
           "on the server (pair pair-1); refire on another pair" in output, output
    assert wait_until(lambda: ended(cluster, a1), "the job to end") == JobState.CANCELLED
    [(kind, name, reason)] = sql(cluster, "SELECT kind, name, reason FROM evalrun_quarantine")
    assert (kind, name) == ("pinggy-pair", "pair-1") and "same token" in reason, reason
    # pair-2's token is free on the pinggy server: its job does not print the lock line, and runs to its end
    write({})

    converge(cluster)

    names = [name for name, _, _ in submissions(cluster)]
    assert names == [a1, attempt(a1, 2)], names
    a2 = names[1]
    configs = trial_configs(cluster, a2)  # fake_harbor's api_base is the job's EVAL_PINGGY_URL + /v1
    assert len(configs) == TRIALS and {c["agent"]["kwargs"]["api_base"] for c in configs} == {
        f"{PAIR_URLS['pair-2']}/v1"}, configs
    assert remedies(cluster) == [(a1, "pinggy-locked", "refire")]
    [run] = json.loads(cluster.evalctl("status", "-o", "json").stdout)["evalruns"]
    assert run["counts"] == {"Completed": 1}, run
    assert [(q["kind"], q["name"]) for q in run["quarantined"]] == [("pinggy-pair", "pair-1")], run["quarantined"]
    assert sql(cluster, "SELECT kind, name FROM evalrun_quarantine") == [("pinggy-pair", "pair-1")]
    assert leases(cluster) == []
    assert [j.name for j in cluster.scheduler.observe()] == [a1, a2]


# --------------------------------------------------------------------------- 5. SIGKILL between refire steps


@pytest.mark.parametrize("step", ["after-intent", "after-find", "after-submit"])
def test_a_refire_pass_killed_between_protocol_steps_gives_one_job_per_attempt(cluster: Cluster, step: str) -> None:
    cluster.write(models=[MODEL], datasets=[DATASET], env=INSTANT, extra_run=REFIRE_ONCE)
    once(cluster)
    a1 = first_submission(cluster)
    assert wait_until(lambda: ended(cluster, a1), "the dead launch to end") == JobState.COMPLETED

    killed = cluster.evalctl("reconcile", "--once", kill_at=step)  # the refire pass: attempt 2, killed at `step`

    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
    a2 = attempt(a1, 2)
    assert submissions(cluster) == [(a1, 1, the_job(cluster, a1).job_id), (a2, 2, None)]
    assert len(cluster.jobs_named(a2)) == (1 if step == "after-submit" else 0)

    converge(cluster, held=1)

    cell = status_cell(cluster)
    assert cell["phase"] == "Failed" and cell["rule"] == "RefiresExhausted", cell
    subs = submissions(cluster)
    assert [name for name, _, _ in subs] == [a1, a2], subs
    assert [len(cluster.jobs_named(name)) for name in (a1, a2)] == [1, 1]
    assert [the_job(cluster, name).job_id for name in (a1, a2)] == [job_id for _, _, job_id in subs]
    assert len(cluster.scheduler.observe()) == 2
    assert remedies(cluster) == [(a1, "dead-launch", "refire"), (a2, "dead-launch", "refire")]
