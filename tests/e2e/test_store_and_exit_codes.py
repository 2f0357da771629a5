"""Where the state lives and what the exit codes say (issue 29): real `evalctl` processes, the local scheduler and
the fake Harbor, SQLite; a SLURM cluster with no `squeue` on PATH for the sources that cannot be read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

from tests.e2e.conftest import Cluster

FAST = {"FAKE_HARBOR_TASKS": "2", "FAKE_HARBOR_TRIAL_SECONDS": "0.01"}
CELL = ("org/a-8B", "DCAgent/tiny_a")
UNTIL_DONE = ("reconcile", "--loop", "--interval", "0.2", "--until-done", "--timeout", "3m")


def evalctl(*args: str, cwd: Path, specs: tuple[Path, ...], env: Mapping[str, str] | None = None,
            ) -> subprocess.CompletedProcess[str]:
    """`evalctl ARGS -f SPEC…` run from `cwd`, with no store named unless `args` or `env` name one."""
    environment = {k: v for k, v in os.environ.items() if k not in ("EVALCTL_STORE", "EVALCTL_STATE")}
    command = [sys.executable, "-m", "controller.entry.cli", *args, *(x for s in specs for x in ("-f", str(s)))]
    return subprocess.run(command, capture_output=True, text=True, cwd=cwd, stdin=subprocess.DEVNULL, timeout=300,
                          check=False, env={**environment, "COLUMNS": "250", **(env or {})})


def default_store(cluster: Cluster) -> Path:
    return cluster.root / ".evalctl" / "store.db"


def first_line(result: subprocess.CompletedProcess[str]) -> str:
    return result.stderr.splitlines()[0]


@pytest.fixture
def elsewhere(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Another working directory, as cron's $HOME is."""
    return tmp_path_factory.mktemp("elsewhere")


def test_status_from_another_directory_reads_the_store_next_to_the_spec(cluster: Cluster, elsewhere: Path) -> None:
    cluster.write(models=[CELL[0]], datasets=[CELL[1]], env=FAST)
    done = evalctl(*UNTIL_DONE, cwd=cluster.root, specs=(cluster.spec,))
    assert done.returncode == 0, done.stdout + done.stderr

    here = evalctl("status", "-o", "json", cwd=cluster.root, specs=(cluster.spec,))
    there = evalctl("status", "-o", "json", cwd=elsewhere, specs=(cluster.spec,))
    assert (here.returncode, there.returncode) == (0, 0), there.stderr
    [cell] = json.loads(there.stdout)["evalruns"][0]["cells"]
    assert cell["phase"] == "Completed" and cell["score"] is not None, cell
    assert json.loads(here.stdout) == json.loads(there.stdout)
    assert first_line(done) == f"store: sqlite:///{default_store(cluster)} (next to the spec)"
    assert first_line(there) == first_line(done), "the same store, whatever the working directory"
    planned = json.loads(evalctl("plan", "-o", "json", cwd=elsewhere, specs=(cluster.spec,)).stdout)
    assert [[a["kind"] for a in c["actions"]] for c in planned["evalruns"][0]["cells"]] == [["skip"]], \
        "nothing to upload again"
    assert not (elsewhere / ".evalctl").exists()


@pytest.mark.parametrize("command", [("status",), ("plan",), ("reconcile", "--dry-run"), ("explain", *CELL),
                                     ("report", "--out", "report.html")], ids=lambda c: " ".join(c[:2]))
def test_a_read_only_command_never_creates_a_store(cluster: Cluster, elsewhere: Path, command: tuple[str, ...]) -> None:
    cluster.write(models=[CELL[0]], datasets=[CELL[1]], env=FAST)
    result = evalctl(*command, cwd=elsewhere, specs=(cluster.spec,))

    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines()[:2] == [
        f"store: sqlite:///{default_store(cluster)} (next to the spec)",
        f"evalctl: no store at {default_store(cluster)}: nothing has run from here"]
    assert not default_store(cluster).parent.exists() and not (elsewhere / ".evalctl").exists()


