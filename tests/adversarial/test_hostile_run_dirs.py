"""Hostile run dirs: what cannot be read is never data.

Each case is a finished run dir of ours in Harbor's layout, on real files, with one thing made unreadable.
Read as "missing", a bad trial result makes a finished dir look unfinished (a partial score uploaded as
complete) and a bad job result or run dir makes it look killed (a resume of a job the scheduler says
COMPLETED). The observation must say `unreadable: "<path>: <why>"` instead, and the planner must then hold
the cell Unknown: no submit, resume, cancel, analyze or upload.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import resource
import shutil
import socket
import sqlite3
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TypeVar

import pytest

from controller.adapters.rundirs.harbor import HarborRunDirs
from controller.adapters.rundirs.localfs import TOP_FILE_CAP, TRIAL_RESULT_CAP
from controller.adapters.rundirs.post_eval import REPORT_NAME, StepStats, step_stats, write_post_eval_report
from controller.core.match import join_cells, run_dir_matches
from controller.core.observed import JobState, RunDirFacts
from controller.core.planner import plan
from controller.core.ports import JobsDirMissing, ObservationError
from controller.core.records import NamedRow, SandboxJobRow, StoreSnapshot
from controller.core.vocabulary import CellPlan, Phase
from tests.core.builders import ME, NOW, POLICY, ago, cell, job, metrics_of, obs, row, sub
from tests.e2e.conftest import Cluster
from tests.fixtures.evalctl import wait_until
from tests.fixtures.harbor_dirs import (
    REFERENCE_ERRORS,
    write_synthetic_run_dir,
    write_trial,
)

SAFETY_NET_S = 60.0  # only against a regression that blocks; the assertions are on outcomes, never on time
NOBODY = 65534
OWN = cell()
TAG = OWN.run_tag(1)
N_TRIALS = 4
TRIAL = "task-000001__0000001"  # the second of write_synthetic_run_dir's trials
T = TypeVar("T")


# --------------------------------------------------------------------------- observing, bounded


def _in_child(call: Callable[[], object], uid: int | None, send: Connection) -> None:
    """Runs in a forked child, its memory capped: a /dev/zero read whole fails here, not the test run."""
    limit = _vm_size() + (1 << 30)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    try:
        send.send(call())
    except BaseException as exc:  # every outcome goes back to the test, exceptions included
        send.send(exc)


def _vm_size() -> int:
    line = next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith("VmSize:"))
    return int(line.split()[1]) * 1024  # "VmSize:  123456 kB"


def bounded(call: Callable[[], T], *, uid: int | None = None) -> T | BaseException:
    """`call()` in a forked child (as `uid` if given): what it returned, or what it raised."""
    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_in_child, args=(call, uid, send), daemon=True)
    child.start()
    send.close()
    try:
        if not receive.poll(SAFETY_NET_S):
            pytest.fail(f"{call} did not finish: something blocked")
        return receive.recv()
    finally:
        child.kill()
        child.join()


def observe_bounded(jobs_dir: Path, *, uid: int | None = None) -> tuple[RunDirFacts, ...] | BaseException:
    return bounded(HarborRunDirs(str(jobs_dir), REFERENCE_ERRORS).observe, uid=uid)


# --------------------------------------------------------------------------- building hostile dirs


@pytest.fixture
def jobs() -> Iterator[Path]:
    """A jobs dir that uid nobody can traverse too (pytest's tmp_path is private to root)."""
    root = Path(tempfile.mkdtemp(prefix="evalrun-hostile-"))
    root.chmod(0o755)
    yield root / "jobs"
    shutil.rmtree(root)


def finished_run(jobs_dir: Path, run_tag: str = TAG) -> Path:
    """A finished run dir of OWN: every trial scored, written well before its job ended (not settling)."""
    run = jobs_dir / run_tag
    write_synthetic_run_dir(run, N_TRIALS, model=OWN.model, dataset=OWN.dataset)
    written = ago(hours=3).timestamp()
    for path in run.rglob("*"):
        os.utime(path, (written, written))
    for path in (jobs_dir, *jobs_dir.rglob("*")):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return run


def _replace(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def truncated(run: Path) -> Path:
    result = run / TRIAL / "result.json"
    return _replace(result, result.read_bytes()[: result.stat().st_size // 2])


def garbage(run: Path) -> Path:
    return _replace(run / TRIAL / "result.json", b"\x89PNG\r\n\x1a\n\x00\xff\xfe garbage")


def empty(run: Path) -> Path:
    return _replace(run / TRIAL / "result.json", b"")


def directory(run: Path) -> Path:
    result = run / TRIAL / "result.json"
    result.unlink()
    (result / "nested.json").parent.mkdir()
    (result / "nested.json").write_text("{}")
    return result


def symlink_loop(run: Path) -> Path:
    result = run / TRIAL / "result.json"
    result.unlink()
    result.symlink_to("result.json")  # itself
    return result


def symlink_loop_trial_dir(run: Path) -> Path:
    shutil.rmtree(run / TRIAL)
    (run / TRIAL).symlink_to(TRIAL)
    return run / TRIAL / "result.json"


def dev_zero(run: Path) -> Path:
    result = run / TRIAL / "result.json"
    result.unlink()
    result.symlink_to("/dev/zero")
    return result


def fifo(run: Path, name: str = f"{TRIAL}/result.json") -> Path:
    path = run / name
    path.unlink()
    os.mkfifo(path)
    return path


def fifo_config(run: Path) -> Path:
    return fifo(run, "config.json")


def unix_socket(run: Path) -> Path:
    result = run / TRIAL / "result.json"
    result.unlink()
    dir_fd = os.open(result.parent, os.O_RDONLY)
    try:  # bound through /proc/self/fd: the full path is longer than a socket address may be
        with socket.socket(socket.AF_UNIX) as server:
            server.bind(f"/proc/self/fd/{dir_fd}/result.json")
    finally:
        os.close(dir_fd)
    return result


def oversize(run: Path) -> Path:
    result = run / TRIAL / "result.json"
    os.truncate(result, TRIAL_RESULT_CAP + 1)  # sparse: nothing is written
    return result


def oversize_job_result(run: Path) -> Path:
    os.truncate(run / "result.json", TOP_FILE_CAP + 1)
    return run / "result.json"


def json_list(run: Path) -> Path:
    return _replace(run / TRIAL / "result.json", b"[]")


def rewards_of(rewards: dict[str, object]) -> Callable[[Path], Path]:
    def build(run: Path) -> Path:
        result = run / TRIAL / "result.json"
        doc = json.loads(result.read_bytes())
        doc["verifier_result"] = {"rewards": rewards}
        return _replace(result, json.dumps(doc).encode())
    return build


def output_tokens_of_wrong_type(run: Path) -> Path:
    """Read as "no tokens", a trial that ran would count as an instant failure: infra, its score dropped."""
    result = run / TRIAL / "result.json"
    doc = json.loads(result.read_bytes())
    doc["agent_result"] = {"n_input_tokens": 1000, "n_output_tokens": "lots"}
    return _replace(result, json.dumps(doc).encode())


def agent_time_of_wrong_type(run: Path) -> Path:
    result = run / TRIAL / "result.json"
    doc = json.loads(result.read_bytes())
    doc["agent_execution"] = {"started_at": "2026-11-29T12:00:00", "finished_at": 1764417600}
    return _replace(result, json.dumps(doc).encode())


def nan_reward(run: Path) -> Path:
    result = run / TRIAL / "result.json"
    return _replace(result, result.read_bytes().replace(b'"reward": 1.0', b'"reward": NaN')
                    .replace(b'"reward": 0.0', b'"reward": NaN'))


INVALID_REWARDS = {
    "string": (rewards_of({"reward": "high"}), "reward is 'high', not a finite number"),
    "nan": (nan_reward, "reward is nan, not a finite number"),
    "negative": (rewards_of({"reward": -1}), "reward -1 is outside [0, 1]"),
    "seven": (rewards_of({"reward": 7}), "reward 7 is outside [0, 1]"),
    "another-key": (rewards_of({"score": 1.0}), "rewards has no 'reward' key (only score)"),
}


def deeply_nested(run: Path) -> Path:
    return _replace(run / TRIAL / "result.json", b'{"a":' * 100_000)


def dangling_trial_result(run: Path) -> Path:
    result = run / TRIAL / "result.json"
    result.unlink()
    result.symlink_to("/nonexistent/result.json")
    return result


def permission_denied(run: Path) -> Path:
    result = run / TRIAL / "result.json"
    result.chmod(0)
    return result


def garbage_job_result(run: Path) -> Path:
    return _replace(run / "result.json", b'{"n_total_trials": 4, "finished_at": "2026-11-29T1\x00\x00')


def job_result_finished_at_wrong_type(run: Path) -> Path:
    result = run / "result.json"
    doc = json.loads(result.read_bytes())
    doc["finished_at"] = 1764417600
    return _replace(result, json.dumps(doc).encode())


def garbage_config(run: Path) -> Path:
    return _replace(run / "config.json", b'{"agents": [{"name": "terminus-2", "model_na')


def config_agents_not_a_list(run: Path) -> Path:
    config = run / "config.json"
    doc = json.loads(config.read_bytes())
    doc["agents"] = {"name": "terminus-2"}
    return _replace(config, json.dumps(doc).encode())


def binary_meta_env(run: Path) -> Path:
    return _replace(run / "meta.env", b"MODEL=laion/Qwen3-8B-sft\n\x7fELF\x02\x01\x01\x00\x00\x00")


def latin1_meta_env(run: Path) -> Path:
    return _replace(run / "meta.env", "MODEL=laion/Qwen3-8B-sft\nAGENT_NAME=términus\n".encode("latin-1"))


def meta_env_resume_count_garbled(run: Path) -> Path:
    meta = run / "meta.env"
    return _replace(meta, meta.read_bytes().replace(b"RESUME_COUNT=0", b"RESUME_COUNT=two"))


def run_dir_replaced_by_a_file(run: Path) -> Path:
    shutil.rmtree(run)
    run.write_text("not a run dir")
    return run


def dangling_run_dir(run: Path) -> Path:
    shutil.rmtree(run)
    run.symlink_to(run.parent / "moved-away")
    return run


def run_dir_symlink_loop(run: Path) -> Path:
    shutil.rmtree(run)
    run.symlink_to(run.name)
    return run


@dataclass(frozen=True)
class Hostile:
    build: Callable[[Path], Path]  # makes the finished run dir hostile; returns the path that cannot be read
    reason: str  # what `unreadable` says after "<path>: " (a prefix for JSON decoder messages)
    run_level: bool = False  # the run dir itself cannot be read: nothing but run_tag, path and `unreadable`
    as_nobody: bool = False  # root reads any file: run the observation as uid nobody


CASES = {
    "truncated-trial-result": Hostile(truncated, "not JSON: "),
    "garbage-trial-result": Hostile(garbage, "not UTF-8"),
    "empty-trial-result": Hostile(empty, "empty file"),
    "directory-as-trial-result": Hostile(directory, "not a regular file (directory)"),
    "symlink-loop-trial-result": Hostile(symlink_loop, "Too many levels of symbolic links"),
    "symlink-loop-trial-dir": Hostile(symlink_loop_trial_dir, "Too many levels of symbolic links"),
    "dev-zero-trial-result": Hostile(dev_zero, "not a regular file (character device)"),
    "fifo-trial-result": Hostile(fifo, "not a regular file (FIFO)"),
    "socket-trial-result": Hostile(unix_socket, "No such device or address"),
    "oversize-trial-result": Hostile(oversize, f"larger than the {TRIAL_RESULT_CAP >> 20} MiB cap"),
    "list-trial-result": Hostile(json_list, "a JSON array, not an object"),
    "output-tokens-of-wrong-type": Hostile(output_tokens_of_wrong_type,
                                           "agent_result.n_output_tokens is 'lots', not a count"),
    "agent-time-of-wrong-type": Hostile(agent_time_of_wrong_type,
                                        "agent_execution.finished_at is 1764417600, not an ISO timestamp"),
    "deeply-nested-trial-result": Hostile(deeply_nested, "not JSON: nested too deeply"),
    "dangling-trial-result": Hostile(dangling_trial_result, "dangling symlink"),
    "permission-denied-trial-result": Hostile(permission_denied, "Permission denied", as_nobody=True),
    "garbage-job-result": Hostile(garbage_job_result, "not JSON: "),
    "oversize-job-result": Hostile(oversize_job_result, f"larger than the {TOP_FILE_CAP >> 20} MiB cap"),
    "job-result-finished-at-wrong-type": Hostile(job_result_finished_at_wrong_type,
                                                 "finished_at is 1764417600, not an ISO timestamp"),
    "garbage-config": Hostile(garbage_config, "not JSON: "),
    "fifo-config": Hostile(fifo_config, "not a regular file (FIFO)"),
    "config-agents-not-a-list": Hostile(config_agents_not_a_list, "agents is not a list of objects"),
    "binary-meta-env": Hostile(binary_meta_env, "binary (NUL bytes), not KEY=VALUE text"),
    "latin1-meta-env": Hostile(latin1_meta_env, "not UTF-8"),
    "meta-env-resume-count-garbled": Hostile(meta_env_resume_count_garbled, "RESUME_COUNT='two' is not a count"),
    "run-dir-replaced-by-a-file": Hostile(run_dir_replaced_by_a_file, "Not a directory", run_level=True),
    "dangling-symlink-as-run-dir": Hostile(dangling_run_dir, "No such file or directory", run_level=True),
    "symlink-loop-as-run-dir": Hostile(run_dir_symlink_loop, "Too many levels of symbolic links", run_level=True),
}


# --------------------------------------------------------------------------- the planner's view


def plan_own_cell(dirs: tuple[RunDirFacts, ...]) -> CellPlan:
    """The pure planner on OWN: our Started row, our submission, its job COMPLETED, and the dirs of its tag."""
    observation = obs(rows=(row("Started", job_name=TAG),), subs=(sub(OWN),),
                      jobs=(job(TAG, JobState.COMPLETED, started=ago(hours=4), ended=ago(hours=2)),),
                      dirs=tuple(d for d in dirs if d.run_tag == TAG))
    (cell_plan,) = plan(OWN.evalrun, [OWN], [observation], POLICY, NOW).cells
    return cell_plan


def assert_held_unknown(cell_plan: CellPlan, path: Path) -> None:
    assert cell_plan.phase is Phase.UNKNOWN, cell_plan
    assert str(path) in cell_plan.reason
    assert cell_plan.actions == ()  # no submit, resume, cancel, analyze or upload — and nothing else either


def test_control_the_same_dir_untouched_is_analyzed_and_uploaded(jobs: Path) -> None:
    """The control: without the hostile file the planner acts, so the Unknowns below are not vacuous."""
    finished_run(jobs)
    observed = observe_bounded(jobs)
    assert not isinstance(observed, BaseException)
    (facts,) = observed
    assert (facts.unreadable, facts.n_completed, facts.n_total, facts.fires) == ("", N_TRIALS, N_TRIALS, 1)
    cell_plan = plan_own_cell(observed)
    assert cell_plan.phase is Phase.EVALUATED and [a.kind.value for a in cell_plan.actions] == ["analyze", "upload"]


@pytest.mark.parametrize("hostile", CASES.values(), ids=CASES.keys())
def test_what_cannot_be_read_makes_the_cell_unknown(jobs: Path, hostile: Hostile) -> None:
    bad = hostile.build(finished_run(jobs))
    as_nobody = hostile.as_nobody and os.geteuid() == 0
    observed = observe_bounded(jobs, uid=NOBODY if as_nobody else None)

    assert not isinstance(observed, BaseException), observed
    (facts,) = observed
    assert facts.run_tag == TAG
    assert facts.unreadable.startswith(f"{bad}: {hostile.reason}"), facts.unreadable
    assert len(facts.unreadable) < 300  # a reason, not the file
    assert (facts.n_completed, facts.n_scored, facts.n_total, facts.finished_at) == (0, 0, None, None)
    if not hostile.run_level:
        assert facts.path == str(jobs / TAG)
    assert_held_unknown(plan_own_cell(observed), bad)


@pytest.mark.parametrize(("build", "says"), INVALID_REWARDS.values(), ids=INVALID_REWARDS.keys())
def test_an_invalid_reward_holds_the_cell_naming_the_trial(jobs: Path, build: Callable[[Path], Path],
                                                          says: str) -> None:
    """Never averaged (−1 and 7 made −0.25 and 3.75), never read as 0 (another key): held, naming the file."""
    bad = build(finished_run(jobs))
    written = ago(hours=3).timestamp()  # as the rest of the finished run: not a trial landing after the job
    os.utime(bad, (written, written))
    observed = observe_bounded(jobs)
    assert not isinstance(observed, BaseException), observed
    (facts,) = observed
    assert (facts.unreadable, facts.n_invalid, facts.n_completed) == ("", 1, N_TRIALS)
    cell_plan = plan_own_cell(observed)
    assert cell_plan.phase is Phase.FAILED and [a.kind.value for a in cell_plan.actions] == ["hold"]
    assert f"{bad}: {says}" in cell_plan.reason, cell_plan.reason


def test_a_missing_jobs_dir_is_not_an_empty_one(jobs: Path) -> None:
    """An unmounted filesystem: a cell with history is Unknown; a brand-new cell may still be submitted."""
    raised = observe_bounded(jobs)
    assert isinstance(raised, JobsDirMissing)
    assert str(raised) == f"jobs dir {jobs} does not exist"

    fresh = cell(model="org/brand-new-8B")
    snapshot = StoreSnapshot(
        models=(NamedRow(id="m1", name=OWN.model), NamedRow(id="m2", name=fresh.model)),
        benchmarks=(NamedRow(id="b1", name=OWN.benchmark_name),),
        rows=(SandboxJobRow(id="row-1", job_name=TAG, username=ME, job_status="Started", created_at=ago(hours=5),
                            model_id="m1", benchmark_id="b1"),),
        submissions=(sub(OWN),),
    )
    seen = (job(TAG, JobState.COMPLETED, started=ago(hours=4), ended=ago(hours=2)),)
    observations = join_cells([OWN, fresh], snapshot, seen, (), jobs_dir_missing=str(raised))
    held, new = plan(OWN.evalrun, [OWN, fresh], observations, POLICY, NOW).cells
    assert_held_unknown(held, jobs)
    assert [a.kind.value for a in new.actions] == ["submit"]


def test_a_transport_error_is_still_the_whole_observation(jobs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    finished_run(jobs)
    real_open = os.open

    def flaky_open(path: str, flags: int, *args: object) -> int:
        if str(path).endswith(f"{TRIAL}/result.json"):
            raise TimeoutError(110, "Connection timed out")
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", flaky_open)
    with pytest.raises(ObservationError, match="timed out"):
        HarborRunDirs(str(jobs), REFERENCE_ERRORS).observe()


def test_no_resume_is_a_marker_never_read(jobs: Path) -> None:
    """Its presence is what matters: a FIFO there is neither waited on nor unreadable."""
    os.mkfifo(finished_run(jobs) / ".no-resume")
    observed = observe_bounded(jobs)
    assert not isinstance(observed, BaseException), observed
    (facts,) = observed
    assert (facts.no_resume, facts.unreadable, facts.n_completed) == (True, "", N_TRIALS)


FIRST_TRIAL = "task-000000__0000000"


@pytest.mark.parametrize("make", ["fifo", "dev-zero"])
def test_a_hostile_first_trial_config_is_no_api_base_and_does_not_block(jobs: Path, make: str) -> None:
    """The trial config only feeds the pinggy check (api_base): never waited on, never read whole, never fatal."""
    config = finished_run(jobs) / FIRST_TRIAL / "config.json"
    config.unlink()
    if make == "fifo":
        os.mkfifo(config)
    else:
        config.symlink_to("/dev/zero")
    observed = observe_bounded(jobs)
    assert not isinstance(observed, BaseException), observed
    (facts,) = observed
    assert (facts.api_base, facts.unreadable, facts.n_completed, facts.n_started_trials) == (
        None, "", N_TRIALS, N_TRIALS)
    assert [a.kind.value for a in plan_own_cell(observed).actions] == ["analyze", "upload"]


def test_another_tools_dir_is_skipped_when_unlistable_but_its_bad_trial_counts(jobs: Path) -> None:
    """A foreign dir we cannot list names no cell; a readable one with a bad trial still holds its cell."""
    bad = garbage(finished_run(jobs, "legacy_theirs"))
    (jobs / "legacy_loop").symlink_to("legacy_loop")  # a dir we cannot list
    (jobs / "notes.txt").write_text("not a run dir, and not ours: ignored")

    observed = observe_bounded(jobs)
    assert not isinstance(observed, BaseException), observed
    (facts,) = observed
    assert (facts.run_tag, facts.unreadable) == ("legacy_theirs", f"{bad}: not UTF-8")
    assert run_dir_matches(facts, OWN, frozenset({OWN.model}), frozenset({OWN.benchmark_name}))
    (cell_plan,) = plan(OWN.evalrun, [OWN], [obs(dirs=observed)], POLICY, NOW).cells
    assert_held_unknown(cell_plan, bad)


def test_the_report_skips_trajectories_it_must_not_read(tmp_path: Path) -> None:
    """Step stats are optional: a FIFO or /dev/zero trajectory is skipped, without blocking or filling memory."""
    run = tmp_path / "r"
    write_trial(run, "a__aaaaaaa", reward=1.0, steps=4)
    fifo_trajectory = write_trial(run, "b__bbbbbbb", reward=1.0, steps=1) / "agent" / "trajectory.json"
    fifo_trajectory.unlink()
    os.mkfifo(fifo_trajectory)
    zero_trajectory = write_trial(run, "c__ccccccc", reward=1.0, steps=1) / "agent" / "trajectory.json"
    zero_trajectory.unlink()
    zero_trajectory.symlink_to("/dev/zero")
    stats = bounded(lambda: step_stats(run, REFERENCE_ERRORS))
    assert isinstance(stats, StepStats) and (stats.n_trajectories, stats.max) == (1, 4)


# --------------------------------------------------------------------------- writing the report into a hostile run dir

OLD_TMP_NAME = f".{REPORT_NAME}.tmp"  # the fixed temp name the report used to be written under
OPERATOR_TEXT = "a file of the operator's, outside every run dir\n"


@dataclass(frozen=True)
class Reporting:
    run: Path
    facts: RunDirFacts
    operator: Path  # outside the run dir: never to be touched

    def write(self) -> Path:
        path, _ = write_post_eval_report(self.run, self.facts, REFERENCE_ERRORS, metrics_of(self.facts, REFERENCE_ERRORS))
        return path


@pytest.fixture
def reporting(jobs: Path) -> Reporting:
    run = finished_run(jobs)
    (facts,) = HarborRunDirs(str(jobs), REFERENCE_ERRORS).observe()
    operator = jobs.parent / "operator"
    operator.mkdir()
    (operator / "precious.txt").write_text(OPERATOR_TEXT)
    return Reporting(run, facts, operator)


def _operator_state(operator: Path) -> dict[str, tuple[str, int]]:
    return {p.name: (p.read_text(), p.stat().st_mtime_ns) for p in operator.iterdir()}


def _temp_files(run: Path) -> list[str]:
    return sorted(p.name for p in run.iterdir() if p.name.endswith(".tmp") and p.name != OLD_TMP_NAME)


def _is_our_report(path: Path) -> bool:
    return path.is_file() and not path.is_symlink() and "post-eval report: " in path.read_text()


@pytest.mark.parametrize("name", [OLD_TMP_NAME, REPORT_NAME])
@pytest.mark.parametrize("target", ["precious.txt", "not-yet.txt"], ids=["to-a-file", "to-a-new-file"])
def test_a_symlink_planted_in_the_run_dir_is_never_written_through(reporting: Reporting, name: str, target: str) -> None:
    """At the old temp name it is left alone (the temp file has a fresh random name); at the report name the
    rename replaces the link itself. Either way the file it points to is unchanged (or still absent)."""
    planted = reporting.run / name
    planted.symlink_to(reporting.operator / target)
    before = _operator_state(reporting.operator)

    path = reporting.write()

    assert _operator_state(reporting.operator) == before  # precious.txt unchanged, not-yet.txt not created
    assert path == reporting.run / REPORT_NAME and _is_our_report(path)
    if name == OLD_TMP_NAME:
        assert planted.is_symlink() and os.readlink(planted) == str(reporting.operator / target)
    assert _temp_files(reporting.run) == []


def test_a_guessed_temp_name_is_refused_not_followed(reporting: Reporting, monkeypatch: pytest.MonkeyPatch) -> None:
    """Even a symlink planted at the very name the temp file gets (the random part guessed) is not followed:
    O_EXCL|O_NOFOLLOW refuses it, and the caller's action fails with the reason."""
    monkeypatch.setattr("controller.adapters.rundirs.post_eval.secrets.token_hex", lambda n: "guessed")
    guessed = reporting.run / f".{REPORT_NAME}.guessed.tmp"
    guessed.symlink_to(reporting.operator / "precious.txt")
    before = _operator_state(reporting.operator)

    with pytest.raises(FileExistsError, match="post-eval report not written: cannot create its temporary file"):
        reporting.write()

    assert _operator_state(reporting.operator) == before
    assert guessed.is_symlink() and not (reporting.run / REPORT_NAME).exists()


@pytest.mark.parametrize("dangling", [False, True], ids=["to-a-dir", "dangling"])
def test_a_run_dir_that_is_a_symlink_is_refused(reporting: Reporting, dangling: bool) -> None:
    shutil.rmtree(reporting.run)
    reporting.run.symlink_to(reporting.operator / "gone" if dangling else reporting.operator)
    before = _operator_state(reporting.operator)

    with pytest.raises(OSError, match="post-eval report not written: the run dir is a symlink") as refused:
        reporting.write()

    assert refused.value.filename == str(reporting.run)
    assert _operator_state(reporting.operator) == before and reporting.run.is_symlink()


def test_a_fifo_at_the_report_path_is_replaced_without_blocking(reporting: Reporting) -> None:
    os.mkfifo(reporting.run / REPORT_NAME)
    written = bounded(reporting.write)  # an open of the FIFO for writing would wait for a reader forever
    assert written == reporting.run / REPORT_NAME and _is_our_report(reporting.run / REPORT_NAME)
    assert _temp_files(reporting.run) == []


def test_a_directory_at_the_report_path_is_refused_and_no_temp_file_is_left(reporting: Reporting) -> None:
    (reporting.run / REPORT_NAME).mkdir()
    with pytest.raises(IsADirectoryError, match="post-eval report not written: Is a directory"):
        reporting.write()
    assert (reporting.run / REPORT_NAME).is_dir() and _temp_files(reporting.run) == []


# --------------------------------------------------------------------------- the real evalctl


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    the_cluster = Cluster(tmp_path)
    yield the_cluster
    the_cluster.cancel_all()


def _rows(cluster: Cluster) -> list[tuple]:
    with sqlite3.connect(cluster.root / "store.db") as conn:
        return conn.execute("SELECT job_name, job_status, metrics FROM sandbox_jobs ORDER BY job_name").fetchall()


def _cells(cluster: Cluster, command: str = "status", code: int = 0) -> dict[str, dict]:
    """`code`: the exit code expected (3: a run dir not observed)."""
    shown = cluster.evalctl(command, "-o", "json", check=False)
    assert shown.returncode == code, shown.stderr
    status = json.loads(shown.stdout)["evalruns"][0]
    return {c["model"]: c for c in status["cells"]}


def _submit_and_finish(cluster: Cluster) -> None:
    out = cluster.evalctl("reconcile", "--once")
    assert "submitted job" in out.stdout, out.stdout
    wait_until(lambda: all(not j.state.active for j in cluster.scheduler.observe()), "the job to end")


def test_evalctl_holds_a_finished_dir_with_a_garbage_trial_result(cluster: Cluster) -> None:
    cluster.write(models=["org/a-8B"], datasets=["DCAgent/tiny_a"],
                  env={"FAKE_HARBOR_TASKS": "4", "FAKE_HARBOR_TRIAL_SECONDS": "0.01"})
    _submit_and_finish(cluster)
    (run,) = (cluster.root / "jobs").iterdir()
    bad = _replace(min(run.glob("*__*/result.json")), b"\x89PNG\r\n\x1a\n\x00\xff\xfe garbage")

    again = cluster.evalctl("reconcile", "--once", check=False)

    assert "Traceback" not in again.stderr, again.stderr
    assert again.returncode == 3 and f"evalctl: cluster local: run dirs not observed: run dir {run.name} cannot be " \
        f"read: {bad}: not UTF-8" in again.stderr, again.stderr
    assert "submitted job" not in again.stdout and "0 action(s) done" in again.stdout, again.stdout
    assert len(cluster.scheduler.observe()) == 1  # no resume, no new attempt
    [(name, status, metrics)] = _rows(cluster)
    assert (name, status, metrics) == (run.name, "Pending", None)  # nothing uploaded (nor bookkept)
    cell_status = _cells(cluster, code=3)["org/a-8B"]
    assert cell_status["phase"] == "Unknown" and cell_status["actions"] == []
    assert f"{bad}: not UTF-8" in cell_status["reason"]


def test_evalctl_with_the_jobs_dir_gone_holds_old_cells_and_submits_new_ones(cluster: Cluster) -> None:
    env = {"FAKE_HARBOR_TASKS": "2", "FAKE_HARBOR_TRIAL_SECONDS": "0.01"}
    cluster.write(models=["org/a-8B"], datasets=["DCAgent/tiny_a"], env=env)
    _submit_and_finish(cluster)
    (cluster.root / "jobs").rename(cluster.root / "jobs.unmounted")
    cluster.write(models=["org/a-8B", "org/new-8B"], datasets=["DCAgent/tiny_a"], env=env)

    planned = _cells(cluster, "plan")  # before the pass: the new cell's job recreates the jobs dir
    out = cluster.evalctl("reconcile", "--once")

    assert planned["org/a-8B"]["phase"] == "Unknown" and planned["org/a-8B"]["actions"] == []
    assert f"jobs dir {cluster.root / 'jobs'} does not exist" in planned["org/a-8B"]["reason"]
    assert [a["kind"] for a in planned["org/new-8B"]["actions"]] == ["submit"]
    assert "Traceback" not in out.stderr, out.stderr
    assert out.stdout.count("submitted job") == 1, out.stdout
    names = sorted(j.name for j in cluster.scheduler.observe())
    assert len(names) == 2 and sum("new-8B" in n for n in names) == 1  # only the new cell's job

