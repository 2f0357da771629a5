"""The eval-monitor rules on the real SLURM cluster, with the fake Harbor under sbatch and the windows shrunk
to seconds: a hang at 98%, a general stall, a zombie and trials landing after the scancel. Each is scancelled,
analysed and uploaded as it is: one job, no resume (a run cut short flagged `partial`, under `upload.partial:
upload`; RULES §14)."""

from __future__ import annotations

import pytest

from tests.fixtures.evalctl import wait_until

pytestmark = pytest.mark.slurm


def write(cluster, env: dict[str, str], monitor: str) -> None:
    cluster.write(models=[cluster.model(1)], datasets=["DCAgent/hangbench"], script=cluster.fake_harbor_script(),
                  env={"FAKE_HARBOR_INFRA_ERRORS": "0", **env}, extra_run=f"  monitor: {monitor}",
                  upload="{partial: upload}")


def passes_until(cluster, phase: str, outputs: list[str], timeout_s: float = 240) -> dict:
    """Acting passes until the cell is in `phase`; each pass's output goes to `outputs`."""

    def reached() -> dict | None:
        outputs.append(cluster.reconcile(check=False).stdout)
        [cell] = cluster.status()["cells"]
        return cell if cell["phase"] == phase else None

    cell = wait_until(reached, f"the cell to be {phase}", timeout_s=timeout_s, step_s=0.5)
    assert isinstance(cell, dict)
    return cell


def assert_scancelled_and_uploaded(cluster, outputs: list[str], rule: str, n_trials: int, partial: bool) -> None:
    text = "".join(outputs)
    assert rule in text and ": resume: " not in text, text[-3000:]
    [sub] = cluster.submissions()
    assert cluster.job_state(sub["job_id"]) == "CANCELLED"
    [row] = cluster.rows()
    assert row["job_status"] == "Finished" and row["stats"]["n_trials"] == n_trials, row["stats"]
    assert row["stats"]["partial"] is partial, row["stats"]
    assert text.count(": upload: ") == 1, "uploaded once"


def test_a_hang_at_98_percent_is_scancelled_and_uploaded_with_the_partial_score(cluster):
    write(cluster, {"FAKE_HARBOR_TASKS": "50", "FAKE_HARBOR_HANG_AFTER": "49"},
          "{nearCompleteFraction: 0.97, staleNearMinutes: 0.05, settleMinutes: 0.05}")
    outputs: list[str] = []

    cell = passes_until(cluster, "Completed", outputs)

    assert_scancelled_and_uploaded(cluster, outputs, "stuck near complete", 49, partial=True)
    assert cell["score"] is not None


def test_a_general_stall_is_reported_then_scancelled_on_the_second_reading(cluster):
    write(cluster, {"FAKE_HARBOR_TASKS": "10", "FAKE_HARBOR_HANG_AFTER": "6"},
          "{staleGeneralMinutes: 0.05, settleMinutes: 0.02}")
    outputs: list[str] = []

    passes_until(cluster, "Stalled", outputs, timeout_s=120)
    passes_until(cluster, "Completed", outputs)

    # the pass that first found it stalled only reported it; the scancel comes from a later pass (a plan read after
    # a pass can already be the second reading on a loaded machine, so the order of the passes' outputs is checked)
    text = "".join(outputs)
    first = next((output for output in outputs if "wait: no new score for" in output), "")
    assert first and "cancel" not in first, text[-3000:]
    assert text.index("wait: no new score for") < text.index("stuck general, second reading"), text[-3000:]
    assert_scancelled_and_uploaded(cluster, outputs, "stuck general, second reading", 6, partial=True)


def test_a_zombie_is_scancelled_and_uploaded(cluster):
    write(cluster, {"FAKE_HARBOR_TASKS": "6", "FAKE_HARBOR_HANG_AFTER": "6"},
          "{zombieGraceMinutes: 0.05, settleMinutes: 0.02}")
    outputs: list[str] = []

    passes_until(cluster, "Completed", outputs)

    assert_scancelled_and_uploaded(cluster, outputs, "zombie", 6, partial=False)


def test_trials_landing_after_the_scancel_are_waited_for_and_counted(cluster):
    write(cluster, {"FAKE_HARBOR_TASKS": "50", "FAKE_HARBOR_HANG_AFTER": "48", "FAKE_HARBOR_WRITE_AFTER_KILL": "2",
                    "FAKE_HARBOR_LATE_TRIAL_SECONDS": "1"},
          "{nearCompleteFraction: 0.95, staleNearMinutes: 0.05, settleMinutes: 0.15}")
    outputs: list[str] = []

    passes_until(cluster, "Completed", outputs)

    # 48 + the 2 written after the scancel; those re-ran tasks 0 and 1 (a killed fire's sandboxes), so 48 of the
    # 50 (task, attempt) pairs have a result: counted once each (n_trials 48), and flagged partial (RULES §14)
    assert_scancelled_and_uploaded(cluster, outputs, "stuck near complete", 48, partial=True)
