"""Reading a run dir on a local disk, fail-closed: the one implementation, used by this process (`LocalTree`) and
by the probe that runs on a login node (`probe`), so both read alike. Standard library only and Python 3.9, for
the probe's sake.

A file we need that is there but cannot be read comes back as `Unreadable(reason)`, never as "missing": read as
missing, a finished trial would look unfinished. Only regular files are read, at most `cap` bytes, and nothing
waits (a FIFO is opened non-blocking, then refused). Errors of one path (missing, wrong type, denied, a symlink
loop) are values; any other error (EIO, a stale NFS handle) is raised, so the caller can make the whole read
unknown.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable
from typing import NamedTuple, Optional, Union

TOP_FILES = frozenset({"config.json", "meta.env", "result.json"})  # read
JOB_FILES = ("result.json", "config.json", "meta.env")  # their stat is part of a run dir's signature
NO_RESUME = ".no-resume"  # a marker: its presence is what matters, it is never read
TRIAL_RESULT = "result.json"
TRIAL_CONFIG = "config.json"  # read of the first trial dir only: the endpoint its agent calls
AGENT_DIR = "agent"  # listed (never read) for trials without a result: an entry in it means the agent is working
TOP_FILE_CAP = 16 << 20  # job config/result, meta.env: a 300-trial job result is well under 1 MiB
TRIAL_RESULT_CAP = 4 << 20  # a trial result is a few kB (config, exception traceback); a trial config is smaller
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
_PATH_ERRNOS = frozenset({errno.ELOOP, errno.ENXIO, errno.ENODEV, errno.ENAMETOOLONG})


class Unreadable(NamedTuple):
    """A file that is there but cannot be read; why, without its path."""

    reason: str


# typing's spellings: the probe runs these modules on a login node's Python, from 3.9 on
Content = Union[bytes, Unreadable]
StatKey = tuple[int, int]  # (st_mtime_ns, st_size): a file unchanged since it was read has the same key
Signature = tuple[Optional[StatKey], ...]  # a run dir's own StatKey, then its job files'


class FileRead(NamedTuple):
    content: Content | None  # None: no such entry, or `known` is set
    mtime: float | None  # POSIX seconds, when it was read
    key: StatKey | None = None  # taken by the same fstat as the read, before it
    known: object = None  # what `recall` had for this very file (same StatKey): it was not read


class RunListing(NamedTuple):
    top_files: list[str]  # TOP_FILES present
    trials: list[str]  # trial dirs, in name order
    no_resume: bool


def is_trial_dir_name(name: str) -> bool:
    """Harbor names trial dirs `<task[:32]>__<7 chars>`; nothing else in a run dir has `__`."""
    return "__" in name and not name.startswith(".")


def is_path_error(exc: BaseException) -> bool:
    """A fault of one path (missing, wrong type, denied, a loop), not of the transport or the disk reading it
    (a timeout, a dropped connection, EIO: those make the whole read unknown)."""
    if isinstance(exc, (FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError)):
        return True
    return isinstance(exc, OSError) and exc.errno in _PATH_ERRNOS


def describe(exc: OSError) -> str:
    """The error without the path it names (callers put the path first)."""
    return exc.strerror or f"{type(exc).__name__}: {exc}"


def path_error(exc: OSError) -> Unreadable:
    if not is_path_error(exc):
        raise exc
    return Unreadable(describe(exc))


def list_run_tags(root: str, prefix: str) -> list[str]:
    """Run dir names: dirs, and every `prefix` entry (one of ours that is not a dir — a file, a dangling link — is
    reported unreadable). FileNotFoundError when the jobs dir is missing."""
    with os.scandir(root) as entries:
        return sorted(e.name for e in entries
                      if not e.name.startswith(".") and (e.name.startswith(prefix) or _dir_or_broken(e)))


def list_run(run: str) -> RunListing:
    """One listing of a run dir; OSError when the run dir itself cannot be listed."""
    top: list[str] = []
    trials: list[str] = []
    no_resume = False
    with os.scandir(run) as entries:
        for entry in entries:  # d_type answers is_dir() without a stat on local file systems
            if entry.name in TOP_FILES:
                top.append(entry.name)
            elif entry.name == NO_RESUME:
                no_resume = True
            elif is_trial_dir_name(entry.name) and _dir_or_broken(entry):
                trials.append(entry.name)
    trials.sort()
    return RunListing(top, trials, no_resume)


def signature(run: str) -> Signature | None:
    """The stat of the run dir and its job files; None when the dir itself cannot be stat-ed."""
    try:
        st = os.stat(run)
    except OSError:
        return None
    return ((st.st_mtime_ns, st.st_size), *(stat_key(os.path.join(run, name)) for name in JOB_FILES))


def stat_key(path: str) -> StatKey | None:
    """A regular file's StatKey; None for anything else (missing, not a regular file, unreadable)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size) if stat.S_ISREG(st.st_mode) else None


