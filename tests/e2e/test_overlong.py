"""Overlong runs end to end (local scheduler, SQLite, the fake Harbor): with `upload.overlong: upload` (the
default) the run is uploaded and its row says `is_overlong`; with `hold` it waits for `upload.forceUpload`.
`overlongHours` is tiny here so that a run of a second is "overlong"; the rule is the same at 24 h."""

from __future__ import annotations

import json
import sqlite3

from tests.fixtures.evalctl import wait_until

ENV = {"FAKE_HARBOR_TASKS": "4", "FAKE_HARBOR_TRIAL_SECONDS": "0.2"}  # a run of ≥ 1.6 s, sequential trials
OVERLONG_HOURS = 0.0001  # 0.36 s


def stored(cluster) -> list[tuple]:
    with sqlite3.connect(cluster.root / "store.db") as conn:
        return conn.execute("SELECT job_status, is_overlong FROM sandbox_jobs ORDER BY job_name").fetchall()


def cells(cluster) -> list[dict]:
    return json.loads(cluster.evalctl("status", "-o", "json").stdout)["evalruns"][0]["cells"]


def upload_options(**options: object) -> str:
    return "  upload:\n" + "".join(f"    {k}: {json.dumps(v)}\n" for k, v in options.items())


def test_an_overlong_run_is_uploaded_with_its_flag_and_says_so(cluster):
    cluster.write(models=["org/a-8B"], datasets=["DCAgent/tiny_a"], env=ENV,
                  extra_run=upload_options(overlongHours=OVERLONG_HOURS))

    cluster.evalctl("reconcile", "--once")
    wait_until(lambda: not any(j.state.active for j in cluster.scheduler.observe()), "the job to end")

    planned = cluster.evalctl("plan").stdout
    result = cluster.evalctl("reconcile", "--loop", "--interval", "0.5", "--until-done")

    assert "flagged is_overlong: ran" in planned, planned
    assert "uploaded accuracy=0.3636 is_overlong=true" in result.stdout, result.stdout
    assert stored(cluster) == [("Finished", 1)]
    [cell] = cells(cluster)
    assert cell["phase"] == "Completed" and "flagged is_overlong" in cell["reason"]
    again = cluster.evalctl("reconcile", "--once")
    assert "0 action(s) done" in again.stdout and stored(cluster) == [("Finished", 1)]


def test_a_run_within_overlong_hours_is_uploaded_unflagged(cluster):
    cluster.write(models=["org/a-8B"], datasets=["DCAgent/tiny_a"], env=ENV)  # the default: 24 h

    result = cluster.evalctl("reconcile", "--loop", "--interval", "0.5", "--until-done")

    assert "is_overlong" not in result.stdout and stored(cluster) == [("Finished", 0)]


def test_hold_waits_for_force_upload_then_uploads_flagged(cluster):
    cluster.write(models=["org/a-8B"], datasets=["DCAgent/tiny_a"], env=ENV,
                  extra_run=upload_options(overlongHours=OVERLONG_HOURS, overlong="hold"))
    held = cluster.evalctl("reconcile", "--loop", "--interval", "0.5", "--until-done", check=False)
    assert held.returncode == 4 and held.stderr.splitlines()[-1] == "evalctl: 1 held — see `evalctl retry`", \
        held.stderr

    [cell] = cells(cluster)
    assert cell["phase"] == "Failed" and "(is_overlong; upload.overlong: hold)" in cell["reason"], cell
    assert "upload.forceUpload" in cell["reason"] and stored(cluster) == [("Started", 0)]
    explained = cluster.evalctl("explain", "org/a-8B", "DCAgent/tiny_a").stdout
    assert "upload.overlong: hold" in explained

    cluster.write(models=["org/a-8B"], datasets=["DCAgent/tiny_a"], env=ENV,
                  extra_run=upload_options(overlongHours=OVERLONG_HOURS, overlong="hold", forceUpload=True))
    cluster.evalctl("reconcile", "--once")

    assert stored(cluster) == [("Finished", 1)]


def test_a_flag_that_does_not_land_is_not_verified(cluster):
    """A store that drops is_overlong (a trigger here, as a proxy or a policy might): the upload is reported not
    verified, and the finished cell keeps saying its row is not flagged (a Finished row is never re-uploaded)."""
    cluster.write(models=["org/a-8B"], datasets=["DCAgent/tiny_a"], env=ENV,
                  extra_run=upload_options(overlongHours=OVERLONG_HOURS))
    cluster.evalctl("reconcile", "--once")
    wait_until(lambda: not any(j.state.active for j in cluster.scheduler.observe()), "the job to end")
    with sqlite3.connect(cluster.root / "store.db") as conn:
        conn.execute("CREATE TRIGGER drop_flag AFTER UPDATE ON sandbox_jobs WHEN NEW.is_overlong "
                     "BEGIN UPDATE sandbox_jobs SET is_overlong = 0 WHERE id = NEW.id; END")

    result = cluster.evalctl("reconcile", "--once", check=False)

    failed = next(line for line in result.stdout.splitlines() if "✗" in line)
    assert "upload: row" in failed and "reads is_overlong=False, not True" in failed, result.stdout
    [cell] = cells(cluster)
    assert "but its row is not flagged is_overlong" in cell["reason"], cell
