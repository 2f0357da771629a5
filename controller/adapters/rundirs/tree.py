"""Reading a jobs dir: `os.scandir` for local paths, fsspec for URLs (sftp://, memory://, ...) and for paths
on another host (a filesystem given to `open_tree`, e.g. sftp to the login node).

Only what the observer needs, shaped so a 100k-trial scan costs one directory listing per run dir
plus one open/fstat/read per trial result on local disks, and batched `cat` calls elsewhere.
Nothing here raises for one bad file: a file that cannot be read comes back as `None`.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Iterator, Mapping
from datetime import datetime
from typing import NamedTuple, Protocol

import fsspec
from fsspec.implementations.local import LocalFileSystem

TOP_FILES = frozenset({"config.json", "meta.env", "result.json", ".no-resume"})
TRIAL_RESULT = "result.json"
_CAT_BATCH = 256


class TrialRead(NamedTuple):
    name: str
    result: bytes | None  # None: missing or unreadable
    mtime: float | None  # POSIX seconds of the result file


class RunScan(NamedTuple):
    files: Mapping[str, bytes | None]  # TOP_FILES present in the run dir; None = present but unreadable
    trials: Iterator[TrialRead]  # every trial dir, lazily, in name order


class JobsTree(Protocol):
    def run_tags(self) -> list[str]:
        """Run dir names; FileNotFoundError when the jobs dir is missing, OSError when unlistable."""
        ...

    def location(self, run_tag: str) -> str: ...

    def scan(self, run_tag: str) -> RunScan:
        """One run dir; OSError when the run dir itself cannot be listed."""
        ...


def open_tree(jobs_dir: str, fs: fsspec.AbstractFileSystem | None = None) -> JobsTree:
    """The tree at `jobs_dir`; with `fs` (e.g. sftp to a login node), a plain path is read through that filesystem."""
    if fs is not None:
        return FsspecTree(fs, fs._strip_protocol(jobs_dir), jobs_dir)
    if "://" not in jobs_dir:
        return LocalTree(jobs_dir)
    fs, root = fsspec.core.url_to_fs(jobs_dir)
    if isinstance(fs, LocalFileSystem):
        return LocalTree(root)
    return FsspecTree(fs, root, jobs_dir)


def is_trial_dir_name(name: str) -> bool:
    """Harbor names trial dirs `<task[:32]>__<7 chars>`; nothing else in a run dir has `__`."""
    return "__" in name and not name.startswith(".")


class LocalTree:
    def __init__(self, root: str) -> None:
        self.root = root

    def run_tags(self) -> list[str]:
        with os.scandir(self.root) as entries:
            return sorted(e.name for e in entries if not e.name.startswith(".") and e.is_dir())

    def location(self, run_tag: str) -> str:
        return os.path.join(self.root, run_tag)

    def scan(self, run_tag: str) -> RunScan:
        run = self.location(run_tag)
        present: list[str] = []
        trials: list[str] = []
        with os.scandir(run) as entries:
            for entry in entries:  # d_type answers is_dir() without a stat on local file systems
                if entry.name in TOP_FILES:
                    present.append(entry.name)
                elif is_trial_dir_name(entry.name) and entry.is_dir():
                    trials.append(entry.name)
        files = {name: _read_local(os.path.join(run, name))[0] for name in present}
        return RunScan(files, self._results(run, sorted(trials)))

    @staticmethod
    def _results(run: str, trials: list[str]) -> Iterator[TrialRead]:
        for name in trials:
            data, mtime = _read_local(os.path.join(run, name, TRIAL_RESULT))
            yield TrialRead(name, data, mtime)


def _read_local(path: str) -> tuple[bytes | None, float | None]:
    """open + fstat + read: the mtime comes with the content, no separate stat."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None, None
    try:
        st = os.fstat(fd)
        data = os.read(fd, st.st_size + 1)
        if len(data) > st.st_size:  # it grew after the fstat: read the rest
            chunks = [data]
            while chunk := os.read(fd, 1 << 16):
                chunks.append(chunk)
            data = b"".join(chunks)
        return data, st.st_mtime
    except OSError:
        return None, None
    finally:
        os.close(fd)


