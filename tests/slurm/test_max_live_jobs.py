"""`maxLiveJobs` on the lab SLURM: two EvalRuns of 5 cells each on one cluster, reconciled by two processes looping
at once, never have more than 3 of our jobs queued or running at any observation (issue 20).

The jobs are queued held (`#SBATCH --hold`): real sbatch submissions that stay live and never take a CPU. The
ceiling holds across processes because launches on a cluster are one pass's at a time (its launch lease, taken
before the queue is read)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tests.slurm.conftest import wait_until

pytestmark = pytest.mark.slurm
CEILING = 3


def test_two_processes_on_two_evalruns_never_exceed_max_live_jobs(cluster) -> None:
    cluster.write(models=[cluster.model(i) for i in range(5)], datasets=["DCAgent/livea"],
                  script=cluster.held_script(), extra_cluster=f"  maxLiveJobs: {CEILING}")
    first = cluster.spec.read_text()
    second_spec = cluster.spec.with_name("second.yaml")
    second_spec.write_text(first.replace("name: slurm-e2e", "name: slurm-e2e-second").replace("-m", "-second-m"))
    loops = [subprocess.Popen([sys.executable, "-m", "controller.entry.cli", "reconcile", "--loop", "--interval",
                               "0.2", "-f", str(spec), "--store", cluster.store], env=cluster.env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
             for spec in (cluster.spec, second_spec)]
    seen: list[int] = []
    try:
        def sampled() -> bool:
            seen.append(len(cluster.our_queued_jobs()))
            assert seen[-1] <= CEILING, f"our live jobs at each observation: {seen}"
            return seen[-1] == CEILING and len(seen) >= 20

        wait_until(sampled, "the ceiling reached, and observed for a while", timeout_s=120, step_s=0.1)
        deadline = time.monotonic() + 5  # both loops go on passing: the ceiling must keep holding
        while time.monotonic() < deadline:
            seen.append(len(cluster.our_queued_jobs()))
    finally:
        for loop in loops:
            loop.terminate()
            loop.wait(timeout=60)
    assert max(seen) == CEILING, f"our live jobs at each observation: {seen}"
