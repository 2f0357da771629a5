"""`evalctl reconcile` against a cluster reached over ssh: scheduler commands on the login node (the lab sshd),
run dirs read there by the run-dir probe and the post-eval report written through sftp, real SLURM and real
Harbor (oracle agent).

The login node is this machine, so what the probe reads is also on the local disk: the tests use that to check
the results, and SLURM's record of where sbatch ran (WorkDir: the remote login's home, while evalctl runs in
its tmp dir) to check the job really was submitted over ssh.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import sqlite3
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.evalctl import run_evalctl, wait_until
from tests.ssh.conftest import SshLab

REPO = Path(__file__).resolve().parents[2]
JOB_SCRIPT = REPO / "eval" / "slurm" / "eval_harbor.sbatch"
TINY_DATASET = REPO / "eval" / "harbor" / "tiny-dataset"
TRACEBACK = "Traceback (most recent call last)"


class SshCluster:
    """A spec (EvalCluster reached over ssh + one EvalRun) in a tmp dir, and `evalctl` run on it as a subprocess."""

    def __init__(self, root: Path, env: dict[str, str]):
        self.root = root
        self.env = {**env, "COLUMNS": "200"}
        self.spec = root / "spec.yaml"
        self.store = root / "store.db"
        self.jobs = root / "jobs"
        self.logs = root / "logs"
        # unique per test run: SLURM accounting outlives the test, and jobs are found by deterministic names
        self.model = f"org/ssh-{uuid.uuid4().hex[:8]}"
        self.dataset = root / "tiny-dataset"
        shutil.copytree(TINY_DATASET, self.dataset)

    def write(self, *, ssh_config: str, eval_env: str) -> None:
        self.spec.write_text(f"""
apiVersion: evalrun.io/v1alpha1
kind: EvalCluster
metadata: {{name: lab}}
spec:
  scheduler: {{type: slurm, ssh: evalrun-login, sshConfig: "{ssh_config}", submissionsPerMinute: 60}}
  jobsDir: {self.jobs}
  logsDir: {self.logs}
  jobScript: {JOB_SCRIPT}
  timeLimit: "10"
  partition: debug
  env: {{EVAL_ENV: "{eval_env}"}}
---
apiVersion: evalrun.io/v1alpha1
kind: EvalRun
metadata: {{name: ssh-e2e}}
spec:
  cluster: lab
  models: ["{self.model}"]
  datasets: ["{self.dataset}"]
  agent: oracle
  nAttempts: 1
  monitor: {{preWalltimeMinutes: 1, settleMinutes: 0}}
  upload: {{maxInfraErrorFraction: 0.25}}  # the tiny dataset's noreward task is infra (RULES §14)
