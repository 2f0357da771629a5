"""RULES §12 `PreflightFailed` on a local cluster, end to end: a jobs dir nobody can write (immutable, so even root
cannot) makes `reconcile` hold every launch with the reason — no job, no row, no submission — and `plan`, `status`
and `explain` say why; once it is fixed, the next run submits. `validate --remote` reports the same at the field."""

from __future__ import annotations

import json
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import Cluster

HANGING = {"FAKE_HARBOR_HANG_AFTER": "1", "FAKE_HARBOR_TASKS": "4"}


@pytest.fixture
def immutable_jobs_dir(cluster: Cluster) -> Iterator[Path]:
    """The cluster's jobs dir, made immutable (`chattr +i`: no new entry, whoever asks); skipped where the file
    system or this user cannot do that. Made mutable again afterwards, or the tmp dir could not be removed."""
    jobs = cluster.root / "jobs"
    jobs.mkdir()
    made = subprocess.run(["chattr", "+i", str(jobs)], capture_output=True, text=True, check=False)
    if made.returncode != 0:
        pytest.skip(f"chattr +i is not available here: {made.stderr.strip()}")
    try:
        yield jobs
    finally:
        subprocess.run(["chattr", "-i", str(jobs)], check=False)


def rows(cluster: Cluster, sql: str) -> list[tuple]:
    with sqlite3.connect(cluster.root / "store.db") as conn:
        try:
            return conn.execute(sql).fetchall()
        except sqlite3.OperationalError:  # no such table: nothing was ever written
            return []


def test_an_unwritable_jobs_dir_holds_every_launch_until_it_is_fixed(cluster: Cluster, immutable_jobs_dir: Path) -> None:
    cluster.write(models=["org/a-8B", "org/b-8B"], datasets=["DCAgent/tiny_a"], env=HANGING)
    why = f"jobsDir {immutable_jobs_dir} on this host is not writable by root"

    out = cluster.evalctl("reconcile", "--once").stdout
    assert "submitted job" not in out and "2 × hold: no launch on local until its preflight passes" in out, out
    assert f"launches held: the preflight of local failed: {why}" in out, out
    assert cluster.scheduler.observe() == (), "no job submitted"
    assert rows(cluster, "SELECT id FROM sandbox_jobs") == [] and rows(cluster, "SELECT name FROM evalrun_submissions") == []

    [run] = json.loads(cluster.evalctl("plan", "-o", "json").stdout)["evalruns"]
    assert run["preflight"].startswith(f"the preflight of local failed: {why}")
    assert {c["rule"] for c in run["cells"]} == {"PreflightFailed"}
    assert all(why in c["reason"] for c in run["cells"])
    [status] = json.loads(cluster.evalctl("status", "-o", "json").stdout)["evalruns"]
    stalled = {c["type"]: c for c in status["conditions"]}["Stalled"]
    assert stalled["reason"] == "PreflightFailed" and why in stalled["message"]
    explained = cluster.evalctl("explain", "org/a-8B", "DCAgent/tiny_a").stdout
    assert "rule:   RULES §12: the cluster's preflight failed" in explained and why in explained, explained

    validated = cluster.evalctl("validate", "--remote", "-f", str(cluster.spec), check=False)
    assert validated.returncode == 2, validated.stdout + validated.stderr
    assert validated.stderr.startswith(f"{cluster.spec}:7:12: cluster local: {why}"), validated.stderr

    subprocess.run(["chattr", "-i", str(immutable_jobs_dir)], check=True)
    out = cluster.evalctl("reconcile", "--once").stdout
    assert out.count("submitted job") == 2 and "launches held" not in out, out
    assert len([job for job in cluster.scheduler.observe() if job.state.active]) == 2
    assert len(rows(cluster, "SELECT name FROM evalrun_submissions")) == 2, "the table the hold is checked against"
