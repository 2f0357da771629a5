"""The main job on SLURM with real Harbor: 2 models × 2 datasets converge pass by pass, then a pass does nothing."""

from __future__ import annotations

import pytest

from tests.fixtures.browser import render
from tests.slurm.conftest import wait_until

pytestmark = pytest.mark.slurm

# tiny dataset, oracle agent: pass 1.0, fail 0.0, slow 0.0 (AgentTimeoutError, graded: the model's failure),
# noreward no reward (RewardFileNotFoundError: infra, left out, within the suite's maxInfraErrorFraction 0.25)
# → 1 / 3 scored trials
TINY_ACCURACY = 1 / 3


def test_four_cells_converge_with_real_harbor_then_a_pass_takes_no_action(cluster, eval_env, chromium):
    models = [cluster.model(1), cluster.model(2)]
    datasets = [cluster.tiny_dataset("tinya"), cluster.tiny_dataset("tinyb")]
    cluster.write(models=models, datasets=datasets, env={"EVAL_ENV": str(eval_env)}, time_limit="10",
                  extra_run="  monitor: {preWalltimeMinutes: 1, settleMinutes: 0}")

    first = cluster.reconcile()
    assert "4 action(s) done" in first.stdout, first.stdout
    subs = cluster.submissions()
    assert len(subs) == 4 and all(s["fire"] == 1 and s["job_id"] for s in subs), subs
    rows = cluster.rows()
    assert [r["job_status"] for r in rows] == ["Pending"] * 4, "a row is written Pending before sbatch"
    assert {r["job_name"] for r in rows} == {s["run_tag"] for s in subs}

    history: dict[str, list[str]] = {r["job_name"]: ["Pending"] for r in rows}

    def converged() -> bool:
        cluster.reconcile()
        for row in cluster.rows():
            seen = history.setdefault(row["job_name"], [])
            if not seen or seen[-1] != row["job_status"]:
                seen.append(row["job_status"])
        return cluster.status()["counts"] == {"Completed": 4}

    wait_until(converged, "all 4 cells Completed", timeout_s=600, step_s=1.0)

    assert any("Started" in h for h in history.values()), f"no row was ever seen Started: {history}"
    for tag, seen in history.items():
        assert seen[0] == "Pending" and seen[-1] == "Finished", f"{tag}: {seen}"
        assert seen in (["Pending", "Finished"], ["Pending", "Started", "Finished"]), f"{tag} went back: {seen}"

    status = cluster.status()
    assert {(c["model"], c["dataset"]) for c in status["cells"]} == {(m, d) for m in models for d in datasets}
    assert all(c["score"] == pytest.approx(TINY_ACCURACY) for c in status["cells"]), status["cells"]

    final_rows = cluster.rows()
    subs = cluster.submissions()
    assert len(subs) == 4 and all(s["fire"] == 1 for s in subs), f"no resume was needed: {subs}"
    job_of = {s["run_tag"]: s["job_id"] for s in subs}
    for row in final_rows:
        assert row["job_status"] == "Finished"
        names = [m["name"] for m in row["metrics"]]
        assert names[:2] == ["accuracy", "accuracy_stderr"], "metrics are a LIST of {name, value}"
        assert row["metrics"][0]["value"] == pytest.approx(TINY_ACCURACY)
        assert row["slurm_job_id"] == job_of[row["job_name"]]
        [job] = cluster.accounting(row["job_name"])
        assert job["job_id"] == row["slurm_job_id"] and job["state"] == "COMPLETED", job
        log = (cluster.logs_dir / f"{row['job_name']}_{job['job_id']}.out").read_text()
        assert "bin/harbor run " in log and "jobs resume" not in log, log
        assert (cluster.jobs_dir / row["job_name"] / "result.json").is_file()

    again = cluster.reconcile()
    assert "0 action(s) done" in again.stdout and "4 × skip: job finished" in again.stdout, again.stdout
    assert cluster.rows() == final_rows
    assert cluster.submissions() == subs
    assert cluster.our_queued_jobs() == []

    report = cluster.root / "report.html"
    cluster.evalctl("report", "--out", str(report))
    shown = render(chromium, report, "report-slurm.png")
    assert sorted(shown.cells) == sorted(f"{m}|{d}" for m in models for d in datasets)
    assert sorted(shown.provisional) == sorted(shown.cells), "4 trials each: far below the trust threshold"
    assert shown.console_errors == [] and len(shown.requests) == 1


@pytest.mark.postgres
def test_the_lab_converges_on_a_postgres_store(cluster, eval_env, pg_url):
    """The same lab, the store in PostgreSQL: real Harbor under real SLURM, rows in the lab's tables."""
    import psycopg

    cluster.store = pg_url
    models, datasets = [cluster.model(1)], [cluster.tiny_dataset("tinya")]
    cluster.write(models=models, datasets=datasets, env={"EVAL_ENV": str(eval_env)}, time_limit="10",
                  extra_run="  monitor: {preWalltimeMinutes: 1, settleMinutes: 0}")

    def converged() -> bool:
        cluster.reconcile()
        return cluster.status()["counts"] == {"Completed": 1}

    wait_until(converged, "the cell Completed", timeout_s=600, step_s=1.0)

    with psycopg.connect(pg_url) as conn:
        rows = conn.execute("SELECT job_status, metrics->0->>'value', slurm_job_id FROM sandbox_jobs").fetchall()
        [(job_id,)] = conn.execute("SELECT job_id FROM evalrun_submissions").fetchall()
    assert [(status, float(score)) for status, score, _ in rows] == [("Finished", pytest.approx(TINY_ACCURACY))]
    assert rows[0][2] == job_id
    assert "0 action(s) done" in cluster.reconcile().stdout