def test_evalctl_store_is_honoured_relative_to_the_working_directory_and_store_wins(cluster: Cluster,
                                                                                     elsewhere: Path) -> None:
    cluster.write(models=[CELL[0]], datasets=[CELL[1]], env=FAST)
    mine = {"EVALCTL_STORE": "sqlite:///mine.db"}
    done = evalctl("reconcile", "--once", cwd=elsewhere, specs=(cluster.spec,), env=mine)

    assert done.returncode == 0, done.stderr
    assert first_line(done) == f"store: sqlite:///{elsewhere}/mine.db ($EVALCTL_STORE)"
    assert (elsewhere / "mine.db").is_file() and not default_store(cluster).parent.exists()
    flag = evalctl("status", "--store", f"sqlite:///{cluster.root}/flag.db", cwd=elsewhere, specs=(cluster.spec,),
                   env=mine)
    assert first_line(flag) == f"store: sqlite:///{cluster.root}/flag.db (--store)"


def test_the_store_line_never_shows_a_password(cluster: Cluster, elsewhere: Path) -> None:
    cluster.write(models=[CELL[0]], datasets=[CELL[1]], env=FAST)
    result = evalctl("status", "--store", "postgresql://evaluser:s3cr3t-pw@127.0.0.1:1/results", cwd=elsewhere,
                     specs=(cluster.spec,))

    assert first_line(result) == "store: postgresql://evaluser:***@127.0.0.1:1/results (--store)"
    assert "s3cr3t-pw" not in result.stdout + result.stderr
    assert result.returncode == 3, "a store that cannot be reached is not observed"


def test_specs_in_two_directories_name_their_store_or_are_refused(cluster: Cluster, elsewhere: Path) -> None:
    cluster.write(models=[CELL[0]], datasets=[CELL[1]], env=FAST)
    cluster_part, run_part = cluster.spec.read_text().split("\n---\n")
    (cluster.root / "cluster.yaml").write_text(cluster_part)
    (elsewhere / "run.yaml").write_text(run_part)
    specs = (cluster.root / "cluster.yaml", elsewhere / "run.yaml")

    refused = evalctl("status", cwd=elsewhere, specs=specs)
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.startswith("evalctl: the specs are in 2 directories") and "--store" in refused.stderr
    named = evalctl("status", "--store", "sqlite:///named.db", cwd=elsewhere, specs=specs)
    assert named.returncode == 0, named.stderr


SLURM_SPEC = """
apiVersion: evalrun.io/v1alpha1
kind: EvalCluster
metadata: {{name: lab}}
spec:
  scheduler: {{type: slurm}}
  jobsDir: jobs
  logsDir: logs
  jobScript: {script}
  timeLimit: "01:00:00"
---
apiVersion: evalrun.io/v1alpha1
kind: EvalRun
metadata: {{name: far}}
spec: {{cluster: lab, models: [org/a-8B], datasets: [DCAgent/tiny_a]}}
"""


