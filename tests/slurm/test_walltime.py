"""`walltime: auto` on the lab SLURM (RULES §16): after an attempt of the benchmark has finished, a fresh EvalRun's
job asks sbatch for the sized --time (here 30 min: the attempt took seconds, its server start among them, and every
job is given the pre-walltime cancel), not the fixed timeLimit; `fixed` still asks for timeLimit. What SLURM recorded is
read back with scontrol; once the job ended, how long it ran is recorded beside its estimate, and status says how
the sized jobs fared."""

from __future__ import annotations

import json
import re

import pytest

from tests.slurm.conftest import SlurmCluster, slurm, wait_until
from tests.slurm.test_gpu_hours import FAST, GPUS, complete

pytestmark = pytest.mark.slurm


def write(cluster: SlurmCluster, *, name: str, model: str, extra_run: str = "") -> None:
    """A cluster whose fixed walltime is 4 h, whose partition allows 48 h, and whose sized jobs ask for 15 min at
    least."""
    cluster.write(models=[model], datasets=["DCAgent/gpubench"], script=cluster.fake_harbor_script(), env=FAST,
                  name=name, time_limit="4:00:00", extra_run=f"  monitor: {{settleMinutes: 0}}\n{extra_run}",
                  extra_cluster=f'  gpusPerJob: {GPUS}\n  maxTimeLimit: "48:00:00"\n  minTimeLimit: "00:15:00"')


def asked_time(cluster: SlurmCluster, job_id: str) -> str:
    """The TimeLimit SLURM holds for the job, as `scontrol show job` prints it."""
    out = slurm(["scontrol", "show", "job", job_id], cluster.env).stdout
    found = re.search(r"\bTimeLimit=(\S+)", out)
    assert found is not None, out
    return found.group(1)


def _ran(cluster: SlurmCluster, name: str) -> tuple[float, float] | None:
    """A pass, then the sized job's (estimated, elapsed) hours once its end is recorded."""
    cluster.reconcile()
    rows = [r for r in cluster._query("SELECT evalrun, estimated_hours, elapsed_hours FROM evalrun_submissions")
            if name in r["evalrun"]]
    ended = rows and rows[0]["elapsed_hours"] is not None
    return (rows[0]["estimated_hours"], rows[0]["elapsed_hours"]) if ended else None


def submitted_job(cluster: SlurmCluster, name: str) -> str:
    cluster.reconcile()
    rows = [r for r in cluster._query("SELECT evalrun, job_id FROM evalrun_submissions") if name in r["evalrun"]]
    assert len(rows) == 1 and rows[0]["job_id"], rows
    return str(rows[0]["job_id"])


def test_with_history_a_job_asks_for_its_sized_time_and_fixed_still_asks_for_the_time_limit(
        cluster: SlurmCluster) -> None:
    write(cluster, name="walltime-first", model=cluster.model(1))
    assert complete(cluster)["gpu_hours"] > 0  # the history the next EvalRun's estimate is read from

    write(cluster, name="walltime-auto", model=cluster.model(2), extra_run="  walltime: auto")
    (planned,) = cluster.plan_cells()
    assert "walltime auto: 0:30:00 = p90 under 1 m × 1.25 + 15 m pre-walltime cancel (its server start is in the " \
           "estimate)" in planned["reason"], planned["reason"]
    assert "from 1 finished attempt(s)" in planned["reason"]
    assert asked_time(cluster, submitted_job(cluster, "walltime-auto")) == "00:30:00"
    estimated, elapsed = wait_until(lambda: _ran(cluster, "walltime-auto"), "the sized job's end recorded", step_s=1.0)
    assert 0 < estimated < 0.01 and 0 <= elapsed < 0.01, "seconds, estimated and run"
    learning = json.loads(cluster.evalctl("status", "-o", "json").stdout)["evalruns"][0]["walltime"]
    assert (learning["jobs"], learning["margin"]) == (1, 1.25), "one job says how it fared, the margin waits for 5"

    write(cluster, name="walltime-fixed", model=cluster.model(3))
    assert asked_time(cluster, submitted_job(cluster, "walltime-fixed")) == "04:00:00"
