"""The main job end to end on the embedded defaults: local scheduler, SQLite store, Harbor-shaped run dirs."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

from controller.core.admission import GATE_VERSION


def rows(cluster) -> list[tuple]:
    with sqlite3.connect(cluster.root / "store.db") as conn:
        return conn.execute("SELECT job_name, job_status, metrics, stats FROM sandbox_jobs ORDER BY job_name").fetchall()


def assert_admitted_with_evidence(metrics: list[dict], stats: dict, expected: int) -> None:
    """The row says what the admission gate saw: the count the score rests on, its flags, the evidence record."""
    n_valid = next(m["value"] for m in metrics if m["name"] == "n_valid_trials")
    evidence = stats["evidence"]
    assert stats["n_scored"] == n_valid == evidence["scored"] == evidence["graded"] + evidence["model_failures"]
    assert stats["provisional"] is (n_valid < 150) and stats["partial"] is False
    assert (evidence["gate"], evidence["expected"], evidence["seen"], evidence["identity"]) == (
        GATE_VERSION, expected, expected, "ok")
    assert evidence["infra_share"] <= 0.1 and evidence["invalid"] == 0


def test_loop_converges_then_a_pass_takes_no_action(cluster):
    cluster.write(models=["org/a-8B", "org/b-32B"], datasets=["DCAgent/tiny_a", "DCAgent/tiny_b"],
                  env={"FAKE_HARBOR_TASKS": "6", "FAKE_HARBOR_TRIAL_SECONDS": "0.01"})
    result = cluster.evalctl("reconcile", "--loop", "--interval", "0.5", "--until-done")
    assert "converged after" in result.stdout
    status = json.loads(cluster.evalctl("status", "-o", "json").stdout)["evalruns"][0]
    assert status["counts"] == {"Completed": 4}
    assert all(c["score"] is not None for c in status["cells"])
    stored = rows(cluster)
    assert [r[1] for r in stored] == ["Finished"] * 4
    for _, _, metrics, stats in stored:
        names = [m["name"] for m in json.loads(metrics)]
        assert names[:2] == ["accuracy", "accuracy_stderr"], "metrics are a LIST of {name, value}"
        assert "infra_error_breakdown" in json.loads(stats)
        assert_admitted_with_evidence(json.loads(metrics), json.loads(stats), expected=6 * 3)
    assert all(c["provisional"] is True and c["n_scored"] > 0 for c in status["cells"]), "n < 150: provisional"
    reports = list(Path(cluster.root / "jobs").glob("*/post_eval_report.txt"))
    assert len(reports) == 4
    again = cluster.evalctl("reconcile", "--once")
    assert "0 action(s) done" in again.stdout and "4 × skip: job finished" in again.stdout
    assert rows(cluster) == stored


def test_too_many_infra_errors_are_resumed_once_then_completed(cluster):
    cluster.write(models=["org/a-8B"], datasets=["DCAgent/tiny_a"],
                  env={"FAKE_HARBOR_TASKS": "14", "FAKE_HARBOR_INFRA_ERRORS": "11", "FAKE_HARBOR_TRIAL_SECONDS": "0.01"})
    result = cluster.evalctl("reconcile", "--loop", "--interval", "0.5", "--until-done")
    assert "resume: submitted job 2" in result.stdout, result.stdout
    [(_name, status, _metrics, stats)] = rows(cluster)
    assert status == "Finished" and json.loads(stats)["n_infra_errors"] == 0
    assert len(cluster.scheduler.observe()) == 2, "the original job and exactly one resume"


def test_explain_names_the_rule(cluster):
    cluster.write(models=["org/a-8B"], datasets=["DCAgent/tiny_a"])
    out = cluster.evalctl("explain", "org/a-8B", "DCAgent/tiny_a").stdout
    assert "rule:   RULES §2: none → start (no existing job)" in out
    assert "action: submit: no existing job" in out


def test_the_per_pass_cap_is_shared_by_every_evalrun_on_the_cluster(cluster):
    cluster.write(models=["org/a-8B", "org/b-8B", "org/c-8B"], datasets=["DCAgent/tiny_a"], max_per_pass=2,
                  env={"FAKE_HARBOR_HANG_AFTER": "1", "FAKE_HARBOR_TASKS": "4"})
    first_run = cluster.spec.read_text()
    second_run = first_run[first_run.index("kind: EvalRun"):].replace("name: e2e", "name: e2e-second")
    cluster.spec.write_text(f"{first_run}\n---\napiVersion: evalrun.io/v1alpha1\n{second_run}")
    out = cluster.evalctl("reconcile", "--once").stdout
    assert out.count("submitted job") == 2, out
    assert len(cluster.scheduler.observe()) == 2


def test_a_loop_over_settled_cells_prints_a_line_per_pass(cluster):
    """A log that runs for days: each pass says its line, and only what changed (nothing, once settled)."""
    cluster.write(models=["org/a-8B", "org/b-32B", "org/c-8B"], datasets=["DCAgent/tiny_a", "DCAgent/tiny_b"],
                  env={"FAKE_HARBOR_TASKS": "2", "FAKE_HARBOR_TRIAL_SECONDS": "0.01"})
    assert "converged after" in cluster.evalctl("reconcile", "--loop", "--interval", "0.2", "--until-done").stdout
    command = [sys.executable, "-m", "controller.entry.cli", "reconcile", "--loop", "--interval", "0.1", "-f",
               str(cluster.spec), "--store", cluster.store]
    lines: list[str] = []
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                          text=True, cwd=cluster.root) as loop:
        assert loop.stdout is not None
        while sum(1 for line in lines if line.startswith("e2e: ")) < 200:
            line = loop.stdout.readline()
            assert line, f"the loop ended early:\n{''.join(lines)}"
            lines.append(line)
        loop.send_signal(signal.SIGTERM)
        lines += loop.stdout.readlines()
    assert len(lines) <= 210, "".join(lines[:40])
    assert lines[:2] == ["e2e: 0 action(s) done\n", "  6 × skip: job finished\n"], "the first pass counts its decisions"
    assert all(line == "e2e: 0 action(s) done\n" for line in lines[2:]), "then nothing changed"