@pytest.fixture
def no_squeue(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A SLURM cluster's spec, and an environment whose PATH holds no SLURM command."""
    spec = tmp_path / "slurm.yaml"
    spec.write_text(SLURM_SPEC.format(script=tmp_path / "job.sh"))
    (tmp_path / "job.sh").write_text("#!/bin/sh\n")
    (tmp_path / "empty-bin").mkdir()
    return spec, {"PATH": str(tmp_path / "empty-bin")}


def test_a_missing_squeue_exits_3_with_the_cause_on_stderr_and_in_status(no_squeue: tuple[Path, dict[str, str]],
                                                                         tmp_path: Path) -> None:
    spec, env = no_squeue
    once = evalctl("reconcile", "--once", cwd=tmp_path, specs=(spec,), env=env)

    assert once.returncode == 3, once.stdout + once.stderr
    [line] = [line for line in once.stderr.splitlines() if "queue not observed" in line]
    assert line.startswith("evalctl: cluster lab: queue not observed: squeue") and "squeue and sacct" in line
    assert not (tmp_path / "logs").exists(), "nothing was submitted"

    shown = evalctl("status", "-o", "json", cwd=tmp_path, specs=(spec,), env=env)
    assert shown.returncode == 3 and line in shown.stderr
    [run] = json.loads(shown.stdout)["evalruns"]
    [queue] = [u for u in run["unobserved"] if u["source"] == "queue"]
    assert queue["cluster"] == "lab" and queue["cause"].startswith("squeue") and queue["fix"] in line
    assert [c["phase"] for c in run["cells"]] == ["Unknown"]
    table = evalctl("status", cwd=tmp_path, specs=(spec,), env=env)
    assert table.returncode == 3 and line.removeprefix("evalctl: ") in table.stdout, "the grid says why, too"


@pytest.mark.parametrize("command", [("plan",), ("reconcile", "--dry-run"), ("explain", *CELL),
                                     ("report", "--out", "report.html")], ids=lambda c: " ".join(c[:2]))
def test_every_reading_command_exits_3_naming_the_queue(no_squeue: tuple[Path, dict[str, str]], tmp_path: Path,
                                                        command: tuple[str, ...]) -> None:
    spec, env = no_squeue
    result = evalctl(*command, cwd=tmp_path, specs=(spec,), env=env)

    assert result.returncode == 3, result.stdout + result.stderr
    assert "evalctl: cluster lab: queue not observed: squeue" in result.stderr


def test_until_done_with_a_timeout_ends_5_saying_what_is_not_settled(no_squeue: tuple[Path, dict[str, str]],
                                                                     tmp_path: Path) -> None:
    spec, env = no_squeue
    looped = evalctl("reconcile", "--loop", "--interval", "0.1", "--until-done", "--timeout", "1s", cwd=tmp_path,
                     specs=(spec,), env=env)

    assert looped.returncode == 5, looped.stdout + looped.stderr
    assert looped.stderr.splitlines()[-1] == "evalctl: timed out after 1s: 1 cell(s) not settled (1 Unknown)"
    assert "queue not observed" in looped.stderr, "the loop said why, too"


@pytest.mark.parametrize("timeout", ["30", "1x", "0m", "-5s", "1h 30m"])
def test_a_timeout_that_is_no_duration_is_bad_input(no_squeue: tuple[Path, dict[str, str]], tmp_path: Path,
                                                    timeout: str) -> None:
    spec, env = no_squeue
    refused = evalctl("reconcile", "--loop", "--until-done", "--timeout", timeout, cwd=tmp_path, specs=(spec,), env=env)

    assert refused.returncode == 2 and "expected a duration" in refused.stderr, refused.stderr
    assert not (tmp_path / ".evalctl").exists()


def test_until_done_ends_4_when_only_held_cells_remain(cluster: Cluster) -> None:
    cluster.write(models=[CELL[0]], datasets=[CELL[1]], env={"FAKE_HARBOR_TASKS": "4", "FAKE_HARBOR_TRIAL_SECONDS":
                                                               "0.2"},
                  extra_run="  upload: {overlongHours: 0.0001, overlong: hold}")  # a run of 0.8 s is held
    looped = evalctl(*UNTIL_DONE, cwd=cluster.root, specs=(cluster.spec,))

    assert looped.returncode == 4, looped.stdout + looped.stderr
    assert looped.stderr.splitlines()[-1] == "evalctl: 1 held — see `evalctl retry`"
    assert "converged after" in looped.stdout


def test_a_new_store_beside_run_dirs_of_ours_says_so_and_submits_nothing_twice(cluster: Cluster,
                                                                               elsewhere: Path) -> None:
    cluster.write(models=[CELL[0]], datasets=[CELL[1]], env=FAST)
    first = evalctl(*UNTIL_DONE, cwd=elsewhere, specs=(cluster.spec,), env={"EVALCTL_STORE": "sqlite:///old.db"})
    assert first.returncode == 0 and "warning" not in first.stderr, first.stderr
    jobs = len(cluster.scheduler.observe())
    [tag] = [d.name for d in (cluster.root / "jobs").iterdir() if d.name.startswith("ev_")]

    again = evalctl("reconcile", "--once", cwd=cluster.root, specs=(cluster.spec,))

    assert again.returncode == 0, again.stdout + again.stderr
    [warning] = [line for line in again.stderr.splitlines() if "warning" in line]
    assert warning.startswith(f"evalctl: warning: a new store at {default_store(cluster)}, but the jobs dir already "
                              f"holds 1 run dir(s) of these cells ({tag})"), warning
    assert len(cluster.scheduler.observe()) == jobs, "judged by its run dir: no second job"
    quiet = evalctl("reconcile", "--once", cwd=cluster.root, specs=(cluster.spec,))
    assert "warning" not in quiet.stderr, "a store that exists is not new"
