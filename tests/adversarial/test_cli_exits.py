"""`evalctl`'s exit codes and signals, as cron, CI and a terminal see them: a real process every time.

0 ok, 1 runtime failure (and `reconcile --once` with a failed action), 2 invalid input, 128 + N after
signal N; always one line on stderr, never a traceback. `reconcile --loop` outlives failed actions and a
store that is locked for a while, and stops only for what waiting cannot cure.
"""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from importlib.metadata import version
from pathlib import Path

import pytest

from controller.adapters.scheduler.local import LocalScheduler
from controller.adapters.store import open_store
from tests.fixtures.evalctl import cancel_live_jobs, run_evalctl, wait_until

REPO = Path(__file__).resolve().parents[2]
FAKE_HARBOR = REPO / "specs" / "demo" / "fake_harbor.py"
BUSY_TIMEOUT = {"EVALCTL_STORE_BUSY_TIMEOUT_S": "0.2"}
RETRY_LINE = re.compile(r"^evalctl: pass (\d+) failed: store .*database is locked.*; retrying in [\d.]+s$", re.M)


class Lab:
    """A local cluster in a temp dir: a spec whose jobs converge in seconds, or whose every submit fails."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.spec = root / "spec.yaml"
        self.store_path = root / "state" / "store.db"
        self.store = f"sqlite:///{self.store_path}"
        self.logs = root / "logs"

    def write(self, *, failing_submits: bool = False, cluster_extra: str = "") -> Path:
        """`failing_submits`: the logs dir lies below a regular file, so every submit fails with ENOTDIR."""
        (self.root / "jobs").mkdir(exist_ok=True)  # a jobs dir that is there: cells with history stay known
        if failing_submits:
            (self.root / "a-file").write_text("not a directory")
            self.logs = self.root / "a-file" / "logs"
        self.spec.write_text(f"""
apiVersion: evalrun.io/v1alpha1
kind: EvalCluster
metadata: {{name: local}}
spec:
  scheduler: {{type: local}}
  jobsDir: {self.root}/jobs
  logsDir: {self.logs}
  jobScript: {FAKE_HARBOR}
  timeLimit: "01:00:00"
  env: {{FAKE_HARBOR_TASKS: "2", FAKE_HARBOR_TRIAL_SECONDS: "0.01"}}
{cluster_extra}
---
apiVersion: evalrun.io/v1alpha1
kind: EvalRun
metadata: {{name: exits}}
spec:
  cluster: local
  models: [org/exit-8B]
  datasets: [DCAgent/tiny_a]
