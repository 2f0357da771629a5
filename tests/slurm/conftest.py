"""SLURM end-to-end fixtures: an EvalCluster of `scheduler: {type: slurm}` on the real single-node test cluster
(tests/conftest.py `slurm_env`), with `evalctl` run as a real subprocess against a per-test SQLite store.

Isolation: SLURM accounting persists across test runs and the scheduler adapter looks back 14 days, so every
test uses model names unique to it (`org/t<8 letters>-m<i>`): the job names the reconciler derives from them
cannot collide with any earlier job. The 8-letter id is letters only, so no size token (`40b`) can sneak into
a model name and change the size policy. Teardown cancels every job whose name carries the test's id.

Synchronisation is on observable state only (`wait_until` with a bounded deadline); slots of the 2-CPU node
may be taken by other suites' jobs, so deadlines are generous.
"""

from __future__ import annotations

import json
import random
import shutil
import sqlite3
import string
import subprocess
import sys
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.fixtures.evalctl import run_evalctl
from tests.fixtures.evalctl import wait_until as wait_for_state

REPO = Path(__file__).resolve().parents[2]
EVAL_HARBOR = REPO / "eval" / "slurm" / "eval_harbor.sbatch"
FAKE_HARBOR = REPO / "specs" / "demo" / "fake_harbor.py"
TINY_DATASET = REPO / "eval" / "harbor" / "tiny-dataset"
SLURMCTLD = REPO / "scripts" / "slurmctld.sh"
FINAL_STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED",
                "BOOT_FAIL", "DEADLINE")
DEADLINE_S = 300.0
# The tiny dataset's `noreward` task never writes a reward: an ungraded trial is infra (RULES §14), 1 of its 4.
TINY_UPLOAD = "{maxInfraErrorFraction: 0.25}"


def wait_until(condition: Callable[[], object], what: str, timeout_s: float = DEADLINE_S,
               step_s: float = 0.5) -> object:
    """`tests.fixtures.evalctl.wait_until` with this suite's generous deadline (cluster slots may be busy)."""
    return wait_for_state(condition, what, timeout_s=timeout_s, step_s=step_s)


