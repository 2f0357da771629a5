"""Reading a jobs dir: `os.scandir` for local paths, fsspec for URLs (sftp://, memory://, ...) and for paths
on another host (a filesystem given to `open_tree`, e.g. sftp to the login node).

Only what the observer needs, shaped so a 100k-trial scan costs one directory listing per run dir
plus one open/fstat/read per trial result on local disks, and batched `cat` calls elsewhere. Besides: one read
of the first trial's config.json per run dir, and one listing of agent/ per trial WITHOUT a result (the
running ones), to tell a trial whose agent works from one only created.

What a file that cannot be read comes back as, and which errors are raised, is said in `localfs`, which reads
local disks; an fsspec tree follows the same rules over its filesystem.
"""

from __future__ import annotations

import errno
import functools
import os
import posixpath
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime
from typing import NamedTuple, Protocol

import fsspec
from fsspec.implementations.local import LocalFileSystem

from controller.adapters.rundirs.localfs import (
    AGENT_DIR,
    NO_RESUME,
    TOP_FILE_CAP,
    TOP_FILES,
    TRIAL_CONFIG,
    TRIAL_RESULT,
    TRIAL_RESULT_CAP,
    Content,
    StatKey,
    Unreadable,
    describe,
    has_entry,
    is_path_error,
    is_trial_dir_name,
    list_run,
    list_run_tags,
    path_error,
    read_file,
    read_local,
    size_problem,
)
from controller.core.types import RUN_TAG_PREFIX

_CAT_BATCH = 256
class TrialRead(NamedTuple):
    name: str
    result: Content | None  # None: no result.json (the trial is still running), or `known` is set
    mtime: float | None  # POSIX seconds of the result file, when it was read
    known: object = None  # what an earlier pass parsed from this very file (same StatKey), instead of reading it
    key: StatKey | None = None  # the file's StatKey when it was read, for remembering what it says
    agent_active: bool = False  # no result.json, but its agent/ holds an entry: started, not just created


# Given a run dir path: None when nothing of it is kept, else (trial name, StatKey of its result.json) → what was
# parsed from that very file before, if kept.
Recall = Callable[[str], Callable[[str, StatKey], object] | None]


class RunScan(NamedTuple):
    files: Mapping[str, Content]  # TOP_FILES present in the run dir
    no_resume: bool
    trials: Iterator[TrialRead]  # every trial dir, lazily, in name order
    trial_config: Content | None = None  # the first trial dir's config.json (in name order)


class JobsTree(Protocol):
    def run_tags(self) -> list[str]:
        """Run dir names (our `ev_` entries whatever their type); FileNotFoundError when the jobs dir is
        missing, OSError when unlistable."""
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


class LocalTree:
    """`recall` (set by an observer that keeps what it parsed): a trial result whose mtime and size are those of
    a file parsed before is not read again, only stat-ed; the trials of a dir it keeps nothing of are read
    without that stat (open + fstat + read)."""

    def __init__(self, root: str, recall: Recall | None = None) -> None:
        self.root = root
        self.recall = recall

    def run_tags(self) -> list[str]:
        return list_run_tags(self.root, RUN_TAG_PREFIX)

    def location(self, run_tag: str) -> str:
        return os.path.join(self.root, run_tag)

    def scan(self, run_tag: str) -> RunScan:
        run = self.location(run_tag)
        listing = list_run(run)
        files = {name: content for name in listing.top_files
                 if (content := read_local(os.path.join(run, name), TOP_FILE_CAP)[0]) is not None}
        trials = listing.trials
        trial_config = read_local(os.path.join(run, trials[0], TRIAL_CONFIG), TRIAL_RESULT_CAP)[0] if trials else None
        return RunScan(files, listing.no_resume, self._results(run, trials), trial_config)

    def _results(self, run: str, trials: list[str]) -> Iterator[TrialRead]:
        kept = None if self.recall is None else self.recall(run)
        for name in trials:
            recall = None if kept is None else functools.partial(kept, name)
            read = read_file(os.path.join(run, name, TRIAL_RESULT), TRIAL_RESULT_CAP, recall)
            active = read.content is None and read.known is None and has_entry(os.path.join(run, name, AGENT_DIR))
            yield TrialRead(name, read.content, read.mtime, read.known, read.key, active)