""")

    def evalctl(self, *args: str) -> subprocess.CompletedProcess[str]:
        """`evalctl ARGS -f spec --store sqlite:///...`, run in the tmp dir (not the repo: sbatch runs remotely)."""
        return run_evalctl(args, spec=self.spec, store=f"sqlite:///{self.store}", env=self.env, cwd=self.root,
                           check=False, timeout=180)

    def reconcile_once(self) -> subprocess.CompletedProcess[str]:
        result = self.evalctl("reconcile", "--once")
        assert result.returncode == 0 and TRACEBACK not in result.stderr, result.stdout + result.stderr
        return result

    def cell(self, *, observed: bool = True) -> dict[str, Any]:
        """The one cell as `status -o json` shows it; `observed=False`: the cluster could not be read (exit 3)."""
        result = self.evalctl("status", "-o", "json")
        assert result.returncode == (0 if observed else 3), result.stdout + result.stderr
        [run] = json.loads(result.stdout)["evalruns"]
        [cell] = run["cells"]
        return cell

    def rows(self, sql: str) -> list[tuple]:
        if not self.store.exists():
            return []
        with sqlite3.connect(self.store) as conn:
            try:
                return conn.execute(sql).fetchall()
            except sqlite3.OperationalError:  # no such table: nothing was ever written
                return []


def sacct_row(job_id: str, env: dict[str, str]) -> str:
    return subprocess.run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "JobName,State,WorkDir"], env=env,
                          capture_output=True, text=True, timeout=60, check=False).stdout.strip()


@pytest.mark.slurm
@pytest.mark.slow
def test_reconcile_over_ssh_converges_then_a_pass_takes_no_action(
        login_node: SshLab, slurm_env: dict[str, str], eval_env: Path, tmp_path: Path) -> None:
    started = time.monotonic()
    cluster = SshCluster(tmp_path, slurm_env)
    cluster.write(ssh_config=login_node.config_file, eval_env=str(eval_env))
    seen: list[str] = []

    def completed() -> bool:
        out = cluster.reconcile_once().stdout
        cell = cluster.cell()
        seen.append(f"{cell['phase']}: {cell.get('reason', '')} | {out.strip()}")
        assert cell["phase"] not in ("Failed", "Stalled"), "\n".join(seen)
        return cell["phase"] == "Completed" and cell["score"] is not None

    try:
        wait_until(completed, "the cell to complete over ssh", timeout_s=420, step_s=1.0)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; passes seen:\n" + "\n".join(seen)) from None

    again = cluster.reconcile_once().stdout
    assert "0 action(s) done" in again and "1 × skip: job finished" in again, again
    [(name, status, job_id, metrics)] = cluster.rows(
        "SELECT job_name, job_status, slurm_job_id, metrics FROM sandbox_jobs")
    assert status == "Finished" and job_id, (name, status, job_id)
    values = {m["name"]: m["value"] for m in json.loads(metrics)}
    assert values["accuracy"] == cluster.cell()["score"] and "accuracy_stderr" in values, values

    # submitted over ssh: sbatch ran in the remote login's home, not in evalctl's working dir
    job_name, state, work_dir = sacct_row(job_id, slurm_env).split("|")
    assert (job_name, state) == (name, "COMPLETED")
    assert work_dir == pwd.getpwnam("root").pw_dir != str(tmp_path), work_dir
    [run_dir] = [p for p in cluster.jobs.iterdir() if p.is_dir()]
    report = (run_dir / "post_eval_report.txt").read_text()  # written through sftp
    assert f"post-eval report: {run_dir.name}" in report and "mean score: " in report, report
    assert list(cluster.logs.glob(f"{name}_{job_id}.out")), sorted(os.listdir(cluster.logs))
    print(f"\nssh e2e: converged in {time.monotonic() - started:.1f} s over {len(seen)} passes")


def test_unknown_host_key_makes_cells_unknown_and_submits_nothing(ssh_lab: SshLab, tmp_path: Path) -> None:
    """A login node whose host key is not in known_hosts: no command and no sftp read, so the cell is Unknown,
    nothing is submitted and nothing is written there; evalctl says why, without a traceback."""
    empty_known_hosts = tmp_path / "known_hosts"
    empty_known_hosts.write_text("")
    config = tmp_path / "ssh_config"
    lines = Path(ssh_lab.config_file).read_text().splitlines()
    config.write_text("\n".join(f"  UserKnownHostsFile {empty_known_hosts}" if "UserKnownHostsFile" in line else line
                                for line in lines) + "\n")
    assert str(empty_known_hosts) in config.read_text()
    cluster = SshCluster(tmp_path, dict(os.environ))
    cluster.write(ssh_config="ssh_config", eval_env="/nonexistent")  # relative: resolved against the spec file

    result = cluster.evalctl("reconcile", "--once")

    assert result.returncode == 3, result.stdout + result.stderr  # the cluster could not be observed
    assert TRACEBACK not in result.stdout + result.stderr, result.stderr
    assert "0 action(s) done" in result.stdout, result.stdout
    assert "host key" in result.stderr.lower(), result.stderr
    cell = cluster.cell(observed=False)
    assert cell["phase"] == "Unknown" and cell["score"] is None, cell
    assert "host key" in cell["reason"].lower(), cell
    assert cluster.rows("SELECT name FROM evalrun_submissions") == []
    assert cluster.rows("SELECT job_name FROM sandbox_jobs") == []
    assert not cluster.jobs.exists() and not cluster.logs.exists()
