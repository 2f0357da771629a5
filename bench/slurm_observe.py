"""How long one pass's SLURM observation takes with a big queue: ONE squeue + ONE sacct, parsed.

Queues N held jobs (they never run) with distinct `ev_` names, as a 700-cell EvalRun would, then times
`SlurmScheduler.observe()` a few times and cancels them all. Needs the lab cluster (scripts/slurm-up.sh)
and SLURM_CONF in the environment. Prints figures; asserts nothing about time.

    SLURM_CONF=/tmp/evalrun-slurm/etc/slurm.conf .venv/bin/python bench/slurm_observe.py [N]
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
import uuid

from controller.adapters.scheduler.commands import LocalCommands
from controller.adapters.scheduler.slurm import SlurmOptions, SlurmScheduler


def main(n_jobs: int) -> None:
    run = uuid.uuid4().hex[:8]
    job_ids = []
    started = time.perf_counter()
    for i in range(n_jobs):
        out = subprocess.run(["sbatch", "--parsable", "--hold", f"--job-name=ev_bench_{run}_{i:04d}",
                              "--output=/dev/null", "--time=1", "--wrap=true"],
                             capture_output=True, text=True, check=True).stdout
        job_ids.append(out.strip().split(";")[0])
    print(f"queued {n_jobs} held jobs in {time.perf_counter() - started:.1f} s")
    scheduler = SlurmScheduler(LocalCommands(), SlurmOptions(), logs_dir="/dev/null")
    try:
        timings = []
        for _ in range(5):
            t0 = time.perf_counter()
            jobs = scheduler.observe()
            timings.append(time.perf_counter() - t0)
        ours = sum(1 for job in jobs if job.name.startswith(f"ev_bench_{run}_"))
        print(f"observe (1 squeue + 1 sacct): median {statistics.median(timings):.3f} s, "
              f"max {max(timings):.3f} s over 5 passes; {len(jobs)} ev_ jobs seen, {ours} of them the bench's")
    finally:
        for chunk in range(0, len(job_ids), 500):
            subprocess.run(["scancel", *job_ids[chunk:chunk + 500]], check=False)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 700)
