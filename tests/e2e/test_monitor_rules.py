"""The eval-monitor runbook (RULES §5) end to end on the local executor with the fake Harbor, with the
windows shrunk to seconds: hang at 98%, a general stall, a zombie, trials landing after a cancel. Each ends
with the run dir analysed and uploaded as it is, one job, no resume — a run cut short of its trials only flagged
`partial` under `upload.partial: upload` (else held: RULES §14). Each task runs 3 attempts (the catalog's
default), so N tasks are 3N trials."""

from __future__ import annotations

import json
import sqlite3

from tests.e2e.conftest import Cluster
from tests.fixtures.evalctl import wait_until

DATASETS = ["DCAgent/tiny"]
MODEL = "org/m1-8B"
QUIET = {"FAKE_HARBOR_INFRA_ERRORS": "0"}


def write(cluster: Cluster, env: dict[str, str], monitor: str, upload: str = "{}") -> None:
    cluster.write(models=[MODEL], datasets=DATASETS, env={**QUIET, **env},
                  extra_run=f"  monitor: {monitor}\n  upload: {upload}")


def passes_until(cluster: Cluster, phase: str, timeout_s: float = 120, phases: list[str] | None = None) -> list[str]:
    """Acting passes until the cell reaches `phase`; their outputs, in order (and the phase after each)."""
    outputs: list[str] = []

    def reached() -> bool:
        outputs.append(cluster.evalctl("reconcile", "--once", check=False).stdout)
        seen = cell(cluster)["phase"]
        if phases is not None:
            phases.append(seen)
        return seen == phase

    wait_until(reached, f"the cell to be {phase}", timeout_s=timeout_s, step_s=0.2)
    return outputs


def cell(cluster: Cluster) -> dict:
    return json.loads(cluster.evalctl("plan", "-o", "json").stdout)["evalruns"][0]["cells"][0]


def history(cluster: Cluster) -> tuple[int, list[tuple[str, str]]]:
    with sqlite3.connect(cluster.root / "store.db") as conn:
        submissions = conn.execute("SELECT count(*) FROM evalrun_submissions").fetchone()[0]
        rows = conn.execute("SELECT job_status, metrics FROM sandbox_jobs").fetchall()
    return submissions, rows


def partial_flags(cluster: Cluster) -> list[bool]:
    with sqlite3.connect(cluster.root / "store.db") as conn:
        return [json.loads(stats)["partial"] for (stats,) in conn.execute("SELECT stats FROM sandbox_jobs")]


def test_a_hang_at_98_percent_is_held_then_uploaded_flagged_partial_once_the_user_says_so(cluster: Cluster) -> None:
    env = {"FAKE_HARBOR_TASKS": "50", "FAKE_HARBOR_HANG_AFTER": "147"}  # 147 of 150 trials
    monitor = "{nearCompleteFraction: 0.97, staleNearMinutes: 0.05, settleMinutes: 0.02}"
    write(cluster, env, monitor)

    outputs = passes_until(cluster, "Failed")
    held = cell(cluster)
    assert "147 of 150 expected trials" in held["reason"] and "upload.partial: upload" in held["reason"], held
    assert [status for status, _ in history(cluster)[1]] == ["Started"], "nothing published"
    write(cluster, env, monitor, "{partial: upload}")  # the lever: the same cell, published flagged
    outputs += passes_until(cluster, "Completed")

    assert partial_flags(cluster) == [True] and cell(cluster)["partial"] is True
    text = "".join(outputs)
    assert "stuck near complete" in text and ": resume: " not in text, text[-3000:]
    submissions, rows = history(cluster)
    assert submissions == 1 and [status for status, _ in rows] == ["Finished"]
    [job] = cluster.scheduler.observe()
    assert job.state.value == "Cancelled"
    assert cell(cluster)["score"] is not None
    reports = list((cluster.root / "jobs").glob("*/post_eval_report.txt"))
    assert len(reports) == 1 and "147" in reports[0].read_text()


def test_a_general_stall_is_reported_first_and_cancelled_on_the_second_reading(cluster: Cluster) -> None:
    write(cluster, {"FAKE_HARBOR_TASKS": "10", "FAKE_HARBOR_HANG_AFTER": "12"},  # 12 of 30 trials
          "{staleGeneralMinutes: 0.05, settleMinutes: 0.02}", "{minCompletedFraction: 0.3, partial: upload}")

    stalled = passes_until(cluster, "Stalled")
    outputs = passes_until(cluster, "Completed")

    # the pass that first found it stalled only reported it; only acting passes remember a reading, so the cancel
    # comes from a later pass (which passes see which phase depends on the machine's speed, not the order)
    text = "".join(stalled + outputs)
    first = next((output for output in stalled + outputs if "wait: no new score for" in output), "")
    assert first and "cancel" not in first, text[-3000:]
    assert text.index("wait: no new score for") < text.index("stuck general, second reading"), text[-3000:]
    assert "stuck general, second reading" in text and ": resume: " not in text, text[-3000:]
    [job] = cluster.scheduler.observe()
    assert job.state.value == "Cancelled" and history(cluster)[0] == 1 and partial_flags(cluster) == [True]


def test_a_zombie_is_cancelled_and_uploaded(cluster: Cluster) -> None:
    write(cluster, {"FAKE_HARBOR_TASKS": "6", "FAKE_HARBOR_HANG_AFTER": "18"},  # every trial done, then it hangs
          "{zombieGraceMinutes: 0.05, settleMinutes: 0.02}")

    outputs = passes_until(cluster, "Completed")

    assert "zombie" in "".join(outputs)
    [job] = cluster.scheduler.observe()
    assert job.state.value == "Cancelled" and history(cluster)[0] == 1
    assert partial_flags(cluster) == [False], "every trial has a result: a whole score"


def test_trials_landing_after_the_cancel_are_waited_for_and_uploaded_once(cluster: Cluster) -> None:
    write(cluster, {"FAKE_HARBOR_TASKS": "50", "FAKE_HARBOR_HANG_AFTER": "147", "FAKE_HARBOR_WRITE_AFTER_KILL": "2",
                    "FAKE_HARBOR_LATE_TRIAL_SECONDS": "1"},
          "{nearCompleteFraction: 0.97, staleNearMinutes: 0.05, settleMinutes: 0.15}", "{partial: upload}")
    phases: list[str] = []

    outputs = passes_until(cluster, "Completed", phases=phases)

    text = "".join(outputs)
    assert "stuck near complete" in text and "Settling" in phases, (phases, text[-3000:])
    assert sum(": upload: " in line for line in text.splitlines() if "✓" in line) == 1, text[-3000:]
    trials = [d for d in next((cluster.root / "jobs").iterdir()).iterdir() if d.is_dir()]
    [(status, _)] = history(cluster)[1]
    [report] = (cluster.root / "jobs").glob("*/post_eval_report.txt")
    assert status == "Finished" and len(trials) == 149 and "149" in report.read_text(), "late trials were counted"
