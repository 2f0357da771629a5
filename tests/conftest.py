"""Session fixtures shared by the suites that need real infrastructure (tests/infra, tests/slurm):
a real single-node SLURM cluster and the Harbor eval env.

Both are brought up by the repo's own scripts (idempotent; fast when already up):
  scripts/slurm-up.sh   -> cluster state in $SLURM_LAB (default /tmp/evalrun-slurm), left running afterwards;
                           a second cluster (`slurm_lab_b`) in /tmp/evalrun-slurm-b, only for the tests that ask
  scripts/eval-env.sh   -> Harbor venv in $EVAL_ENV (default /tmp/evalrun-eval-env), reused across runs
Needs root (apt-get, daemons, mount namespaces for Harbor's host environment); skipped otherwise.

Every session also checks that no local-scheduler job outlives it (`no_job_left_running`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.evalctl import wait_until

# Fixtures of the real parts some suites need; each starts its service only when a test asks for it.
pytest_plugins = ["tests.fixtures.postgres", "tests.fixtures.postgrest", "tests.fixtures.mlflow_server", "tests.fixtures.browser"]

REPO = Path(__file__).resolve().parents[1]
# every `python -m controller…` child runs this checkout's code, whatever its cwd and wherever the venv came from
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH"))))
# the run-dir cache of fresh processes (docs/DECISIONS.md) goes to a dir of this session's, not the user's ~/.cache
os.environ.setdefault("EVALCTL_CACHE_DIR", tempfile.mkdtemp(prefix="evalrun-test-cache-"))
if os.environ.get("PYTEST_XDIST_WORKER"):  # xdist gives workers an 80×24 terminal; children see none, as without it
    for size in ("COLUMNS", "LINES"):
        os.environ.pop(size, None)
SESSION_MARKER = "EVALRUN_TEST_SESSION"
JOB_MARKER = b"EVAL_JOB_ID="  # set by the local scheduler only, for its runner and all the job starts
KILL_WAIT_S = 15.0  # a job cancelled by a test's teardown gets SIGTERM, then SIGKILL after 5 s


# Tests that share a lab whose state one of them may take down run on one xdist worker, one after another: the
# Kubernetes lab (a peered operator sees every namespace) and the SLURM lab (its 2 CPUs; tests that stop slurmctld
# also lock it, `slurm_lab_alone`, against the Kubernetes tests that use SLURM). xdist's own `xdist_group` marks do
# not reach its scheduler under pytest 9 (it rewrites `item._nodeid`, which pytest 9 no longer reads), so the
# scheduler groups by path, and collection checks that every test of a lab lives under its group's paths.
LAB_GROUPS = {
    "kube": ("tests/kube/",),
    "slurm": ("tests/slurm/", "tests/infra/", "tests/ssh_e2e/", "tests/scheduler/test_slurm_live.py"),
}
LAB_FIXTURES = {"kube": ("kube",), "slurm": ("slurm_env", "slurm_lab_b")}


def lab_of(nodeid: str) -> str | None:
    return next((group for group, paths in LAB_GROUPS.items() if nodeid.startswith(paths)), None)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class LabScheduling(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return lab_of(nodeid) or nodeid

    return LabScheduling(config, log)  # type: ignore[arg-type]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    strays = [item.nodeid for item in items for fixtures in LAB_FIXTURES.values() for fixture in fixtures
              if fixture in getattr(item, "fixturenames", ()) and lab_of(item.nodeid) is None]
    if strays:
        raise pytest.UsageError("tests of a shared lab outside its group's paths (tests/conftest.py LAB_GROUPS): "
                                + ", ".join(strays))
    # tests that take the SLURM lab alone go first, while the Kubernetes worker is still on tests without SLURM
    items.sort(key=lambda item: "slurm_lab_alone" not in getattr(item, "fixturenames", ()))


@pytest.fixture(scope="session", autouse=True)
def no_job_left_running() -> Iterator[None]:
    """Local-scheduler jobs are detached session leaders, so one a test forgets outlives pytest.

    Processes started by this session inherit a marker in their environment; at the end, a local job that is
    still running (after the time a cancelled one needs to stop) is killed and fails the session. SLURM daemons
    and jobs, sshd and ssh masters carry the marker too, but not EVAL_JOB_ID, so they are left alone.
    """
    session = uuid.uuid4().hex
    os.environ[SESSION_MARKER] = session
    yield
    left = _still_running(session)
    for pid in left:
        _kill(pid)
    if left:
        pytest.fail(f"{len(left)} local-scheduler job process(es) outlived the tests and were killed: "
                    + "; ".join(f"{pid} {command}" for pid, command in left.items()), pytrace=False)


def _still_running(session: str) -> dict[int, str]:
    """The session's local jobs that have not ended within KILL_WAIT_S (a cancelled one is still stopping)."""
    try:
        wait_until(lambda: not _local_jobs(session), "local-scheduler jobs to end", timeout_s=KILL_WAIT_S, step_s=0.2)
    except AssertionError:
        return _local_jobs(session)
    return {}


