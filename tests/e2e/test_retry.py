"""`evalctl retry` end to end on the local scheduler (issue 29, RULES §13): a cell held because its job script
failed stays held pass after pass; the user fixes the script and asks for a retry; the next pass submits exactly one
new attempt, which completes and uploads; the failed attempt's history is still there.

Real parts: `evalctl` as a subprocess, real local-scheduler jobs, the SQLite store read back. Synchronisation on
observable state only (job states, store rows) with `wait_until`'s bounded polls.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import sys
from pathlib import Path

import pytest

from controller.core.observed import JobState
from tests.e2e.conftest import FAKE_HARBOR, Cluster
from tests.fixtures.evalctl import wait_until

MODEL = "org/retry-8B"
DATASET = "DCAgent/demo_tiny_a"
FAST = {"FAKE_HARBOR_TASKS": "3", "FAKE_HARBOR_TRIAL_SECONDS": "0.02"}


def flat(text: str) -> str:
    return " ".join(text.split())


def broken_then_fixed(cluster: Cluster) -> Path:
    """A job script that points at a program that is not there (the user's typo), on a spec that validates."""
    script = cluster.root / "run.sh"
    script.write_text("#!/bin/sh\nexec /nonexistent/eval_harbor.py \"$@\"\n")
    script.chmod(0o755)
    cluster.write(models=[MODEL], datasets=[DATASET], env=FAST, script=script)
    return script


def fix(script: Path) -> None:
    script.write_text(f"#!/bin/sh\nexec {sys.executable} {FAKE_HARBOR} \"$@\"\n")


def sql(cluster: Cluster, query: str) -> list[tuple]:
    with sqlite3.connect(cluster.root / "store.db") as conn:
        return conn.execute(query).fetchall()


def submissions(cluster: Cluster) -> list[tuple[str, int, str | None]]:
    return sql(cluster, "SELECT name, attempt, job_id FROM evalrun_submissions ORDER BY attempt, fire")


def status_cell(cluster: Cluster) -> dict:
    [run] = json.loads(cluster.evalctl("status", "-o", "json").stdout)["evalruns"]
    [cell] = run["cells"]
    return cell


def ended(cluster: Cluster, name: str) -> JobState | None:
    jobs = cluster.jobs_named(name)
    return jobs[0].state if len(jobs) == 1 and not jobs[0].state.active else None


def held_after_a_failed_start(cluster: Cluster) -> str:
    """The first pass submits attempt 1; its job fails at once; the next passes hold the cell."""
    cluster.evalctl("reconcile", "--once")
    [(first, _, _)] = submissions(cluster)
    assert wait_until(lambda: ended(cluster, first), "the broken job to end") == JobState.FAILED
    for _ in range(2):
        cluster.evalctl("reconcile", "--once")
    cell = status_cell(cluster)
    # the script never ran, so no jobs dir was made: the hold names the failed job (RULES §13)
    assert (cell["phase"], cell["rule"]) == ("Failed", "JobFailedRunDirUnseen"), cell
    assert [name for name, _, _ in submissions(cluster)] == [first], "a hold submits nothing"
    return first


def converge(cluster: Cluster) -> None:
    result = cluster.evalctl("reconcile", "--loop", "--interval", "0.3", "--until-done")
    assert "converged after" in result.stdout, result.stdout[-4000:]


@pytest.mark.parametrize("which", [(MODEL, DATASET), ("--held",)], ids=["named", "held"])
def test_a_held_cell_is_released_by_retry_and_completes_with_one_new_job(cluster: Cluster,
                                                                         which: tuple[str, ...]) -> None:
    script = broken_then_fixed(cluster)
    first = held_after_a_failed_start(cluster)
    cell = status_cell(cluster)
    command = cell["release"]
    assert command == f"evalctl retry -f {cluster.spec} --store {cluster.store} {MODEL} {cell['benchmark']} " \
                      "--reason \"...\"", command
    explained = flat(cluster.evalctl("explain", MODEL, DATASET).stdout)
    assert f"release: {command}" in explained, explained
    assert f"release: {command}" in flat(cluster.evalctl("status").stdout)
    fix(script)

    asked = cluster.evalctl("retry", *which, "--reason", "job script path fixed")

    said = flat(asked.stdout)
    assert f"recorded: retry {MODEL} × {cell['benchmark']}" in said and "job script path fixed" in said, said
    assert "the next pass releases each once" in said and "evalctl reconcile" in said, said
    [(by, why, consumed)] = sql(cluster, "SELECT requested_by, reason, consumed_by FROM evalrun_retry_requests")
    assert (why, consumed) == ("job script path fixed", None) and by, (by, why, consumed)
    pending = status_cell(cluster)
    assert pending["rule"] == "Retry" and pending["retry"]["reason"] == "job script path fixed", pending
    table = flat(cluster.evalctl("status").stdout)
    assert f"retry: {MODEL} × {cell['benchmark']}: retry requested by {by}" in table, table
    assert "job script path fixed: released by the next pass" in table, table

    converge(cluster)

    second = f"{first.removesuffix('1')}2"
    subs = submissions(cluster)
    assert [(name, n) for name, n, _ in subs] == [(first, 1), (second, 2)], subs
    assert [len(cluster.jobs_named(name)) for name in (first, second)] == [1, 1]
    assert ended(cluster, first) == JobState.FAILED, "the failed attempt's job is history, untouched"
    done = status_cell(cluster)
    assert done["phase"] == "Completed" and done["score"] is not None, done
    assert "release" not in done and "retry" not in done, done
    assert sql(cluster, "SELECT consumed_by, consumed_attempt FROM evalrun_retry_requests") == [(second, 2)]
    rows = sql(cluster, "SELECT job_name, job_status, metrics IS NOT NULL FROM sandbox_jobs ORDER BY job_name")
    assert rows == [(first, "Pending", 0), (second, "Finished", 1)], rows


def test_a_cell_that_is_not_held_is_reported_and_nothing_is_recorded(cluster: Cluster) -> None:
    cluster.write(models=[MODEL], datasets=[DATASET], env={**FAST, "FAKE_HARBOR_TRIAL_SECONDS": "30"})
    cluster.evalctl("reconcile", "--once")

    said = flat(cluster.evalctl("retry", MODEL, DATASET, "--reason", "why not").stdout)
    everything = flat(cluster.evalctl("retry", "--held").stdout)

    assert said.startswith(f"nothing to retry: {MODEL} ×") and ("is Submitted" in said or "is Running" in said), said
    assert everything == "nothing to retry: no held cell in these specs", everything
    assert sql(cluster, "SELECT count(*) FROM evalrun_retry_requests") == [(0,)]


def test_an_unknown_cell_is_refused_with_the_nearest_names(cluster: Cluster) -> None:
    cluster.write(models=[MODEL], datasets=[DATASET], env=FAST)

    typo = cluster.evalctl("retry", "org/retry-8b", DATASET, check=False)
    both = cluster.evalctl("retry", "--held", MODEL, DATASET, check=False)

    assert typo.returncode == 2 and "Traceback" not in typo.stderr, typo.stderr
    assert f"no cell org/retry-8b × {DATASET} in these specs; nearest: {MODEL} ×" in flat(typo.stderr), typo.stderr
    assert both.returncode == 2 and "name one cell (MODEL BENCHMARK), or --held, or --all-failed" in both.stderr
    assert not (cluster.root / "store.db").exists() or sql(
        cluster, "SELECT count(*) FROM evalrun_retry_requests") == [(0,)]


@pytest.mark.parametrize("step", ["after-submission", "after-intent", "after-submit"])
def test_a_retry_pass_killed_between_protocol_steps_gives_one_new_job(cluster: Cluster, step: str) -> None:
    """The request is consumed with the new attempt's intent: killed after it, the next pass finishes that
    attempt (never a third one); the request is never spent twice nor lost."""
    script = broken_then_fixed(cluster)
    first = held_after_a_failed_start(cluster)
    fix(script)
    cluster.evalctl("retry", MODEL, DATASET)

    killed = cluster.evalctl("reconcile", "--once", kill_at=step)

    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
    second = f"{first.removesuffix('1')}2"
    assert sql(cluster, "SELECT consumed_by FROM evalrun_retry_requests") == [(second,)]
    assert len(cluster.jobs_named(second)) == (1 if step == "after-submit" else 0)

    converge(cluster)

    assert [(name, n) for name, n, _ in submissions(cluster)] == [(first, 1), (second, 2)]
    assert [len(cluster.jobs_named(name)) for name in (first, second)] == [1, 1]
    assert status_cell(cluster)["phase"] == "Completed"
