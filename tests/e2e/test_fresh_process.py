"""`evalctl plan` is a fresh process every time (cron, GitOps CI): it remembers finished run dirs through the
run-dir cache, reading none of their trial results, and reads again a dir whose job file changed (issue 19).

What was read is told by the trial results themselves: once the EvalRun converged, they are overwritten with
garbage (the dirs' own stat kept), which any read would make the cell Unknown over.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


def _phases(cluster) -> dict[str, str]:
    result = cluster.evalctl("plan", "-o", "json", check=False)
    plan = json.loads(result.stdout)
    unknown = any(cell["phase"] == "Unknown" for run in plan["evalruns"] for cell in run["cells"])
    assert result.returncode == (3 if unknown else 0), result.stderr  # a run dir not read: exit 3
    return {cell["model"]: cell["phase"] for run in plan["evalruns"] for cell in run["cells"]}


def _garble_trial_results(run: Path) -> None:
    for result in run.glob("*__*/result.json"):
        stat = result.stat()
        result.write_text("{garbage")
        os.utime(result, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def test_a_fresh_plan_reads_no_trial_of_a_finished_dir_and_rereads_one_whose_job_file_changed(cluster) -> None:
    cluster.write(models=["org/a-8B", "org/b-8B"], datasets=["DCAgent/tiny_a"])
    cluster.evalctl("reconcile", "--loop", "--interval", "0.5", "--until-done")
    assert _phases(cluster) == {"org/a-8B": "Completed", "org/b-8B": "Completed"}
    runs = sorted((cluster.root / "jobs").glob("ev_*"))
    assert len(runs) == 2
    for run in runs:
        _garble_trial_results(run)

    assert _phases(cluster) == {"org/a-8B": "Completed", "org/b-8B": "Completed"}, "a trial result was read"

    edited = runs[0] / "result.json"
    edited.write_text(edited.read_text() + "\n")  # what a resume does to it
    phases = _phases(cluster)
    assert sorted(phases.values()) == ["Completed", "Unknown"], phases
