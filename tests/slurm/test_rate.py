"""Submission caps on SLURM: maxSubmissionsPerPass per pass, and the cluster's submissionsPerMinute across passes.

The jobs are queued held (`#SBATCH --hold`): real sbatch submissions that never take a CPU.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from tests.slurm.conftest import recent_ev_submissions, wait_until

pytestmark = pytest.mark.slurm


def test_fifty_cells_are_submitted_five_per_pass(cluster):
    models = [cluster.model(i) for i in range(25)]
    cluster.write(models=models, datasets=["DCAgent/ratea", "DCAgent/rateb"], script=cluster.held_script(),
                  max_per_pass=5, per_minute=600)
    seen: list[str] = []
    for n_pass in (1, 2, 3):
        out = cluster.reconcile().stdout
        assert "5 action(s) done" in out and out.count("submitted job") == 5, out
        subs = cluster.submissions()
        assert len(subs) == 5 * n_pass, subs
        assert all(s["job_id"] and s["fire"] == 1 for s in subs)
        assert len({s["run_tag"] for s in subs}) == 5 * n_pass, "each cell is submitted once"
        assert [s["name"] for s in subs][:len(seen)] == seen, "earlier submissions stay as they were"
        seen = [s["name"] for s in subs]
        queued = cluster.our_queued_jobs()
        assert sorted(j["job_id"] for j in queued) == sorted(s["job_id"] for s in subs)
        assert len(cluster.rows()) == 5 * n_pass
    cells = cluster.plan_cells()
    launching = [c for c in cells if any(a["kind"] == "submit" for a in c["actions"])]
    waiting = [c for c in cells if any("budget" in a["reason"] for a in c["actions"])]
    assert len(cells) == 50 and len(launching) == 5 and len(waiting) == 50 - 15 - 5, \
        "the next pass would again launch exactly 5; the rest wait for their turn"


def test_submissions_per_minute_caps_launches_across_passes(cluster):
    models = [cluster.model(i) for i in range(5)]
    cluster.write(models=models, datasets=["DCAgent/ratec", "DCAgent/rated"], script=cluster.held_script(),
                  max_per_pass=5, per_minute=6)
    # the rate counts every ev_* job of ours submitted in the last minute, other tests' included: start from none
    wait_until(lambda: recent_ev_submissions(cluster.env, datetime.now(UTC)) == 0,
               "a minute without ev_* submissions", timeout_s=300, step_s=2.0)

    counts = []
    for _ in range(3):
        cluster.reconcile()
        counts.append(len(cluster.submissions()))
    foreign = recent_ev_submissions(cluster.env, datetime.now(UTC)) - len(cluster.submissions())
    assert counts == [5, 6, 6], f"cumulative submissions after passes 1-3: {counts} " \
                                f"(ev_* jobs of other tests in the last minute: {foreign})"
    subs = cluster.submissions()
    assert all(s["job_id"] for s in subs)
    assert sorted(j["job_id"] for j in cluster.our_queued_jobs()) == sorted(s["job_id"] for s in subs)
