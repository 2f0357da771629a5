"""A passed preflight is remembered for the process (a `--loop` or the operator checks a cluster once); a failed
one runs again every pass, so a fix is picked up by itself; an edited cluster is checked again (RULES §12)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from controller.adapters.scheduler.commands import CommandResult, LocalCommands
from controller.api.loader import LoadedCluster, load_objects
from controller.entry import preflight as module
from controller.entry.preflight import preflight_target, remembered_preflight


class Counting:
    """This host's commands, counted."""

    def __init__(self) -> None:
        self.calls = 0

    def run(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, timeout: float,
            stdin: str | None = None) -> CommandResult:
        self.calls += 1
        return LocalCommands().run(argv, env=env, timeout=timeout, stdin=stdin)


def cluster(tmp_path: Path, jobs_dir: Path, **spec: Any) -> LoadedCluster:
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\n")
    meta = {"apiVersion": "evalrun.io/v1alpha1", "metadata": {"name": "c1"}}
    data = {**meta, "kind": "EvalCluster", "spec": {"scheduler": {"type": "local"}, "jobsDir": str(jobs_dir),
                                                    "logsDir": str(tmp_path / "logs"), "jobScript": str(script),
                                                    **spec}}
    return next(iter(load_objects([data], tmp_path).clusters.values()))


@pytest.fixture(autouse=True)
def fresh_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(module, "_PASSED", set())


def test_a_passed_preflight_runs_once_per_process(tmp_path: Path) -> None:
    runner = Counting()
    check = remembered_preflight(cluster(tmp_path, tmp_path / "jobs"), lambda: runner)
    first, second = check(), check()
    assert first.ok and second.ok and runner.calls == 1
    again = remembered_preflight(cluster(tmp_path, tmp_path / "jobs"), lambda: runner)()  # the next pass's ports
    assert again.ok and runner.calls == 1


def test_a_failed_preflight_runs_every_pass_until_fixed_then_is_remembered(tmp_path: Path) -> None:
    blocker = tmp_path / "jobs"
    blocker.write_text("not a directory\n")
    runner = Counting()
    check = remembered_preflight(cluster(tmp_path, blocker), lambda: runner)
    assert [f.field for f in check().failures] == ["jobsDir"]
    assert [f.field for f in check().failures] == ["jobsDir"] and runner.calls == 2
    blocker.unlink()
    assert check().ok and check().ok and runner.calls == 3


def test_an_edited_cluster_is_checked_again(tmp_path: Path) -> None:
    runner = Counting()
    assert remembered_preflight(cluster(tmp_path, tmp_path / "jobs"), lambda: runner)().ok
    assert remembered_preflight(cluster(tmp_path, tmp_path / "jobs", maxLiveJobs=3), lambda: runner)().ok
    assert runner.calls == 2


def test_what_a_cluster_checks_follows_where_its_jobs_run(tmp_path: Path) -> None:
    """Local: no SLURM checks, no python (nothing runs the probe here); over ssh: the login node's python; a jobs
    dir that is a URL is not checked by a shell."""
    here = preflight_target(cluster(tmp_path, tmp_path / "jobs", partition="gpu"))
    assert (here.slurm, here.partition, here.python, here.host, here.remote) == (False, None, None, "this host", False)
    login = preflight_target(cluster(tmp_path, Path("/scratch/jobs"), scheduler={"type": "slurm", "ssh": "hpc1"},
                                     partition="gpu", account="proj", logsDir="/scratch/logs", jobScript="/x.sbatch"))
    assert (login.slurm, login.partition, login.account, login.python, login.host, login.remote) == (
        True, "gpu", "proj", "python3", "hpc1", True)
    on_s3 = preflight_target(cluster(tmp_path, tmp_path, jobsDir="s3://bucket/jobs",
                                     scheduler={"type": "slurm", "ssh": "hpc1"}, logsDir="/scratch/logs",
                                     jobScript="/x.sbatch"))
    assert (on_s3.jobs_dir, on_s3.python) == (None, None)
