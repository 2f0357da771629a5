"""Resumes on SLURM: a real Harbor job cancelled mid-run, and a job that runs out of walltime twice."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.slurm.conftest import slurm, wait_until

pytestmark = pytest.mark.slurm


def finished_trials(run_dir: Path) -> dict[str, tuple[str, int]]:
    """Trial dir name → (result.json text, mtime_ns), for trials that ended on their own (not cancelled)."""
    done = {}
    for path in run_dir.glob("*/result.json"):
        try:
            text = path.read_text()
            doc = json.loads(text)
        except (OSError, ValueError):
            continue  # being written right now
        if doc.get("finished_at") and (doc.get("exception_info") or {}).get("exception_type") != "CancelledError":
            done[path.parent.name] = (text, path.stat().st_mtime_ns)
    return done


def trial_tasks(run_dir: Path) -> dict[str, str]:
    return {p.parent.name: json.loads(p.read_text())["task_name"] for p in run_dir.glob("*/result.json")}


def test_real_harbor_job_cancelled_mid_run_is_resumed_without_rerunning_finished_trials(cluster, eval_env):
    model, dataset = cluster.model(1), cluster.tiny_dataset("tinyr")
    # timeoutMultiplier 5: the `slow` task's agent runs 15 s (its solution sleeps 20 s), so the job is in flight
    # long after the 3 fast trials ended — a wide window to cancel it with some but not all trials done
    cluster.write(models=[model], datasets=[dataset], env={"EVAL_ENV": str(eval_env)}, time_limit="10",
                  extra_run="  timeoutMultiplier: 5\n  monitor: {preWalltimeMinutes: 1, settleMinutes: 0}")
    cluster.reconcile()
    [first] = cluster.submissions()
    assert first["fire"] == 1 and first["job_id"]
    run_tag, job1 = first["run_tag"], first["job_id"]
    run_dir = cluster.jobs_dir / run_tag

    wait_until(lambda: len(finished_trials(run_dir)) >= 1, "a finished trial in the run dir", step_s=0.2)
    before = finished_trials(run_dir)
    assert 1 <= len(before) < 4, f"want the job cancelled mid-run, but trials done: {sorted(before)}"
    slurm(["scancel", job1], cluster.env)
    assert cluster.wait_job_final(job1) == "CANCELLED"
    assert json.loads((run_dir / "result.json").read_text())["finished_at"] is None

    resumed: list[dict] = []

    def completed() -> bool:
        cluster.reconcile()
        resumed[:] = [s for s in cluster.submissions() if s["fire"] > 1]
        return cluster.status()["counts"] == {"Completed": 1}

    wait_until(completed, "the cell to complete after a resume", timeout_s=600, step_s=1.0)

    subs = cluster.submissions()
    assert [(s["run_tag"], s["fire"]) for s in subs] == [(run_tag, 1), (run_tag, 2)], subs
    second = subs[1]
    assert second["name"] == f"{run_tag}-r1" and second["job_id"] and second["job_id"] != job1
    assert second["row_id"] == first["row_id"], "a resume continues the same row"
    assert cluster.wait_job_final(second["job_id"]) == "COMPLETED"
    log = (cluster.logs_dir / f"{second['name']}_{second['job_id']}.out").read_text()
    assert "jobs resume" in log and f"run_dir={run_dir}" in log, log
    assert "RESUME_COUNT=1\n" in (run_dir / "meta.env").read_text()

    after = finished_trials(run_dir)
    for name, (text, mtime) in before.items():
        assert name in after, f"finished trial {name} was removed"
        assert after[name] == (text, mtime), f"finished trial {name} was re-run or rewritten"
    tasks = trial_tasks(run_dir)
    assert sorted(tasks.values()) == ["fail", "noreward", "pass", "slow"], tasks
    assert json.loads((run_dir / "result.json").read_text())["finished_at"]

    [row] = cluster.rows()
    assert row["job_name"] == run_tag and row["job_status"] == "Finished" and row["metrics"]
    assert [j["job_id"] for j in cluster.accounting(second["name"])] == [second["job_id"]]
    assert [j["job_id"] for j in cluster.accounting(run_tag)] == [job1]


@pytest.mark.slow
def test_timeout_is_resumed_once_then_uploaded_flagged_partial_at_the_resume_limit(cluster):
    model = cluster.model(1)
    # 6 tasks, hang after 2 per fire: fire 1 scores 2 and hangs into TIMEOUT, the resume scores 2 more and hangs
    # again; what is left after the second TIMEOUT is 4/6 (≥ minCompletedFraction 0.5) and, under
    # `upload.partial: upload`, is uploaded as is, flagged partial (RULES §14; by default it would be held).
    # No infra errors: fake Harbor's resume re-runs those, which would shift what each fire completes.
    cluster.write(models=[model], datasets=["DCAgent/hangbench"], script=cluster.fake_harbor_script(),
                  env={"FAKE_HARBOR_TASKS": "6", "FAKE_HARBOR_HANG_AFTER": "2", "FAKE_HARBOR_TRIAL_SECONDS": "0.05",
                       "FAKE_HARBOR_INFRA_ERRORS": "0"},
                  time_limit="1", upload="{partial: upload}",
                  extra_run="  monitor: {preWalltimeMinutes: 0, settleMinutes: 0}\n  resume: {maxTotalFires: 2}")
    cluster.reconcile()
    [first] = cluster.submissions()
    run_dir = cluster.jobs_dir / first["run_tag"]
    # no pass while it runs: the job must reach its --time, not be cancelled by us
    assert cluster.wait_job_final(first["job_id"], timeout_s=300) == "TIMEOUT"
    assert len(list(run_dir.glob("*/result.json"))) == 2

    out = cluster.reconcile().stdout
    subs = cluster.submissions()
    assert [(s["run_tag"], s["fire"]) for s in subs] == [(first["run_tag"], 1), (first["run_tag"], 2)], out
    second = subs[1]
    assert second["job_id"] and second["name"] == f"{first['run_tag']}-r1"
    assert cluster.wait_job_final(second["job_id"], timeout_s=300) == "TIMEOUT"
    assert len(list(run_dir.glob("*/result.json"))) == 4

    def held() -> dict | None:
        cluster.reconcile()
        [cell] = cluster.status()["cells"]
        return cell if cell["phase"] == "Failed" else None

    cell = wait_until(held, "the cell to be held at the resume limit", timeout_s=120, step_s=1.0)
    assert "resume limit" in cell["reason"], cell
    assert [a["kind"] for a in cell["actions"]] == ["hold"], cell
    assert cell["score"] is not None

    [row] = cluster.rows()
    assert row["job_status"] == "Finished" and row["metrics"], row
    assert row["stats"]["n_trials"] == 4 and row["stats"]["partial"] is True, row["stats"]
    assert {m["name"]: m["value"] for m in row["metrics"]}["n_valid_trials"] == 4
    assert len(cluster.submissions()) == 2, "no third fire past resume.maxTotalFires"
    again = cluster.reconcile().stdout
    assert "0 action(s) done" in again, again
    assert len(cluster.submissions()) == 2
    assert cluster.our_queued_jobs() == []