def has_entry(path: str) -> bool:
    """Whether the directory at `path` lists anything: one scandir, stopped at the first entry. Missing, not a
    directory or unlistable is False: it only tells a working agent, and is not one of the files we read."""
    try:
        with os.scandir(path) as entries:
            return next(entries, None) is not None
    except OSError as exc:
        if not is_path_error(exc):
            raise  # a transport or disk error (EIO, a timeout): the whole read is unknown
        return False


def _dir_or_broken(entry: os.DirEntry[str]) -> bool:
    """is_dir(), but True when that cannot be told (a symlink loop): reading it then fails, naming its own path."""
    try:
        return entry.is_dir()
    except OSError:
        return True


def read_local(path: str, cap: int) -> tuple[Content | None, float | None]:
    """A regular file's content (at most `cap` bytes) and mtime; None when there is no such entry."""
    read = read_file(path, cap)
    return read.content, read.mtime


def read_file(path: str, cap: int, recall: Callable[[StatKey], object] | None = None) -> FileRead:
    """open + fstat + read. O_NONBLOCK: opening a FIFO does not wait for a writer; fstat refuses it.

    `recall`: given the file's StatKey, what was parsed from it before (None: read it). It costs a stat first, so
    an unchanged file costs that stat alone; pass it only when something may be recalled (a cold read would pay
    a stat for nothing)."""
    if recall is not None:
        key = stat_key(path)
        if key is not None and (known := recall(key)) is not None:
            return FileRead(None, _seconds(key), key, known)
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except FileNotFoundError:
        return FileRead(_missing_or_dangling(path), None)
    except OSError as exc:
        return FileRead(path_error(exc), None)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return FileRead(Unreadable(f"not a regular file ({_file_kind(st.st_mode)})"), None)
        key = (st.st_mtime_ns, st.st_size)  # of what is read: the file may have changed since a stat
        if st.st_size > cap:
            return FileRead(_too_large(cap), None, key)
        data = _read_capped(fd, st.st_size, cap)
    except OSError as exc:
        return FileRead(path_error(exc), None)
    finally:
        os.close(fd)
    problem = size_problem(len(data), cap)
    return FileRead(problem, None, key) if problem else FileRead(data, _seconds(key), key)


def _seconds(key: StatKey) -> float:
    """The mtime from the nanoseconds, the same float whether the file was read or recalled (`st_mtime` may round
    differently)."""
    return key[0] / 1e9


def _missing_or_dangling(path: str) -> Unreadable | None:
    """None when nothing is there (a trial still running); a symlink to nothing is there, and unreadable."""
    try:
        os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return path_error(exc)
    return Unreadable("dangling symlink")


def _read_capped(fd: int, size: int, cap: int) -> bytes:
    """Read to the end, but never more than cap + 1 bytes (so "too large" can be told); one read() when the
    file did not grow since fstat (a short read of a regular file is its end)."""
    data = os.read(fd, size + 1)
    if len(data) <= size:
        return data
    chunks = [data]
    total = len(data)
    while total <= cap and (chunk := os.read(fd, cap + 1 - total)):
        chunks.append(chunk)
        total += len(chunk)
    return b"".join(chunks)


def size_problem(size: int, cap: int) -> Unreadable | None:
    if size > cap:
        return _too_large(cap)
    return Unreadable("empty file") if size == 0 else None


def _too_large(cap: int) -> Unreadable:
    return Unreadable(f"larger than the {cap >> 20} MiB cap")


def _file_kind(mode: int) -> str:
    kinds = ((stat.S_ISDIR, "directory"), (stat.S_ISFIFO, "FIFO"), (stat.S_ISSOCK, "socket"),
             (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"))
    return next((name for test, name in kinds if test(mode)), f"mode {mode:o}")
