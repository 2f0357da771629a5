"""The queue side on SLURM: a stale PENDING job, a reconciler killed right after sbatch, an unreachable slurmctld."""

from __future__ import annotations

import signal

import pytest

from tests.slurm.conftest import ensure_slurmctld_up, slurmctld, wait_until

pytestmark = pytest.mark.slurm


def test_stale_pending_job_is_cancelled_once_and_replaced_by_one_new_attempt(cluster):
    model, dataset = cluster.model(1), "DCAgent/pendbench"
    held = cluster.held_script()  # PENDING (JobHeldUser) for as long as it exists

    def write(stale_pending_hours: float) -> None:
        cluster.write(models=[model], datasets=[dataset], script=held,
                      extra_run=f"  stalePendingHours: {stale_pending_hours}")

    write(6)
    cluster.reconcile()
    [first] = cluster.submissions()
    [queued] = cluster.queue(first["name"])
    assert queued["job_id"] == first["job_id"] and queued["state"] == "PENDING", queued
    [first_row] = cluster.rows()

    write(0)  # every queued job is stale now
    out = cluster.reconcile().stdout
    assert out.count("cancelled job") == 1 and f"cancelled job {first['job_id']}" in out, out
    assert out.count("submitted job") == 1, out
    subs = cluster.submissions()
    assert len(subs) == 2, subs
    second = subs[1]
    assert second["attempt"] == 2 and second["fire"] == 1 and second["run_tag"].endswith("__a2"), second
    assert second["name"] == second["run_tag"] != first["run_tag"]
    assert second["created_at"] > first["created_at"]
    assert cluster.wait_job_final(first["job_id"]) == "CANCELLED"
    assert [(j["job_id"], j["state"]) for j in cluster.queue(second["name"])] == [(second["job_id"], "PENDING")]
    new_row = next(r for r in cluster.rows() if r["job_name"] == second["run_tag"])
    assert new_row["job_status"] == "Pending" and new_row["slurm_job_id"] == second["job_id"]
    assert new_row["submitted_at"] > first_row["submitted_at"], "the new attempt's row is freshly submitted"

    write(6)  # the new job is young: the next pass must leave it queued
    again = cluster.reconcile().stdout
    assert "0 action(s) done" in again and "cancelled job" not in again, again
    assert cluster.submissions() == subs
    assert [j["job_id"] for j in cluster.our_queued_jobs()] == [second["job_id"]]


def test_killed_right_after_sbatch_the_next_pass_adopts_the_job(cluster):
    cluster.write(models=[cluster.model(1)], datasets=["DCAgent/killbench"], script=cluster.sleeper_script())
    killed = cluster.reconcile(kill_at="after-submit")
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
    [sub] = cluster.submissions()
    assert sub["job_id"] is None, "killed before the job id was recorded"
    [job] = cluster.queue(sub["name"])  # but sbatch did queue it

    out = cluster.reconcile().stdout
    assert "submitted job" not in out, f"a second sbatch for the cell:\n{out}"
    [sub] = cluster.submissions()
    assert sub["job_id"] == job["job_id"], "the next pass records the id of the job it found by name"
    [row] = cluster.rows()
    assert row["slurm_job_id"] == job["job_id"]

    cluster.reconcile()  # and a further pass adds nothing either
    assert len(cluster.submissions()) == 1
    assert [j["job_id"] for j in cluster.queue(sub["name"])] == [job["job_id"]]
    accounted = wait_until(lambda: cluster.accounting(sub["name"]), f"sacct to list {sub['name']}")
    assert [j["job_id"] for j in accounted] == [job["job_id"]], accounted
    assert [j["job_id"] for j in cluster.our_queued_jobs()] == [job["job_id"]]


def test_unreachable_slurmctld_makes_every_cell_unknown_and_nothing_is_submitted_or_cancelled(cluster, slurm_lab_alone):
    m1, m2, dataset = cluster.model(1), cluster.model(2), "DCAgent/ctldbench"
    held = cluster.held_script()
    cluster.write(models=[m1], datasets=[dataset], script=held)
    cluster.reconcile()
    [sub] = cluster.submissions()
    assert sub["job_id"]
    # a second model: with the controller up, the next pass would submit for it
    cluster.write(models=[m1, m2], datasets=[dataset], script=held)
    rows_before, subs_before = cluster.rows(), cluster.submissions()
    try:
        stopped = slurmctld("stop", cluster.env)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr

        cells = cluster.plan_cells(code=3)
        assert [c["phase"] for c in cells] == ["Unknown", "Unknown"], cells
        assert all(c["actions"] == [] and "squeue" in c["reason"] for c in cells), cells

        result = cluster.reconcile(check=False)
        assert "Traceback" not in result.stdout + result.stderr, result.stdout + result.stderr
        assert result.returncode == 3 and "queue not observed: squeue" in result.stderr, result.stderr
        assert "submitted job" not in result.stdout and "cancelled job" not in result.stdout, result.stdout
        assert cluster.submissions() == subs_before
        assert cluster.rows() == rows_before

        status = cluster.status(code=3)
        assert status["counts"] == {"Unknown": 2}, status
    finally:
        ensure_slurmctld_up(cluster.env)

    assert [j["job_id"] for j in cluster.queue(sub["name"])] == [sub["job_id"]], "the unseen job was not cancelled"
    # once the controller answers again the passes go on: the new cell gets its job, the old one keeps its own
    cluster.reconcile()
    subs = cluster.submissions()
    assert len(subs) == 2 and subs[0] == subs_before[0] and subs[1]["job_id"], subs
    assert sorted(j["job_id"] for j in cluster.our_queued_jobs()) == sorted(s["job_id"] for s in subs)


def test_a_job_that_fails_at_start_is_held_with_its_log_tail(cluster):
    broken = cluster.script("broken.sbatch", "#!/bin/bash\necho 'loading modules'\n"
                                              "echo 'eval_harbor: no Harbor at /nowhere/bin/harbor' >&2\nexit 3\n")
    cluster.write(models=[cluster.model(1)], datasets=["DCAgent/failbench"], script=broken)
    cluster.reconcile()
    [sub] = cluster.submissions()
    assert cluster.wait_job_final(sub["job_id"]) == "FAILED"
    cluster.reconcile()
    [cell] = cluster.plan_cells()
    assert cell["phase"] == "Failed" and [a["kind"] for a in cell["actions"]] == ["hold"], cell
    assert f"job {sub['job_id']} failed" in cell["reason"]  # before any trial ran, or (no jobs dir) unseen
    assert "no Harbor at /nowhere/bin/harbor" in cell["reason"], "the log tail explains the failure"
    assert len(cluster.submissions()) == 1, "a job that cannot start is not resubmitted"
