"""The hardening rules on the real cluster: distinct identities, one owner per cell, unreadable run dirs,
and secrets printed by a job."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.slurm.conftest import REPO, wait_until

pytestmark = pytest.mark.slurm


def test_cells_whose_names_slug_alike_get_one_job_each(cluster):
    base = cluster.model(1).split("/")[1]
    models = [f"/ckpts/{base}", f"ckpts/{base}"]  # the same slug, two cells
    cluster.write(models=models, datasets=["DCAgent/slugbench"], script=cluster.held_script())
    cluster.reconcile()
    cluster.reconcile()
    names = sorted(j["name"] for j in cluster.our_queued_jobs())
    assert len(names) == 2 and names[0] != names[1], names
    assert {s["name"] for s in cluster.submissions()} == set(names)


def _second_evalrun(cluster, models: list[str]) -> Path:
    """A second spec file: the same EvalCluster, another EvalRun that shares a cell with the first."""
    first = cluster.spec.read_text()
    cluster_doc = first.split("\n---\n")[0]
    run_doc = first.split("\n---\n")[1].replace("name: slurm-e2e}", "name: slurm-e2e-b}")
    run_doc = run_doc.replace(run_doc.split("models: ")[1].split("\n")[0], json.dumps(models))
    path = cluster.root / "second.yaml"
    path.write_text(f"{cluster_doc}\n---\n{run_doc}")
    return path


def test_two_reconcilers_on_overlapping_evalruns_start_one_job_per_cell(cluster):
    shared = cluster.model(2)
    cluster.write(models=[cluster.model(1), shared], datasets=["DCAgent/ownbench"], script=cluster.held_script())
    second = _second_evalrun(cluster, [shared, cluster.model(3)])
    commands = [[sys.executable, "-m", "controller.entry.cli", "reconcile", "--once", "-f", str(spec), "--store",
                 cluster.store] for spec in (cluster.spec, second, cluster.spec)]
    # rounds of three processes at once; one pass at a time launches on the cluster (its launch lease), so a round
    # may launch one EvalRun's cells only: rounds go on until every cell has its job, never a second one
    for _ in range(8):
        procs = [subprocess.Popen(c, env=cluster.env, cwd=REPO, text=True, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, stdin=subprocess.DEVNULL) for c in commands]
        for proc in procs:
            _, err = proc.communicate(timeout=300)
            assert proc.returncode == 0 and "Traceback" not in err, err
        jobs = cluster.our_queued_jobs()
        assert len({j["name"] for j in jobs}) == len(jobs), f"a cell with two jobs: {jobs}"
        if len(jobs) == 3:
            break
    assert len(jobs) == 3 and len({j["name"] for j in jobs}) == 3, jobs
    assert not any(s["name"] == j["name"] for s in cluster.submissions() for j in jobs if s["job_id"] != j["job_id"])
    plans = [json.loads(subprocess.run([sys.executable, "-m", "controller.entry.cli", "plan", "-o", "json", "-f",
                                        str(spec), "--store", cluster.store], env=cluster.env, cwd=REPO, text=True,
                                       capture_output=True, check=True).stdout)["evalruns"][0]["cells"]
             for spec in (cluster.spec, second)]
    watching = [c for cells in plans for c in cells if c["model"] == shared and "owned by EvalRun" in c["reason"]]
    assert len(watching) == 1, plans


def test_an_unreadable_trial_result_holds_the_upload_until_it_can_be_read(cluster):
    cluster.write(models=[cluster.model(1)], datasets=["DCAgent/garblebench"], script=cluster.fake_harbor_script(),
                  env={"FAKE_HARBOR_TASKS": "4", "FAKE_HARBOR_TRIAL_SECONDS": "0.01"})
    cluster.reconcile()
    [sub] = cluster.submissions()
    assert cluster.wait_job_final(sub["job_id"]) == "COMPLETED"
    trial = sorted((cluster.jobs_dir / sub["run_tag"]).glob("*__*/result.json"))[0]
    good, written = trial.read_bytes(), trial.stat()
    trial.write_bytes(good[: len(good) // 2])  # truncated, as by a full disk or a copy cut short

    unread = cluster.reconcile(check=False)
    assert unread.returncode == 3 and "run dirs not observed" in unread.stderr, unread.stderr
    [cell] = cluster.plan_cells(code=3)
    assert cell["phase"] == "Unknown" and str(trial) in cell["reason"], cell
    assert all(r["job_status"] != "Finished" and not r["metrics"] for r in cluster.rows()), "nothing uploaded"
    assert len(cluster.submissions()) == 1, "nothing resumed or resubmitted"

    trial.write_bytes(good)
    os.utime(trial, ns=(written.st_atime_ns, written.st_mtime_ns))  # as it was: a fresh write means "settling"
    cluster.reconcile()
    [row] = cluster.rows()
    assert row["job_status"] == "Finished" and row["metrics"], (row, cluster.plan_cells())


def test_a_key_printed_by_a_failed_job_is_withheld_where_it_cannot_be_masked(cluster):
    secret, variable = "slurm-key-5e6f7a8b9c", "EVALCTL_SECRET_DAYTONA_API_KEY"
    script = cluster.script("leaky.sbatch", '#!/bin/bash\nmkdir -p "$EVAL_JOBS_DIR"\n'
                                            'echo "login with $DAYTONA_API_KEY refused"\nexit 3\n')
    cluster.write(models=[cluster.model(1)], datasets=["DCAgent/leakbench"], script=script,
                  extra_cluster="  secretEnv: [{name: DAYTONA_API_KEY, secretRef: {name: daytona, key: api-key}}]")
    cluster.env = {**cluster.env, variable: secret}
    cluster.reconcile()
    [sub] = cluster.submissions()
    assert cluster.wait_job_final(sub["job_id"]) == "FAILED"
    wait_until(lambda: secret in "".join(p.read_text() for p in cluster.logs_dir.glob("*.out")), "the job's log")
    [cell] = cluster.plan_cells()
    assert cell["phase"] == "Failed" and "login with *** refused" in cell["reason"], cell

    cluster.env = {k: v for k, v in cluster.env.items() if k != variable}
    outputs = [cluster.evalctl("plan", "-o", "json").stdout, cluster.evalctl("status", "-o", "json").stdout]
    assert all(secret not in text for text in outputs) and "withheld" in outputs[0]
    assert secret.encode() not in b"".join(p.read_bytes() for p in cluster.root.glob("store.db*"))