class FsspecTree:
    def __init__(self, fs: fsspec.AbstractFileSystem, root: str, url: str) -> None:
        self.fs = fs
        self.root = root.rstrip("/")
        self.url = url.rstrip("/")

    def run_tags(self) -> list[str]:
        # not fs.exists(): it answers False for ANY error (connection lost, timeout, permission), and a jobs
        # dir read as missing means "nothing ran here"; info() raises FileNotFoundError only when it is missing
        try:
            self.fs.info(self.root)
        except FileNotFoundError:
            raise FileNotFoundError(self.url) from None
        entries = self.fs.ls(self.root, detail=True)
        names = (posixpath.basename(e["name"].rstrip("/")) for e in entries if e.get("type") == "directory")
        return sorted(n for n in names if not n.startswith("."))

    def location(self, run_tag: str) -> str:
        return f"{self.url}/{run_tag}"

    def scan(self, run_tag: str) -> RunScan:
        run = f"{self.root}/{run_tag}"
        if self.fs.info(run).get("type") != "directory":  # not fs.isdir(): it swallows transport errors too
            raise NotADirectoryError(self.location(run_tag))
        # one walk: files, trials, results; on_error="raise": the default drops what it could not list
        found = self.fs.find(run, maxdepth=2, withdirs=True, detail=True, on_error="raise")
        present: list[str] = []
        trials: dict[str, float | None] = {}
        results: dict[str, float | None] = {}
        for path, info in found.items():
            parts = path.rstrip("/")[len(run) + 1 :].split("/")
            if len(parts) == 1 and parts[0] in TOP_FILES and info.get("type") == "file":
                present.append(parts[0])
            elif len(parts) == 1 and is_trial_dir_name(parts[0]) and info.get("type") == "directory":
                trials[parts[0]] = None
            elif len(parts) == 2 and parts[1] == TRIAL_RESULT and is_trial_dir_name(parts[0]):
                results[parts[0]] = _info_mtime(info)
        contents = self._cat([f"{run}/{name}" for name in present])
        files = {name: contents.get(f"{run}/{name}") for name in present}
        return RunScan(files, self._results(run, sorted(trials), results))

    def _results(self, run: str, trials: list[str], results: Mapping[str, float | None]) -> Iterator[TrialRead]:
        for start in range(0, len(trials), _CAT_BATCH):
            batch = trials[start : start + _CAT_BATCH]
            contents = self._cat([f"{run}/{name}/{TRIAL_RESULT}" for name in batch if name in results])
            for name in batch:
                data = contents.get(f"{run}/{name}/{TRIAL_RESULT}")
                yield TrialRead(name, data, results.get(name) if data is not None else None)

    def _cat(self, paths: list[str]) -> dict[str, bytes | None]:
        if not paths:
            return {}
        got = self.fs.cat(paths, on_error="return")  # per-file errors come back as values
        failed = next((v for v in got.values() if isinstance(v, Exception) and not isinstance(v, FileNotFoundError)),
                      None)
        if failed is not None:  # a transport error is not a missing file: the whole read is unknown
            raise failed
        return {_strip(self.fs, p): v if isinstance(v, bytes) else None for p, v in got.items()}


def _strip(fs: fsspec.AbstractFileSystem, path: str) -> str:
    return fs._strip_protocol(path).rstrip("/")


def _info_mtime(info: Mapping[str, object]) -> float | None:
    """fsspec backends disagree on the key and type of a file's modification time."""
    for key in ("mtime", "LastModified", "last_modified", "modified", "created"):
        value = info.get(key)
        if isinstance(value, datetime):
            return value.timestamp()
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return None
