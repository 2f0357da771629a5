"""Run dirs on another host: a plain jobsDir path read through a given fsspec filesystem (sftp to the login node
in production; the in-memory filesystem here), and the post-eval report read and written the same way."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from controller.adapters.rundirs.harbor import HarborRunDirs
from controller.adapters.rundirs.report import REPORT_NAME, write_post_eval_report
from controller.adapters.rundirs.tree import FsspecTree, LocalTree, open_tree
from controller.core.ports import ObservationError
from tests.fixtures.harbor_dirs import (
    REFERENCE_ERRORS,
    write_job_result,
    write_meta_env,
    write_synthetic_run_dir,
    write_trial,
)


def build_run(run: Path) -> None:
    write_meta_env(run, MODEL="org/m", REPO_ID="DCAgent/tiny", RESUME_COUNT=0)
    write_job_result(run, n_total=4)
    write_trial(run, "a__aaaaaaa", reward=1.0, steps=4)
    write_trial(run, "b__bbbbbbb", reward=0.0, steps=10)
    write_trial(run, "c__ccccccc", exception="DaytonaError")  # no trajectory
    corrupt = write_trial(run, "d__ddddddd", reward=0.0, steps=3)
    (corrupt / "agent" / "trajectory.json").write_text("[{")


@pytest.fixture
def remote(tmp_path: Path) -> Iterator[tuple[MemoryFileSystem, str, Path]]:
    """(fs, jobs dir path in fs, the same tree on local disk): one run dir `r` in both."""
    build_run(tmp_path / "local" / "r")
    fs = fsspec.filesystem("memory")
    root = f"/evalrun-fs-test-{uuid.uuid4().hex[:8]}/jobs"
    fs.put(str(tmp_path / "local") + "/", root + "/", recursive=True)
    yield fs, root, tmp_path / "local"
    fs.rm(root.rsplit("/", 1)[0], recursive=True)


def test_open_tree_reads_a_plain_path_through_fs_only_when_given() -> None:
    fs = fsspec.filesystem("memory")
    assert isinstance(open_tree("/some/jobs"), LocalTree)
    tree = open_tree("/some/jobs", fs)
    assert isinstance(tree, FsspecTree) and tree.fs is fs
    assert tree.location("r") == "/some/jobs/r"  # a plain path stays plain: it is the path on that host


def test_plain_path_through_fs_matches_local(remote: tuple[MemoryFileSystem, str, Path]) -> None:
    fs, root, local = remote
    assert not Path(root).exists()  # only the filesystem has it
    (via_fs,) = HarborRunDirs(root, REFERENCE_ERRORS, fs=fs).observe()
    (on_disk,) = HarborRunDirs(str(local), REFERENCE_ERRORS).observe()
    assert via_fs.path == f"{root}/r"
    exclude = {"path", "last_progress_at"}
    assert via_fs.model_dump(exclude=exclude) == on_disk.model_dump(exclude=exclude)
    assert (via_fs.n_trial_dirs, via_fs.n_scored, via_fs.n_infra_errors) == (4, 3, 1)


def test_fs_factory_is_called_each_pass(remote: tuple[MemoryFileSystem, str, Path]) -> None:
    fs, root, _ = remote
    calls: list[int] = []

    def connect() -> MemoryFileSystem:
        calls.append(1)
        return fs

    run_dirs = HarborRunDirs(root, REFERENCE_ERRORS, fs=connect)
    assert calls == []  # nothing connects at construction
    assert [f.run_tag for f in run_dirs.observe()] == ["r"]
    run_dirs.observe()
    assert len(calls) == 2


def test_missing_jobs_dir_through_fs_is_empty() -> None:
    assert HarborRunDirs("/no-such-evalrun-jobs", REFERENCE_ERRORS, fs=fsspec.filesystem("memory")).observe() == ()


@pytest.mark.parametrize("error", [FileNotFoundError("id_ed25519"), OSError("host key refused"), EOFError()])
def test_fs_that_cannot_connect_makes_the_observation_unknown(error: BaseException) -> None:
    """Never `()`: "no run dirs" would read as "nothing ran" and resubmit everything."""
    def connect() -> MemoryFileSystem:
        raise error

    with pytest.raises(ObservationError, match="cannot reach jobs dir /jobs"):
        HarborRunDirs("/jobs", REFERENCE_ERRORS, fs=connect).observe()


class TimingOutFS(MemoryFileSystem):
    def find(self, *args: object, **kwargs: object) -> object:
        raise TimeoutError("sftp read timed out")


def test_transport_timeout_mid_scan_is_unknown_not_a_skipped_dir(remote: tuple[MemoryFileSystem, str, Path]) -> None:
    _, root, _ = remote
    with pytest.raises(ObservationError, match="timed out"):
        HarborRunDirs(root, REFERENCE_ERRORS, fs=TimingOutFS()).observe()


def test_report_through_fs_matches_local(remote: tuple[MemoryFileSystem, str, Path]) -> None:
    fs, root, local = remote
    (facts,) = HarborRunDirs(root, REFERENCE_ERRORS, fs=fs).observe()
    (local_facts,) = HarborRunDirs(str(local), REFERENCE_ERRORS).observe()

    path, summary = write_post_eval_report(facts.path, facts, REFERENCE_ERRORS, fs=fs)
    local_path, local_summary = write_post_eval_report(local_facts.path, local_facts, REFERENCE_ERRORS)

    assert path == PurePosixPath(root, "r", REPORT_NAME) and isinstance(local_path, Path)
    assert summary == local_summary
    assert summary.steps is not None and summary.steps.model_dump() == {
        "n_trajectories": 2, "mean": 7.0, "median": 7.0, "max": 10}
    assert fs.cat_file(str(path)).decode() == local_path.read_text()
    write_post_eval_report(facts.path, facts, REFERENCE_ERRORS, fs=fs)  # repeatable: replaced, no tmp left
    names = sorted(p.rsplit("/", 1)[-1] for p in fs.ls(f"{root}/r", detail=False))
    assert REPORT_NAME in names and not [n for n in names if n.endswith(".tmp")]


def test_report_on_a_url_run_dir(remote: tuple[MemoryFileSystem, str, Path]) -> None:
    fs, root, _ = remote
    (facts,) = HarborRunDirs(f"memory://{root}", REFERENCE_ERRORS).observe()
    assert facts.path == f"memory://{root}/r"
    path, summary = write_post_eval_report(facts.path, facts, REFERENCE_ERRORS)
    assert str(path) == f"{root}/r/{REPORT_NAME}" and summary.steps is not None
    assert b"steps per trial (n=2)" in fs.cat_file(f"{root}/r/{REPORT_NAME}")


class FailingInfoFS(MemoryFileSystem):
    """fs.exists()/isdir() answer False for this error; the tree must not read it as "missing"."""

    def info(self, path: str, **kwargs: object) -> dict:
        raise ConnectionResetError("sftp connection lost")


def test_jobs_dir_unreadable_through_fs_is_unknown_not_empty() -> None:
    with pytest.raises(ObservationError, match="connection lost"):
        HarborRunDirs("/jobs", REFERENCE_ERRORS, fs=FailingInfoFS()).observe()


class DroppedChannelFS(MemoryFileSystem):
    """paramiko reports a dropped channel as a plain OSError, per file, through fsspec's cat(on_error="return")."""

    def cat_file(self, path: str, *args: object, **kwargs: object) -> bytes:
        if path.endswith("result.json"):
            raise OSError("Socket is closed")
        return super().cat_file(path, *args, **kwargs)


