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
from controller.adapters.rundirs.localfs import TOP_FILE_CAP, TRIAL_RESULT_CAP
from controller.adapters.rundirs.post_eval import REPORT_NAME, step_stats, write_post_eval_report
from controller.adapters.rundirs.tree import FsspecTree, LocalTree, open_tree
from controller.core.ports import JobsDirMissing, ObservationError
from tests.core.builders import metrics_of
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


# build_run's one infra trial in 4 is above the default upload.maxInfraErrorFraction: the report tests admit it
INFRA_OK = 0.25


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


def test_missing_jobs_dir_through_fs_is_jobs_dir_missing() -> None:
    with pytest.raises(JobsDirMissing, match=r"^jobs dir /no-such-evalrun-jobs does not exist"):
        HarborRunDirs("/no-such-evalrun-jobs", REFERENCE_ERRORS, fs=fsspec.filesystem("memory")).observe()


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

    path, summary = write_post_eval_report(facts.path, facts, REFERENCE_ERRORS,
                                           metrics_of(facts, REFERENCE_ERRORS, max_infra_fraction=INFRA_OK), fs=fs)
    local_path, local_summary = write_post_eval_report(local_facts.path, local_facts, REFERENCE_ERRORS,
                                                       metrics_of(local_facts, REFERENCE_ERRORS, max_infra_fraction=INFRA_OK))

    assert path == PurePosixPath(root, "r", REPORT_NAME) and isinstance(local_path, Path)
    assert summary == local_summary
    assert (summary.mean_score, summary.n_valid, summary.n_scored, summary.n_total) == (1 / 3, 3, 3, 4)
    assert summary.steps is not None and summary.steps.model_dump() == {
        "n_trajectories": 2, "mean": 7.0, "median": 7.0, "max": 10, "tokens": None}
    assert fs.cat_file(str(path)).decode() == local_path.read_text()
    # repeatable: replaced, no tmp left
    write_post_eval_report(facts.path, facts, REFERENCE_ERRORS,
                           metrics_of(facts, REFERENCE_ERRORS, max_infra_fraction=INFRA_OK), fs=fs)
    names = sorted(p.rsplit("/", 1)[-1] for p in fs.ls(f"{root}/r", detail=False))
    assert REPORT_NAME in names and not [n for n in names if n.endswith(".tmp")]


def test_step_stats_through_fs_leave_out_the_trials_not_completed(tmp_path: Path) -> None:
    """As locally: a trial killed before its result.json and one a cancel interrupted have trajectories, and are
    not among the trials the score counts."""
    run = tmp_path / "local" / "r"
    build_run(run)
    write_trial(run, "e__eeeeeee", result=False, steps=200)
    write_trial(run, "f__fffffff", exception="CancelledError", steps=100)
    fs = fsspec.filesystem("memory")
    root = f"/evalrun-fs-test-{uuid.uuid4().hex[:8]}/r"
    fs.put(str(run) + "/", root + "/", recursive=True)
    try:
        stats = step_stats(root, REFERENCE_ERRORS, fs)
    finally:
        fs.rm(root.rsplit("/", 1)[0], recursive=True)

    assert stats == step_stats(run, REFERENCE_ERRORS)
    assert stats is not None and (stats.n_trajectories, stats.max) == (2, 10)


def test_report_on_a_url_run_dir(remote: tuple[MemoryFileSystem, str, Path]) -> None:
    fs, root, _ = remote
    (facts,) = HarborRunDirs(f"memory://{root}", REFERENCE_ERRORS).observe()
    assert facts.path == f"memory://{root}/r"
    path, summary = write_post_eval_report(facts.path, facts, REFERENCE_ERRORS,
                                           metrics_of(facts, REFERENCE_ERRORS, max_infra_fraction=INFRA_OK))
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


class UnreadableOwnDirFS(MemoryFileSystem):
    def info(self, path: str, **kwargs: object) -> dict:
        if path.endswith("ev_ours__a1"):
            raise PermissionError(13, "Permission denied", path)
        return super().info(path, **kwargs)


def test_our_unlistable_dir_is_unreadable_not_a_failed_observation(tmp_path: Path) -> None:
    fs = UnreadableOwnDirFS()
    root = _two_dirs(tmp_path, fs)
    facts = {f.run_tag: f for f in HarborRunDirs(root, REFERENCE_ERRORS, fs=fs).observe()}
    assert facts["ev_ours__a1"].unreadable == f"{root}/ev_ours__a1: Permission denied"
    assert facts["legacy_theirs"].unreadable == "" and facts["legacy_theirs"].n_completed == 4


@pytest.fixture
def memory_root() -> Iterator[str]:
    """A fresh jobs dir path in the (process-wide) memory filesystem, removed afterwards."""
    root = f"/evalrun-fs-test-{uuid.uuid4().hex[:8]}/jobs"
    yield root
    fsspec.filesystem("memory").rm(root.rsplit("/", 1)[0], recursive=True)


def _one_run(tmp_path: Path, fs: MemoryFileSystem, root: str) -> str:
    """The run dir, in `fs` under `root`: one finished run dir of ours with two trials."""
    write_synthetic_run_dir(tmp_path / "local" / "ev_m__b__0123abcd__a1", 2)
    fs.put(str(tmp_path / "local") + "/", root + "/", recursive=True)
    return f"{root}/ev_m__b__0123abcd__a1"