def slurm(args: list[str], env: dict[str, str], check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
    """A SLURM client command, times in UTC (as the scheduler adapter reads them)."""
    return subprocess.run(args, env={**env, "TZ": "UTC", "SLURM_TIME_FORMAT": "standard"}, capture_output=True,
                          text=True, check=check, timeout=timeout, stdin=subprocess.DEVNULL, cwd=REPO)


def parse_utc(text: str) -> datetime | None:
    try:
        return datetime.fromisoformat(text).replace(tzinfo=UTC)
    except ValueError:
        return None


class SlurmCluster:
    """One test's EvalCluster + EvalRun on the real SLURM cluster, its store, and views of both."""

    def __init__(self, root: Path, env: dict[str, str]):
        self.root = root
        self.env = env
        self.uid = "".join(random.choices(string.ascii_lowercase, k=8))
        self.spec = root / "spec.yaml"
        self.db = root / "store.db"
        self.store = f"sqlite:///{self.db}"
        self.jobs_dir = root / "jobs"
        self.logs_dir = root / "logs"
        self.scripts_dir = root / "scripts"
        self.scripts_dir.mkdir(parents=True, exist_ok=True)

    # ------------------------------------------------------------------ inputs

    def model(self, i: int) -> str:
        """A model name unique to this test (so its job names are too)."""
        return f"org/t{self.uid}-m{i}"

    def tiny_dataset(self, name: str) -> str:
        """A copy of the 4-task tiny dataset under a dir of its own name (the benchmark name is the basename)."""
        target = self.root / "datasets" / name
        if not target.exists():
            shutil.copytree(TINY_DATASET, target)
        return str(target)

    def script(self, name: str, body: str) -> Path:
        """An executable job script in the test dir (sbatch needs a shebang line)."""
        path = self.scripts_dir / name
        path.write_text(body)
        path.chmod(0o755)
        return path

    def fake_harbor_script(self) -> Path:
        """specs/demo/fake_harbor.py under sbatch, run by the reconciler's own interpreter (stdlib only)."""
        return self.script("fake_harbor.sbatch", f'#!/bin/bash\nexec "{sys.executable}" "{FAKE_HARBOR}" "$@"\n')

    def held_script(self) -> Path:
        """A job that SLURM queues held (PENDING, reason JobHeldUser): it never runs and takes no CPU."""
        return self.script("held.sbatch", "#!/bin/bash\n#SBATCH --hold\nexit 0\n")

    def sleeper_script(self) -> Path:
        """A job that runs (one CPU) until cancelled or out of time."""
        return self.script("sleeper.sbatch", "#!/bin/bash\nexec sleep 600\n")

    def write(self, *, models: list[str], datasets: list[str], script: Path = EVAL_HARBOR,
              env: dict[str, str] | None = None, time_limit: str = "30", max_per_pass: int = 6,
              per_minute: int = 600, extra_run: str = "", extra_cluster: str = "", name: str = "slurm-e2e",
              upload: str = TINY_UPLOAD) -> None:
        env_yaml = "".join(f"\n    {k}: {json.dumps(v)}" for k, v in (env or {}).items()) or " {}"
        self.spec.write_text(f"""
apiVersion: evalrun.io/v1alpha1
kind: EvalCluster
metadata: {{name: slurm-test}}
spec:
  scheduler: {{type: slurm, submissionsPerMinute: {per_minute}}}
  partition: debug
  jobsDir: {self.jobs_dir}
  logsDir: {self.logs_dir}
  jobScript: {script}
  timeLimit: "{time_limit}"
  maxSubmissionsPerPass: {max_per_pass}
  env:{env_yaml}
{extra_cluster}
---
apiVersion: evalrun.io/v1alpha1
kind: EvalRun
metadata: {{name: {name}}}
spec:
  cluster: slurm-test
  models: {json.dumps(models)}
  datasets: {json.dumps(datasets)}
  agent: oracle
  nAttempts: 1
  upload: {upload}
{extra_run}
""")

    # ------------------------------------------------------------------ evalctl

    def evalctl(self, *args: str, kill_at: str | None = None, check: bool = True,
                timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return run_evalctl(args, spec=self.spec, store=self.store, env=self.env, cwd=REPO, kill_at=kill_at,
                           check=check, timeout=timeout)

    def reconcile(self, **kwargs) -> subprocess.CompletedProcess[str]:
        return self.evalctl("reconcile", "--once", **kwargs)

    def plan_cells(self, code: int = 0) -> list[dict]:
        """`code`: the exit code expected (3: a source not observed)."""
        result = self.evalctl("plan", "-o", "json", check=False)
        assert result.returncode == code, result.stderr
        return json.loads(result.stdout)["evalruns"][0]["cells"]

    def status(self, code: int = 0) -> dict:
        result = self.evalctl("status", "-o", "json", check=False)
        assert result.returncode == code, result.stderr
        return json.loads(result.stdout)["evalruns"][0]

    # ------------------------------------------------------------------ store

    def _query(self, sql: str) -> list[sqlite3.Row]:
        if not self.db.exists():
            return []
        conn = sqlite3.connect(self.db)
        conn.row_factory = sqlite3.Row
        try:
            return conn.execute(sql).fetchall()
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return []
            raise
        finally:
            conn.close()

    def rows(self) -> list[dict]:
        """sandbox_jobs rows, metrics decoded."""
        out = []
        for r in self._query("SELECT id, job_name, job_status, metrics, stats, slurm_job_id, submitted_at, "
                             "started_at, ended_at FROM sandbox_jobs ORDER BY job_name"):
            row = dict(r)
            row["metrics"] = json.loads(row["metrics"]) if row["metrics"] else None
            row["stats"] = json.loads(row["stats"]) if row["stats"] else None
            out.append(row)
        return out

    def submissions(self) -> list[dict]:
        return [dict(r) for r in self._query(
            "SELECT name, run_tag, attempt, fire, job_id, row_id, created_at FROM evalrun_submissions "
            "ORDER BY created_at, name")]

    # ------------------------------------------------------------------ SLURM views

    def queue(self, name: str | None = None) -> list[dict]:
        """squeue rows (all users), optionally of one exact job name."""
        args = ["squeue", "-h", "-o", "%i|%j|%T|%V|%r"] + (["--name", name] if name else [])
        out = slurm(args, self.env).stdout
        jobs = []
        for line in out.splitlines():
            job_id, job_name, state, submit, reason = line.split("|", 4)
            if name is None or job_name == name:
                jobs.append({"job_id": job_id, "name": job_name, "state": state, "submit": parse_utc(submit),
                             "reason": reason})
        return jobs

    def accounting(self, name: str) -> list[dict]:
        """sacct allocations of one exact job name (14 days back, as the adapter looks)."""
        out = slurm(["sacct", "-n", "-P", "-X", "--name", name, "-S", "now-14days",
                     "-o", "JobID,JobName,State,Submit"], self.env).stdout
        jobs = []
        for line in out.splitlines():
            job_id, job_name, state, submit = line.split("|", 3)
            if job_name == name:
                jobs.append({"job_id": job_id, "name": job_name, "state": state.split(" ")[0].rstrip("+"),
                             "submit": parse_utc(submit)})
        return jobs

    def job_state(self, job_id: str) -> str:
        out = slurm(["sacct", "-n", "-P", "-X", "-j", job_id, "-o", "State"], self.env, check=False).stdout.split()
        if out:
            return out[0].rstrip("+")
        queued = slurm(["squeue", "-h", "-j", job_id, "-o", "%T"], self.env, check=False).stdout.split()
        return queued[0] if queued else ""

    def wait_job_final(self, job_id: str, timeout_s: float = DEADLINE_S) -> str:
        return wait_until(lambda: (s := self.job_state(job_id)) in FINAL_STATES and s, f"job {job_id} to end",
                          timeout_s=timeout_s, step_s=1.0)

    def our_queued_jobs(self) -> list[dict]:
        """Every queued/running job whose name carries this test's id."""
        return [j for j in self.queue() if self.uid in j["name"]]

    def sbatch(self, name: str, *args: str) -> str:
        """Submit a job of our own (not the reconciler's); `name` must carry self.uid for teardown."""
        assert self.uid in name
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        out = slurm(["sbatch", "--parsable", f"--job-name={name}", f"--output={self.logs_dir}/%x_%j.out",
                     *args], self.env).stdout
        return out.strip().split(";")[0]

    def cancel_all(self) -> None:
        """scancel, by id, every job (any state still in the queue) whose name carries this test's id."""
        try:
            ids = [j["job_id"] for j in self.our_queued_jobs()]
        except Exception:
            return
        for job_id in ids:
            slurm(["scancel", job_id], self.env, check=False)


@pytest.fixture
def cluster(tmp_path: Path, slurm_env: dict[str, str]) -> Iterator[SlurmCluster]:
    the_cluster = SlurmCluster(tmp_path, slurm_env)
    try:
        yield the_cluster
    finally:
        the_cluster.cancel_all()


def slurmctld(action: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SLURMCTLD), action], env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=180, stdin=subprocess.DEVNULL, check=False)