def _two_dirs(tmp_path: Path, fs: MemoryFileSystem) -> str:
    write_synthetic_run_dir(tmp_path / "local" / "ev_ours__a1", 4)
    write_synthetic_run_dir(tmp_path / "local" / "legacy_theirs", 4)
    root = f"/evalrun-fs-test-{uuid.uuid4().hex[:8]}/jobs"
    fs.put(str(tmp_path / "local") + "/", root + "/", recursive=True)
    return root


def test_a_transport_error_reading_our_trials_is_unknown_not_missing_trials(tmp_path: Path) -> None:
    """Read as missing, a finished dir of ours would look unfinished and be resumed: a second job."""
    fs = DroppedChannelFS()
    root = _two_dirs(tmp_path, fs)
    with pytest.raises(ObservationError, match="Socket is closed"):
        HarborRunDirs(root, REFERENCE_ERRORS, fs=fs).observe()


class UnreadableForeignDirFS(MemoryFileSystem):
    def info(self, path: str, **kwargs: object) -> dict:
        if "legacy_theirs" in path:
            raise PermissionError(path)
        return super().info(path, **kwargs)


def test_someone_elses_unreadable_dir_is_skipped_ours_are_read(tmp_path: Path) -> None:
    fs = UnreadableForeignDirFS()
    root = _two_dirs(tmp_path, fs)
    assert [f.run_tag for f in HarborRunDirs(root, REFERENCE_ERRORS, fs=fs).observe()] == ["ev_ours__a1"]