class FsspecTree:
    """Type and size come from the listing (`find(detail=True)`), so what is not a regular file or is over the
    cap is refused before any `cat`; reads are bounded to cap + 1 bytes. A file of size 0 is refused as empty:
    over sftp that is also what a FIFO or a device looks like. A symlink (sftp lists it as a "link") costs one
    `info` to follow it."""

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
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), self.url) from None
        listed = {posixpath.basename(e["name"].rstrip("/")): e.get("type") for e in self.fs.ls(self.root, detail=True)}
        return sorted(name for name, kind in listed.items()
                      if not name.startswith(".") and (kind == "directory" or name.startswith(RUN_TAG_PREFIX)))

    def location(self, run_tag: str) -> str:
        return f"{self.url}/{run_tag}"

    def scan(self, run_tag: str) -> RunScan:
        run = f"{self.root}/{run_tag}"
        if self.fs.info(run).get("type") != "directory":  # not fs.isdir(): it swallows transport errors too
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), self.location(run_tag))
        # one walk: files, trials, results; on_error="raise": the default drops what it could not list
        found = self.fs.find(run, maxdepth=2, withdirs=True, detail=True, on_error="raise")
        top: dict[str, Mapping[str, object]] = {}
        trials: list[str] = []
        results: dict[str, Mapping[str, object]] = {}
        configs: dict[str, Mapping[str, object]] = {}
        agents: set[str] = set()  # trials whose listing shows an agent/ (a dir, or a link that may be one)
        no_resume = False
        for path, info in found.items():
            parts = path.rstrip("/")[len(run) + 1 :].split("/")
            if parts == [NO_RESUME]:
                no_resume = True
            elif len(parts) == 1 and parts[0] in TOP_FILES:
                top[parts[0]] = info
            elif len(parts) == 1 and is_trial_dir_name(parts[0]) and info.get("type") == "directory":
                trials.append(parts[0])
            elif len(parts) == 2 and is_trial_dir_name(parts[0]):
                if parts[1] == TRIAL_RESULT:
                    results[parts[0]] = info
                elif parts[1] == TRIAL_CONFIG:
                    configs[parts[0]] = info
                elif parts[1] == AGENT_DIR and info.get("type") in ("directory", "link"):
                    agents.add(parts[0])
        read = self._read({f"{run}/{name}": info for name, info in top.items()}, TOP_FILE_CAP)
        files = {name: got[0] for name in top if (got := read[f"{run}/{name}"])[0] is not None}
        trials.sort()
        trial_config = None
        if trials and trials[0] in configs:
            config_path = f"{run}/{trials[0]}/{TRIAL_CONFIG}"
            trial_config = self._read({config_path: configs[trials[0]]}, TRIAL_RESULT_CAP)[config_path][0]
        return RunScan(files, no_resume, self._results(run, trials, results, agents), trial_config)

    def _results(self, run: str, trials: list[str], results: Mapping[str, Mapping[str, object]],
                 agents: set[str]) -> Iterator[TrialRead]:
        for start in range(0, len(trials), _CAT_BATCH):
            batch = trials[start : start + _CAT_BATCH]
            read = self._read({f"{run}/{name}/{TRIAL_RESULT}": results[name] for name in batch if name in results},
                              TRIAL_RESULT_CAP)
            for name in batch:
                content, mtime = read.get(f"{run}/{name}/{TRIAL_RESULT}", (None, None))
                active = content is None and name in agents and self._has_entry(f"{run}/{name}/{AGENT_DIR}")
                yield TrialRead(name, content, mtime, agent_active=active)

    def _has_entry(self, path: str) -> bool:
        """One `ls` of a running trial's agent/, which the walk (depth 2) showed but did not list: listing every
        trial's subdirs (a walk of depth 3) would cost a round trip per finished trial's agent/ and verifier/ too.
        As for a local tree, a fault of that path is False and a transport error is raised."""
        try:
            listed = self.fs.ls(path, detail=False)
        except OSError as exc:
            if not is_path_error(exc):
                raise
            return False
        return any(_strip(self.fs, str(entry)).startswith(f"{path}/") for entry in listed)

    def _read(self, listed: Mapping[str, Mapping[str, object]], cap: int) -> dict[str, tuple[Content | None, float | None]]:
        """Vet each listed file by its listing, then `cat` the good ones in one call, at most cap + 1 bytes each."""
        vetted = {path: self._vet(path, info, cap) for path, info in listed.items()}
        wanted = [path for path, (problem, _) in vetted.items() if problem is None]
        contents = self._cat(wanted, cap)
        out: dict[str, tuple[Content | None, float | None]] = {}
        for path, (problem, info) in vetted.items():
            content = problem or contents.get(path)
            out[path] = (content, _info_mtime(info) if isinstance(content, bytes) else None)
        return out

    def _vet(self, path: str, info: Mapping[str, object], cap: int) -> tuple[Unreadable | None, Mapping[str, object]]:
        if info.get("type") == "link":
            try:
                info = self.fs.info(path)
            except FileNotFoundError:
                return Unreadable("dangling symlink"), info
            except OSError as exc:
                return path_error(exc), info
        if info.get("type") != "file":
            return Unreadable(f"not a regular file ({info.get('type')})"), info
        size = info.get("size")
        return (size_problem(size, cap) if isinstance(size, int) else None), info

    def _cat(self, paths: list[str], cap: int) -> dict[str, Content | None]:
        if not paths:
            return {}
        got = self.fs.cat(paths, on_error="return", end=cap + 1)  # per-file errors come back as values
        failed = next((v for v in got.values() if isinstance(v, Exception) and not is_path_error(v)), None)
        if failed is not None:  # a transport error is not a missing file: the whole read is unknown
            raise failed
        return {_strip(self.fs, path): _cat_content(value, cap) for path, value in got.items()}


def _cat_content(value: bytes | OSError, cap: int) -> Content | None:
    if isinstance(value, FileNotFoundError):
        return None  # gone since the listing
    if isinstance(value, OSError):
        return Unreadable(describe(value))
    return size_problem(len(value), cap) or value


def _strip(fs: fsspec.AbstractFileSystem, path: str) -> str:
    return str(fs._strip_protocol(path)).rstrip("/")


def _info_mtime(info: Mapping[str, object]) -> float | None:
    """fsspec backends disagree on the key and type of a file's modification time."""
    for key in ("mtime", "LastModified", "last_modified", "modified", "created"):
        value = info.get(key)
        if isinstance(value, datetime):
            return value.timestamp()
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return None