""")
        return self.spec

    def evalctl(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return run_evalctl(args, spec=self.spec, store=self.store, env={**os.environ, **(env or {})}, cwd=self.root,
                           check=False, timeout=120)

    def start(self, *args: str, env: dict[str, str] | None = None) -> Running:
        return Running(self, args, {**os.environ, "COLUMNS": "250", **(env or {})})

    def cancel_jobs(self) -> None:
        cancel_live_jobs(LocalScheduler(self.logs / ".local-scheduler"))


class Running:
    """`evalctl` in the background; its output goes to files, which the test polls."""

    def __init__(self, lab: Lab, args: tuple[str, ...], env: dict[str, str]) -> None:
        self.out, self.err = lab.root / "stdout.txt", lab.root / "stderr.txt"
        command = [sys.executable, "-m", "controller.entry.cli", *args, "-f", str(lab.spec), "--store", lab.store]
        with self.out.open("w") as out, self.err.open("w") as err:
            self.process = subprocess.Popen(command, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env,
                                            cwd=lab.root)

    def stdout(self) -> str:
        return self.out.read_text()

    def stderr(self) -> str:
        return self.err.read_text()

    def signal(self, signum: int) -> int:
        self.process.send_signal(signum)
        return self.process.wait(timeout=60)


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    the_lab = Lab(tmp_path)
    yield the_lab
    the_lab.cancel_jobs()


@pytest.fixture
def started(lab: Lab) -> Iterator[list[Running]]:
    """Processes a test starts in the background; killed if the test leaves one running."""
    running: list[Running] = []
    yield running
    for each in running:
        if each.process.poll() is None:
            each.process.kill()
            each.process.wait()


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in result.stdout + result.stderr, result.stderr
    [line] = [line for line in result.stderr.splitlines() if line.startswith("evalctl:")]
    return line


# ------------------------------------------------------------------------------------------- flags

REFUSED = {
    "--until-done without --loop": (("reconcile", "--until-done"), "--until-done needs --loop"),
    "--interval without --loop": (("reconcile", "--interval", "5"), "--interval needs --loop"),
    "--interval with --once": (("reconcile", "--once", "--interval", "5"), "--interval needs --loop"),
    "--dry-run with --loop": (("reconcile", "--dry-run", "--loop"), "--dry-run plans one pass"),
    "--dry-run with --loop --until-done": (("reconcile", "--dry-run", "--loop", "--until-done"),
                                           "--dry-run plans one pass"),
    "--once with --loop": (("reconcile", "--once", "--loop"), "--once and --loop exclude each other"),
    "status --interval without --watch": (("status", "--interval", "2"), "--interval needs --watch"),
}


@pytest.mark.parametrize("args, says", REFUSED.values(), ids=REFUSED.keys())
def test_flags_that_do_not_apply_are_refused(lab: Lab, args: tuple[str, ...], says: str) -> None:
    lab.write()
    result = lab.evalctl(*args)
    assert result.returncode == 2 and one_line_error(result).startswith(f"evalctl: {says}")
    assert not lab.store_path.parent.exists() and not lab.logs.exists(), "refused before anything was touched"


@pytest.mark.parametrize("value", ["soon", "-1", "1e9", "nan"])
def test_a_bad_busy_timeout_is_invalid_input(lab: Lab, value: str) -> None:
    lab.write()
    result = lab.evalctl("reconcile", "--once", env={"EVALCTL_STORE_BUSY_TIMEOUT_S": value})
    assert result.returncode == 2 and "EVALCTL_STORE_BUSY_TIMEOUT_S must be a number of seconds" in one_line_error(result)
    assert not lab.store_path.parent.exists()


def test_version_comes_from_the_package_metadata(lab: Lab) -> None:
    result = lab.evalctl("--version")
    assert (result.returncode, result.stdout) == (0, f"evalctl {version('evalrun-controller')}\n")


@pytest.mark.parametrize("command", [(), ("reconcile",), ("nodes", "release")])
def test_h_is_help_everywhere(lab: Lab, command: tuple[str, ...]) -> None:
    result = lab.evalctl(*command, "-h")
    usage = next(line for line in result.stdout.splitlines() if "Usage:" in line)
    assert result.returncode == 0, result.stderr
    assert f" {' '.join(command)} [OPTIONS]" in usage if command else "[OPTIONS] COMMAND" in usage, usage


# ------------------------------------------------------------------------------------- failed work


def test_once_exits_1_after_the_summary_when_an_action_failed(lab: Lab) -> None:
    lab.write(failing_submits=True)
    result = lab.evalctl("reconcile", "--once")
    assert result.returncode == 1, result.stderr
    assert "exits: 0 action(s) done, 1 failed" in result.stdout and "✗ org/exit-8B × DCAgent/tiny_a: submit:" in \
        result.stdout, "the summary says which action failed"
    assert "Traceback" not in result.stderr


def test_loop_goes_on_after_failed_actions_until_a_signal(lab: Lab, started: list[Running]) -> None:
    lab.write(failing_submits=True)
    running = lab.start("reconcile", "--loop", "--interval", "0.2")
    started.append(running)
    wait_until(lambda: running.stdout().count("1 failed") >= 3, "three passes, each with a failed submit")
    assert running.process.poll() is None, "a failed action does not end the loop"
    assert running.signal(signal.SIGTERM) == 143
    assert running.stderr().splitlines()[-1] == \
        "evalctl: interrupted (SIGTERM); the next pass picks up where this one stopped"
    assert "Traceback" not in running.stderr()


STORES = {
    "a directory": lambda path: path.mkdir(parents=True),
    "garbage bytes": lambda path: (path.parent.mkdir(parents=True), path.write_bytes(b"\0\xffnot sqlite" * 64)),
}


@pytest.mark.parametrize("make", STORES.values(), ids=STORES.keys())
def test_once_with_an_unusable_store_says_so_in_one_line(lab: Lab, make: Callable[[Path], object]) -> None:
    lab.write()
    make(lab.store_path)
    result = lab.evalctl("reconcile", "--once")
    assert result.returncode == 3, "a store that cannot be read is not observed"
    assert one_line_error(result).startswith(f"evalctl: not observed: store {lab.store_path}: ")
    assert not lab.logs.exists(), "nothing was submitted"


def test_a_missing_secret_fails_the_submission_and_says_what_to_set(lab: Lab) -> None:
    """The submission that needs it fails (exit 1) with what to set; nothing is launched without it."""
    lab.write(cluster_extra="  secretEnv: [{name: DAYTONA_API_KEY, secretRef: {name: exits-daytona, key: api-key}}]")
    result = lab.evalctl("reconcile", "--once")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "set EVALCTL_SECRET_EXITS_DAYTONA_API_KEY" in result.stdout
    assert not list(lab.logs.glob(".local-scheduler/jobs/*")), "nothing was submitted"


# ------------------------------------------------------------------------------------- a locked store


@pytest.fixture
def locked_store(lab: Lab) -> Iterator[sqlite3.Connection]:
    """An existing store (WAL, as evalctl makes it) with another process's write lock held on it."""
    open_store(lab.store).close()
    holder = sqlite3.connect(lab.store_path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    yield holder
    holder.close()


def test_once_with_a_locked_store_exits_3_in_one_line(lab: Lab, locked_store: sqlite3.Connection) -> None:
    lab.write()
    result = lab.evalctl("reconcile", "--once", env=BUSY_TIMEOUT)
    assert result.returncode == 3
    line = one_line_error(result)
    assert line.startswith(f"evalctl: not observed: store {lab.store_path}: database is locked") and "write lock" in line
    assert not lab.logs.exists(), "nothing was submitted"


def test_loop_outlives_a_locked_store_and_converges_once_it_is_free(
        lab: Lab, locked_store: sqlite3.Connection, started: list[Running]) -> None:
    lab.write()
    running = lab.start("reconcile", "--loop", "--interval", "0.2", "--until-done", env=BUSY_TIMEOUT)
    started.append(running)
    wait_until(lambda: len(RETRY_LINE.findall(running.stderr())) >= 2, "two passes failed on the lock, then retried")
    assert running.process.poll() is None, "a locked store does not end the loop"
    assert RETRY_LINE.findall(running.stderr())[:2] == ["1", "2"]
    assert not lab.logs.exists(), "nothing was submitted while the store could not record the intent"
    locked_store.execute("ROLLBACK")
    assert running.process.wait(timeout=120) == 0, running.stderr()
    assert "converged after" in running.stdout() and "1 Completed" in running.stdout()
    assert "Traceback" not in running.stderr()


# ------------------------------------------------------------------------------------------- signals


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["SIGINT", "SIGTERM"])
def test_a_signal_between_passes_exits_128_plus_n_and_frees_the_store(
        lab: Lab, started: list[Running], signum: int, code: int) -> None:
    lab.write()
    running = lab.start("reconcile", "--loop", "--interval", "0.2")
    started.append(running)
    wait_until(lambda: running.stdout().count("action(s) done") >= 2, "two passes")
    assert running.signal(signum) == code
    name = signal.Signals(signum).name
    assert running.stderr().splitlines()[-1] == \
        f"evalctl: interrupted ({name}); the next pass picks up where this one stopped"
    assert "Traceback" not in running.stderr()
    with sqlite3.connect(lab.store_path, timeout=0, isolation_level=None) as after:
        after.execute("BEGIN IMMEDIATE")  # no transaction of the killed process is left holding the lock
        assert after.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        after.execute("ROLLBACK")


def test_sigint_ends_status_watch(lab: Lab, started: list[Running]) -> None:
    lab.write()
    running = lab.start("status", "--watch", "--interval", "0.5")
    started.append(running)
    wait_until(lambda: "EvalRun exits" in running.stdout(), "the first frame")  # on a pipe: unchanged ones are not
    # printed again (tests/entry/test_render.py)
    assert running.signal(signal.SIGINT) == 130
    assert running.stderr().splitlines()[-1].startswith("evalctl: interrupted (SIGINT)")
    assert "Traceback" not in running.stderr()
