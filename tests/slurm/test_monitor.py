"""The eval-monitor rules on the real SLURM cluster, with the fake Harbor under sbatch and the windows shrunk
to seconds: a hang at 98% is scancelled, analysed and uploaded as is; a general stall is reported first and
scancelled on the second reading. One job each, no resume."""

from __future__ import annotations

import pytest

from tests.fixtures.evalctl import wait_until

pytestmark = pytest.mark.slurm


def completed_after_passes(cluster, timeout_s: float = 240) -> tuple[dict, str]:
    outputs: list[str] = []

    def done() -> dict | None:
        outputs.append(cluster.reconcile(check=False).stdout)
        [cell] = cluster.status()["cells"]
        return cell if cell["phase"] == "Completed" else None

    cell = wait_until(done, "the cell to be Completed", timeout_s=timeout_s, step_s=1.0)
    assert isinstance(cell, dict)
    return cell, "".join(outputs)


def test_a_hang_at_98_percent_is_scancelled_and_uploaded_with_the_partial_score(cluster):
    cluster.write(models=[cluster.model(1)], datasets=["DCAgent/hangbench"], script=cluster.fake_harbor_script(),
                  env={"FAKE_HARBOR_TASKS": "50", "FAKE_HARBOR_HANG_AFTER": "49", "FAKE_HARBOR_INFRA_ERRORS": "0"},
                  extra_run="  monitor: {nearCompleteFraction: 0.97, staleNearMinutes: 0.05, settleMinutes: 0.05}")

    cell, text = completed_after_passes(cluster)

    assert "stuck near complete" in text and "resume" not in text, text[-3000:]
    [sub] = cluster.submissions()
    assert cluster.job_state(sub["job_id"]) == "CANCELLED"
    [row] = cluster.rows()
    assert row["job_status"] == "Finished" and row["stats"]["n_trials"] == 49, row["stats"]
    assert cell["score"] is not None


def test_a_general_stall_is_reported_then_scancelled_on_the_second_reading(cluster):
    cluster.write(models=[cluster.model(1)], datasets=["DCAgent/hangbench"], script=cluster.fake_harbor_script(),
                  env={"FAKE_HARBOR_TASKS": "10", "FAKE_HARBOR_HANG_AFTER": "6", "FAKE_HARBOR_INFRA_ERRORS": "0"},
                  extra_run="  monitor: {staleGeneralMinutes: 0.05, settleMinutes: 0.02}")

    def stalled() -> dict | None:
        cluster.reconcile(check=False)
        [cell] = cluster.status()["cells"]
        return cell if cell["phase"] == "Stalled" else None

    first = wait_until(stalled, "the first stall reading", timeout_s=120, step_s=0.5)
    _, text = completed_after_passes(cluster)

    assert isinstance(first, dict) and "first reading" in first["reason"], first
    assert "stuck general, second reading" in text and "resume" not in text, text[-3000:]
    [sub] = cluster.submissions()
    assert cluster.job_state(sub["job_id"]) == "CANCELLED"
    [row] = cluster.rows()
    assert row["stats"]["n_trials"] == 6, row["stats"]


def test_a_zombie_is_scancelled_and_uploaded(cluster):
    cluster.write(models=[cluster.model(1)], datasets=["DCAgent/hangbench"], script=cluster.fake_harbor_script(),
                  env={"FAKE_HARBOR_TASKS": "6", "FAKE_HARBOR_HANG_AFTER": "6", "FAKE_HARBOR_INFRA_ERRORS": "0"},
                  extra_run="  monitor: {zombieGraceMinutes: 0.05, settleMinutes: 0.02}")

    _, text = completed_after_passes(cluster)

    assert "zombie" in text and "resume" not in text, text[-3000:]
    [sub] = cluster.submissions()
    assert cluster.job_state(sub["job_id"]) == "CANCELLED"
    [row] = cluster.rows()
    assert row["stats"]["n_trials"] == 6, row["stats"]


def test_trials_landing_after_the_scancel_are_waited_for_and_counted(cluster):
    cluster.write(models=[cluster.model(1)], datasets=["DCAgent/hangbench"], script=cluster.fake_harbor_script(),
                  env={"FAKE_HARBOR_TASKS": "50", "FAKE_HARBOR_HANG_AFTER": "48", "FAKE_HARBOR_INFRA_ERRORS": "0",
                       "FAKE_HARBOR_WRITE_AFTER_KILL": "2", "FAKE_HARBOR_LATE_TRIAL_SECONDS": "1"},
                  extra_run="  monitor: {nearCompleteFraction: 0.95, staleNearMinutes: 0.05, settleMinutes: 0.15}")

    _, text = completed_after_passes(cluster)

    assert "stuck near complete" in text and text.count(": upload: ") == 1, text[-3000:]
    [row] = cluster.rows()
    assert row["stats"]["n_trials"] == 50, "the 2 trials written after the scancel were waited for"