def _local_jobs(session: str) -> dict[int, str]:
    """pid → command line of every live process with this session's marker that belongs to a local job."""
    marker = f"{SESSION_MARKER}={session}".encode()
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            environment = (proc / "environ").read_bytes().split(b"\0")
            command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:  # gone meanwhile, or another user's
            continue
        if marker in environment and any(entry.startswith(JOB_MARKER) for entry in environment):
            found[int(proc.name)] = command
    return found


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _run_script(script: str, timeout: float, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / script)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, check=False,
    )
    if proc.returncode != 0:
        pytest.fail(f"{script} failed (rc={proc.returncode}):\n{proc.stdout}\n{proc.stderr}", pytrace=False)
    return proc.stdout


SLURM_LAB = os.environ.get("SLURM_LAB", "/tmp/evalrun-slurm")
# A second, independent cluster (its own ClusterName, daemons, ports and accounting) for multi-cluster tests.
SLURM_LAB_B = {"SLURM_LAB": "/tmp/evalrun-slurm-b", "SLURM_PORT_BASE": "6917"}


@contextlib.contextmanager
def _slurm_lab(exclusive: bool, lab: str = SLURM_LAB) -> Iterator[None]:
    """A reader-writer lock on the SLURM lab across xdist workers: tests share it, one that stops slurmctld
    (or a worker starting the lab, which would start a stopped slurmctld) waits until it has it alone."""
    with open(f"{lab}.tests.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield


@pytest.fixture(scope="session")
def slurm_env() -> dict[str, str]:
    """Environment (os.environ + SLURM_CONF) for talking to the cluster; starts it if needed."""
    if os.geteuid() != 0:
        pytest.skip("the SLURM test cluster needs root")
    with _slurm_lab(exclusive=False):
        _run_script("slurm-up.sh", timeout=600)
    return {**os.environ, "SLURM_CONF": f"{SLURM_LAB}/etc/slurm.conf"}


@pytest.fixture(autouse=True)
def _slurm_labs_locked(request: pytest.FixtureRequest) -> Iterator[None]:
    """Each SLURM lab a test uses is locked for the test: alone when it stops that lab's slurmctld, else shared;
    the default lab always first, so two tests that take both never deadlock."""
    with contextlib.ExitStack() as locks:
        for lab, used, alone in ((SLURM_LAB, "slurm_env", "slurm_lab_alone"),
                                 (SLURM_LAB_B["SLURM_LAB"], "slurm_lab_b", "slurm_lab_b_alone")):
            if used in request.fixturenames:
                locks.enter_context(_slurm_lab(exclusive=alone in request.fixturenames, lab=lab))
        yield


@pytest.fixture
def slurm_lab_alone(slurm_env: dict[str, str]) -> dict[str, str]:
    """`slurm_env` for a test that stops slurmctld: no other test uses the lab meanwhile (`_slurm_labs_locked`)."""
    return slurm_env


@pytest.fixture(scope="session")
def slurm_lab_b() -> dict[str, str]:
    """Environment (SLURM_LAB, SLURM_PORT_BASE, SLURM_CONF) of the second cluster, `evalrun-b`; starts it if needed
    and leaves it running, as `slurm_env` does (stop it: SLURM_LAB=/tmp/evalrun-slurm-b scripts/slurm-down.sh)."""
    if os.geteuid() != 0:
        pytest.skip("the SLURM test cluster needs root")
    env = {**os.environ, **SLURM_LAB_B, "SLURM_CONF": f"{SLURM_LAB_B['SLURM_LAB']}/etc/slurm.conf"}
    with _slurm_lab(exclusive=False, lab=SLURM_LAB_B["SLURM_LAB"]):
        _run_script("slurm-up.sh", timeout=600, env=env)
    return env


@pytest.fixture
def slurm_lab_b_alone(slurm_lab_b: dict[str, str]) -> dict[str, str]:
    """`slurm_lab_b` for a test that stops its slurmctld: no other test uses it meanwhile (`_slurm_labs_locked`)."""
    return slurm_lab_b


@pytest.fixture(scope="session")
def eval_env() -> Path:
    """Path of the Harbor eval venv (built or reused by scripts/eval-env.sh)."""
    out = _run_script("eval-env.sh", timeout=900)
    return Path(out.strip().splitlines()[-1])
