"""Two independent SLURM clusters on one machine (scripts/slurm-up.sh with SLURM_LAB / SLURM_PORT_BASE), the ground
multi-cluster EvalRuns stand on: each runs its own jobs with its own GPUs, accounts only them, and keeps working
while the other's controller is down."""

from __future__ import annotations

import random
import string

import pytest

from tests.slurm.conftest import ensure_slurmctld_up, slurm, slurmctld, wait_until

pytestmark = pytest.mark.slurm


def submit(env: dict[str, str], name: str) -> str:
    """A 1-CPU job holding one fake GPU until cancelled (the test cancels it; --time bounds a leftover)."""
    out = slurm(["sbatch", "--parsable", f"--job-name={name}", "--cpus-per-task=1", "--gres=gpu:1", "--time=5",
                 "--output=/dev/null", "--wrap", "exec sleep 300"], env).stdout
    return out.strip().split(";")[0]


def queued_state(env: dict[str, str], job_id: str) -> str:
    return slurm(["squeue", "-h", "-j", job_id, "-o", "%T"], env, check=False).stdout.strip()


def accounted(env: dict[str, str], *names: str) -> dict[str, tuple[str, str]]:
    """sacct of this cluster, allocations of the given job names: name → (Cluster, AllocTRES)."""
    out = slurm(["sacct", "-n", "-P", "-X", "-S", "now-1days", "--name", ",".join(names),
                 "-o", "JobName,Cluster,AllocTRES"], env).stdout
    return {name: (cluster, tres) for name, cluster, tres in (line.split("|") for line in out.splitlines())}


def cluster_name(env: dict[str, str]) -> str:
    config = slurm(["scontrol", "show", "config"], env).stdout
    return next(line.split("=", 1)[1].strip() for line in config.splitlines() if line.startswith("ClusterName"))


def test_two_labs_run_side_by_side_and_one_controller_down_leaves_the_other_working(slurm_env, slurm_lab_b_alone):
    lab_a, lab_b = slurm_env, slurm_lab_b_alone
    uid = "".join(random.choices(string.ascii_lowercase, k=8))
    name_a, name_b = f"twolabs_{uid}_a", f"twolabs_{uid}_b"
    assert (cluster_a := cluster_name(lab_a)) == "evalrun"
    assert (cluster_b := cluster_name(lab_b)) == "evalrun-b"
    jobs: list[tuple[dict[str, str], str]] = []
    try:
        jobs.append((lab_a, job_a := submit(lab_a, name_a)))
        jobs.append((lab_b, job_b := submit(lab_b, name_b)))
        wait_until(lambda: queued_state(lab_a, job_a) == "RUNNING" and queued_state(lab_b, job_b) == "RUNNING",
                   "both jobs RUNNING at once, each on its own cluster")

        # each cluster accounts its own job, with its fake GPU, and never the other's
        seen_a = wait_until(lambda: accounted(lab_a, name_a, name_b), f"lab a's sacct to list {name_a}")
        seen_b = wait_until(lambda: accounted(lab_b, name_a, name_b), f"lab b's sacct to list {name_b}")
        assert list(seen_a) == [name_a] and seen_a[name_a][0] == cluster_a, seen_a
        assert list(seen_b) == [name_b] and seen_b[name_b][0] == cluster_b, seen_b
        assert "gres/gpu=1" in seen_a[name_a][1] and "gres/gpu=1" in seen_b[name_b][1], (seen_a, seen_b)

        # lab b's controller down: lab a still answers and runs its job; lab b's squeue fails
        stopped = slurmctld("stop", lab_b)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert slurmctld("status", lab_b).returncode == 1
        assert slurmctld("status", lab_a).returncode == 0, "stopping lab b's controller stopped lab a's"
        assert queued_state(lab_a, job_a) == "RUNNING"
        down = slurm(["squeue", "-h"], lab_b, check=False)
        assert down.returncode != 0 and "Unable to contact slurm controller" in down.stderr, down

        # back up, lab b still knows its job, which ran on under its slurmd meanwhile
        started = slurmctld("start", lab_b)
        assert started.returncode == 0, started.stdout + started.stderr
        assert queued_state(lab_b, job_b) == "RUNNING"
        assert queued_state(lab_a, job_a) == "RUNNING"
    finally:
        ensure_slurmctld_up(lab_b)
        for env, job_id in jobs:
            slurm(["scancel", job_id], env, check=False)