def ensure_slurmctld_up(env: dict[str, str]) -> None:
    """Start the controller if it is down and wait until squeue answers again."""
    if slurmctld("status", env).returncode != 0:
        started = slurmctld("start", env)
        assert started.returncode == 0, f"slurmctld start failed:\n{started.stdout}\n{started.stderr}"
    wait_until(lambda: slurm(["squeue", "-h"], env, check=False, timeout=30).returncode == 0,
               "squeue to answer again", timeout_s=120, step_s=1.0)


def recent_ev_submissions(env: dict[str, str], now: datetime) -> int:
    """Jobs named ev_* submitted within the last minute, as the rate budget counts them (squeue ∪ sacct).

    `squeue --states=all` lists ended jobs too for MinJobAge (300 s) — among them held jobs cancelled before they
    ever became eligible, which sacct never lists — and the scheduler adapter counts those as well.
    """
    user = subprocess.run(["id", "-un"], capture_output=True, text=True, check=True).stdout.strip()
    seen: dict[str, datetime | None] = {}
    for line in slurm(["squeue", "-h", "--states=all", "--user", user, "-o", "%i|%j|%V"], env).stdout.splitlines():
        job_id, name, submit = line.split("|", 2)
        if name.startswith("ev_"):
            seen[job_id] = parse_utc(submit)
    for line in slurm(["sacct", "-n", "-P", "-X", "--user", user, "-S", "now-10minutes",
                       "-o", "JobID,JobName,Submit"], env).stdout.splitlines():
        job_id, name, submit = line.split("|", 2)
        if name.startswith("ev_"):
            seen.setdefault(job_id, parse_utc(submit))
    return sum(1 for t in seen.values() if t is not None and (now - t).total_seconds() < 60)
