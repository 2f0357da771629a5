"""`evalctl validate --remote` and `reconcile` against a cluster reached over ssh (the lab sshd as the login node
of the lab SLURM cluster): the preflight (RULES §12) runs in ONE ssh session and finds a missing partition, a
missing job script and an unknown account at once, each at its field; a good spec passes.

ssh is counted with a wrapper first on PATH that logs every invocation and runs the real client: a session that
runs a command is one whose remote command is `sh -s` (the master connection and its checks run none).
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

from tests.ssh.conftest import SshLab

REPO = Path(__file__).resolve().parents[2]
JOB_SCRIPT = REPO / "eval" / "slurm" / "eval_harbor.sbatch"


class Lab:
    """A spec of one EvalCluster over ssh and one EvalRun, and evalctl run with a counting ssh first on PATH."""

    def __init__(self, root: Path, login: SshLab):
        self.root, self.login = root, login
        self.spec = root / "spec.yaml"
        self.ssh_log = root / "ssh.log"
        wrapper = root / "bin" / "ssh"
        wrapper.parent.mkdir()
        real = shutil.which("ssh")
        assert real is not None
        wrapper.write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> {self.ssh_log}\nexec {real} "$@"\n')
        wrapper.chmod(0o755)
        # no COLUMNS: off a terminal, a line is never wrapped
        self.env = {**{k: v for k, v in os.environ.items() if k != "COLUMNS"},
                    "PATH": f"{wrapper.parent}:{os.environ['PATH']}"}

    def write(self, *, job_script: str, partition: str, account: str) -> None:
        self.spec.write_text(f"""apiVersion: evalrun.io/v1alpha1
kind: EvalCluster
metadata: {{name: lab}}
spec:
  scheduler: {{type: slurm, ssh: {self.login.alias}, sshConfig: "{self.login.config_file}"}}
  jobsDir: {self.root}/jobs
  logsDir: {self.root}/logs
  jobScript: {job_script}
  partition: {partition}
  account: {account}
---
apiVersion: evalrun.io/v1alpha1
kind: EvalRun
metadata: {{name: preflight}}
spec:
  cluster: lab
  models: ["org/preflight-{self.root.name[-8:]}"]
  datasets: ["DCAgent/tiny_a"]
""")

    def evalctl(self, *args: str) -> subprocess.CompletedProcess[str]:
        self.ssh_log.unlink(missing_ok=True)
        return subprocess.run([sys.executable, "-m", "controller.entry.cli", *args, "-f", str(self.spec)],
                              capture_output=True, text=True, env=self.env, cwd=self.root, timeout=180,
                              stdin=subprocess.DEVNULL, check=False)

    def sessions(self) -> list[str]:
        """The ssh invocations that ran a command on the login node."""
        logged = self.ssh_log.read_text().splitlines() if self.ssh_log.exists() else []
        return [line for line in logged if line.endswith(" sh -s")]


def test_validate_remote_finds_what_is_wrong_in_one_ssh_session_and_a_good_spec_passes(
        login_node: SshLab, tmp_path: Path) -> None:
    lab = Lab(tmp_path, login_node)
    lab.write(job_script="/nonexistent/eval.sbatch", partition="gpu-a100", account="no-such-account")

    result = lab.evalctl("validate", "--remote")
    assert result.returncode == 2, result.stdout + result.stderr
    assert len(lab.sessions()) == 1, lab.ssh_log.read_text()
    assert result.stderr.splitlines() == [
        f"{lab.spec}:8:14: cluster lab: jobScript /nonexistent/eval.sbatch does not exist on evalrun-login: fix "
        "spec.jobScript (a path on the login node)",
        f"{lab.spec}:9:14: cluster lab: partition gpu-a100 does not exist on evalrun-login (sinfo lists: debug); "
        "set spec.partition to one of them",
        f"{lab.spec}:10:12: cluster lab: account no-such-account does not exist on evalrun-login (sacctmgr); set "
        "spec.account to one of root's: root",
    ], result.stderr
    assert "Traceback" not in result.stderr and not result.stdout.startswith("ok")

    shown = json.loads(lab.evalctl("validate", "--remote", "-o", "json").stdout)
    [remote] = shown["remote"]
    assert shown["ok"] is False and [e["line"] for e in shown["errors"]] == [8, 9, 10]
    assert [f["field"] for f in remote["failures"]] == ["jobScript", "partition", "account"]
    assert remote["passed"][0] == f"jobs dir {tmp_path}/jobs made by the first job ({tmp_path} is writable)"

    lab.write(job_script=str(JOB_SCRIPT), partition="debug", account="root")
    result = lab.evalctl("validate", "--remote")
    assert result.returncode == 0 and result.stderr == "", result.stdout + result.stderr
    assert len(lab.sessions()) == 1
    first, last = result.stdout.splitlines()
    assert first.startswith(f"cluster lab on evalrun-login: ok (jobs dir {tmp_path}/jobs made by the first job")
    assert f"job script {JOB_SCRIPT} readable, partition debug, account root, python 3." in first, first
    assert last == "ok: 1 EvalRun(s), 1 EvalCluster(s), 1 cell(s)"


def test_reconcile_over_ssh_holds_launches_on_a_failed_preflight(login_node: SshLab, tmp_path: Path) -> None:
    lab = Lab(tmp_path, login_node)
    lab.write(job_script=str(JOB_SCRIPT), partition="gpu-a100", account="root")
    store = tmp_path / "store.db"

    result = lab.evalctl("reconcile", "--once", "--store", f"sqlite:///{store}")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "submitted job" not in result.stdout and "1 × hold: no launch on lab until its preflight passes" \
        in result.stdout, result.stdout
    assert "launches held: the preflight of lab failed: partition gpu-a100 does not exist on evalrun-login" \
        in result.stdout
    with sqlite3.connect(store) as conn:
        assert conn.execute("SELECT count(*) FROM evalrun_submissions").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM sandbox_jobs").fetchone() == (0,)


def test_a_login_node_that_cannot_be_reached_is_no_verdict_exit_3(login_node: SshLab, tmp_path: Path) -> None:
    alias = "no-such-login-node.invalid"
    lab = Lab(tmp_path, login_node)
    lab.write(job_script=str(JOB_SCRIPT), partition="debug", account="root")
    lab.spec.write_text(lab.spec.read_text().replace(f"ssh: {login_node.alias},", f"ssh: {alias},"))
    result = lab.evalctl("validate", "--remote")
    assert result.returncode == 3, result.stdout + result.stderr
    assert result.stderr.startswith(f"evalctl: cluster lab could not be checked: preflight on {alias}: ssh to "
                                    f"{alias} failed"), result.stderr
    assert "Traceback" not in result.stderr