def _observe_one(root: str, fs: MemoryFileSystem) -> str:
    (facts,) = HarborRunDirs(root, REFERENCE_ERRORS, fs=fs).observe()
    return facts.unreadable


TRIAL = "task-000001__0000001/result.json"


@pytest.mark.parametrize(("name", "make", "reason"), [
    (TRIAL, lambda fs, p: fs.pipe_file(p, b""), "empty file"),
    (TRIAL, lambda fs, p: fs.pipe_file(p, b"\xff\xfe garbage"), "not UTF-8"),
    (TRIAL, lambda fs, p: fs.pipe_file(p, b"[1, 2]"), "a JSON array, not an object"),
    (TRIAL, lambda fs, p: fs.pipe_file(p, b" " * (TRIAL_RESULT_CAP + 1)), "larger than the 4 MiB cap"),
    (TRIAL, lambda fs, p: (fs.rm(p), fs.mkdir(p), fs.pipe_file(f"{p}/x", b"{}")), "not a regular file (directory)"),
    ("result.json", lambda fs, p: fs.pipe_file(p, b"{"), "not JSON"),
    ("config.json", lambda fs, p: fs.pipe_file(p, b" " * (TOP_FILE_CAP + 1)), "larger than the 16 MiB cap"),
    ("meta.env", lambda fs, p: fs.pipe_file(p, b"MODEL=m\0\0"), "binary (NUL bytes)"),
], ids=["empty", "not-utf8", "list", "oversize", "directory", "job-result", "oversize-config", "binary-meta"])
def test_through_fs_what_cannot_be_read_is_unreadable(tmp_path: Path, memory_root: str, name: str, make,
                                                      reason: str) -> None:
    fs = fsspec.filesystem("memory")
    run = _one_run(tmp_path, fs, memory_root)
    make(fs, f"{run}/{name}")
    assert _observe_one(memory_root, fs).startswith(f"{run}/{name}: {reason}")


class GrowingFS(MemoryFileSystem):
    """The listing says 10 bytes, the file is far larger by the time it is read: the read stops at cap + 1."""

    reads: list[int | None]  # the `end` of each trial result read

    def find(self, *args: object, **kwargs: object) -> dict:
        found = super().find(*args, **kwargs)
        return {p: info | {"size": 10} if p.endswith(TRIAL) else info for p, info in found.items()}

    def cat_file(self, path: str, start: int | None = None, end: int | None = None, **kwargs: object) -> bytes:
        if path.endswith(TRIAL):
            self.reads.append(end)
        return super().cat_file(path, start, end, **kwargs)


def test_through_fs_reads_are_bounded_by_the_cap(tmp_path: Path, memory_root: str) -> None:
    fs = GrowingFS()
    fs.reads = []
    run = _one_run(tmp_path, fs, memory_root)
    fs.pipe_file(f"{run}/{TRIAL}", b" " * (TRIAL_RESULT_CAP + 100))
    assert _observe_one(memory_root, fs) == f"{run}/{TRIAL}: larger than the 4 MiB cap"
    assert fs.reads == [TRIAL_RESULT_CAP + 1]


class LinkingFS(MemoryFileSystem):
    """sftp lists a symlink as type "link" (lstat); `info` follows it (stat)."""

    links: dict[str, str | None]  # link path → target, None for a dangling link

    def find(self, *args: object, **kwargs: object) -> dict:
        found = super().find(*args, **kwargs)
        return {p: info | {"type": "link", "size": 20} if p in self.links else info for p, info in found.items()}

    def info(self, path: str, **kwargs: object) -> dict:
        if path in self.links:
            target = self.links[path]
            if target is None:
                raise FileNotFoundError(path)
            return super().info(target, **kwargs)
        return super().info(path, **kwargs)


@pytest.mark.parametrize(("target", "reason"), [
    ("regular", ""),  # a symlink to a regular file is read through
    ("dangling", "dangling symlink"),
    ("empty", "empty file"),  # what /dev/zero or a FIFO looks like over sftp: a "file" of size 0
])
def test_through_fs_a_symlink_is_followed_then_vetted(tmp_path: Path, memory_root: str, target: str,
                                                     reason: str) -> None:
    fs = LinkingFS()
    run = _one_run(tmp_path, fs, memory_root)
    elsewhere = f"{memory_root}/elsewhere.json"
    fs.pipe_file(elsewhere, fs.cat_file(f"{run}/{TRIAL}") if target == "regular" else b"")
    fs.links = {f"{run}/{TRIAL}": None if target == "dangling" else elsewhere}
    unreadable = _observe_one(memory_root, fs)
    assert unreadable == (f"{run}/{TRIAL}: {reason}" if reason else "")


class DeniedCatFS(MemoryFileSystem):
    def cat_file(self, path: str, *args: object, **kwargs: object) -> bytes:
        if path.endswith(TRIAL):
            raise PermissionError(13, "Permission denied", path)
        return super().cat_file(path, *args, **kwargs)


def test_through_fs_a_denied_file_is_unreadable_not_a_transport_error(tmp_path: Path, memory_root: str) -> None:
    fs = DeniedCatFS()
    run = _one_run(tmp_path, fs, memory_root)
    assert _observe_one(memory_root, fs) == f"{run}/{TRIAL}: Permission denied"
