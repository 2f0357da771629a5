"""What earlier passes of this process read from a local jobs dir, so a pass costs what is active.

- A run dir Harbor finished (`finished_at` set, nothing unreadable) is kept as its facts, with the stat of the
  dir and of its job files. While none of those change, later passes stat four paths and read nothing: a
  resume rewrites `result.json` and `meta.env`, a new or removed trial dir changes the dir's mtime.
- A trial result of an unfinished dir is kept as what it says, with its mtime and size: a pass stats each
  trial's `result.json` and reads only the new or changed ones. A dir's trials are dropped once it finishes.
- A run dir the memo does not know at all was never read by this process: the cold pass reads many of those in
  worker processes (`harbor`), which hand back what the memo keeps.

Process-wide, per jobs dir: the adapters are rebuilt every pass, and it is `--loop` and the operator that live
long. A lock keeps the entries whole while the operator's passes observe the same jobs dir from several threads.

Fresh processes (cron, GitOps CI, `reconcile --once` on a login node) remember finished dirs through a cache file
per jobs dir and error classes (`cache_dir()`): the finished facts with their signatures, written after a pass that
changed them (atomically), loaded when the process first observes that jobs dir. It is a cache, never evidence: a
kept fact is used only while its signature is the dir's, and a file that cannot be read or decoded, or was written
for another format, schema or error classes, is ignored (and replaced by the next pass's).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from controller.adapters.rundirs.localfs import Signature, StatKey, read_local, signature
from controller.core.observed import RunDirFacts
from controller.core.trial_errors import ErrorClasses

log = logging.getLogger(__name__)

MEMO_RUNS_MAX = 20_000  # run dirs remembered per jobs dir: a lab's whole history, not a flood of foreign entries
CACHE_FORMAT = 2  # bump when what a run dir's files are reduced to changes without RunDirFacts' schema changing
CACHE_FILE_CAP = 64 << 20  # 20,000 finished dirs' facts are ~30 MiB


class JobsDirMemo:
    """Bounded: at most `max_runs` run dirs are remembered, the least recently read forgotten first (a forgotten
    dir is read again when a pass asks for it). A jobs dir of 100,000 foreign entries can no longer grow it."""

    def __init__(self, max_runs: int = MEMO_RUNS_MAX, cache: Path | None = None,
                 header: CacheHeader | None = None) -> None:
        self.max_runs = max_runs
        self._runs: OrderedDict[str, _Kept] = OrderedDict()  # least recently read first
        self._lock = threading.Lock()  # passes of several EvalRuns on one jobs dir run in threads at once
        self._cache, self._header = cache, header
        self._unsaved = False  # finished facts changed since the cache file was written
        if cache is not None:
            self._load(cache)

    def finished(self, run: str, signature: Signature | None) -> RunDirFacts | None:
        with self._lock:
            kept = self._runs.get(run)
            if kept is None or kept.finished is None or signature is None or kept.finished[0] != signature:
                return None
            self._runs.move_to_end(run)
            return kept.finished[1]

    def knows(self, run: str) -> bool:
        """Whether a pass of this process read the run dir (and it was not forgotten since), or the cache holds its
        facts as of its current signature: else reading it is a cold read."""
        kept = self._runs.get(run)
        if kept is None:
            return False
        return not kept.cached or (kept.finished is not None and kept.finished[0] == signature(run))

    def recall(self, run: str, name: str, key: StatKey) -> object:
        kept = self._runs.get(run)
        trial = kept.trials.get(name) if kept is not None else None
        return trial[1] if trial is not None and trial[0] == key else None

    def recall_for(self, run: str) -> Callable[[str, StatKey], object] | None:
        """`recall` for the trials of `run`; None when none of them is kept (a cold dir: nothing to stat for)."""
        kept = self._runs.get(run)
        return None if kept is None or not kept.trials else functools.partial(self.recall, run)

    def known(self, run: str) -> dict[str, Any]:
        """What a probe on the run dir's host is told of it: the signature of its finished facts, else the StatKeys
        of the trial results already parsed (`probe.scan`)."""
        with self._lock:
            kept = self._runs.get(run)
            if kept is None:
                return {}
            if kept.finished is not None:
                return {"finished": kept.finished[0]}
            return {"trials": {name: key for name, (key, _) in kept.trials.items()}}

    def remember_trial(self, run: str, name: str, key: StatKey, outcome: object) -> None:
        with self._lock:
            self._kept(run).trials[name] = (key, outcome)

    def settle(self, run: str, signature: Signature | None, facts: RunDirFacts) -> None:
        """After a full read: keep a finished dir's facts (and forget its trials), or forget an unfinished one's
        facts, keeping it known (even with no trial result yet) so that it is not taken for a cold dir."""
        with self._lock:
            kept = self._kept(run)
            kept.cached = False
            if facts.finished_at is not None and not facts.unreadable and signature is not None:
                self._unsaved |= kept.finished != (signature, facts)
                kept.finished, kept.trials = (signature, facts), {}
            else:
                self._unsaved |= kept.finished is not None
                kept.finished = None

    def save(self) -> None:
        """Write the finished facts to the cache file when they changed since; a cache that cannot be written is
        only slower next time."""
        if self._cache is None or not self._unsaved:
            return
        with self._lock:
            runs = [(run, *kept.finished) for run, kept in self._runs.items() if kept.finished is not None]
            self._unsaved = False
        try:
            self._cache.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile("w", dir=self._cache.parent, prefix=".rundirs-", delete=False) as out:
                out.write(_CacheFile.model_construct(**dict(self._header or {}), runs=runs).model_dump_json())
            os.replace(out.name, self._cache)
        except OSError as exc:
            log.warning("cannot write the run-dir cache %s: %s", self._cache, exc)

    def _load(self, cache: Path) -> None:
        """One validation of the whole file (JSON parsed and checked by pydantic-core: 70 ms for 1,000 dirs, where
        json.loads then a model_validate each took 100-140 ms)."""
        content, _ = read_local(str(cache), CACHE_FILE_CAP)
        if content is None:
            return
        try:
            if not isinstance(content, bytes):
                raise ValueError(content.reason)
            document = _CacheFile.model_validate_json(content)
            if CacheHeader.model_validate(document.model_dump(exclude={"runs"})) != self._header:
                raise ValueError("written for another format, schema, jobs dir or error classes")
            for run, sig, facts in document.runs[-self.max_runs:]:
                self._runs[run] = _Kept(finished=(sig, facts), cached=True)
        except Exception as exc:  # anything: a cache is never trusted over reading the dirs again
            self._runs.clear()
            log.info("ignoring the run-dir cache %s: %s", cache, str(exc)[:200])

    def _kept(self, run: str) -> _Kept:
        """The run's entry, made the most recent (under the lock); the oldest beyond `max_runs` are dropped."""
        kept = self._runs.get(run)
        if kept is None:
            kept = self._runs[run] = _Kept()
        self._runs.move_to_end(run)
        while len(self._runs) > self.max_runs:
            self._runs.popitem(last=False)
        return kept


class CacheHeader(BaseModel):
    """What a cache file was written for: facts kept under anything else are not these."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    format: int
    jobs_dir: str
    errors: str  # digest of the error classes
    facts_schema: str  # digest of RunDirFacts' JSON schema


class _CacheFile(CacheHeader):
    runs: list[tuple[str, Signature, RunDirFacts]]


@dataclass
class _Kept:
    finished: tuple[Signature, RunDirFacts] | None = None
    trials: dict[str, tuple[StatKey, object]] = field(default_factory=dict)
    cached: bool = False  # from the cache file, not read by this process yet


_MEMOS: dict[tuple[str, str], JobsDirMemo] = {}
_GUARD = threading.Lock()


def memo_for(jobs_dir: str, errors: ErrorClasses, host: str | None = None) -> JobsDirMemo:
    """The process's memo of `jobs_dir` (on `host`, else here) as read with `errors` (they decide what a trial
    counts as; sorted for the digest: a frozenset's order changes from process to process)."""
    root = os.path.abspath(jobs_dir) if host is None else f"{host}:{jobs_dir}"
    classes = _digest(json.dumps({name: sorted(names) for name, names in errors.model_dump().items()}, sort_keys=True))
    with _GUARD:
        memo = _MEMOS.get((root, classes))
        if memo is None:
            header = CacheHeader(format=CACHE_FORMAT, jobs_dir=root, errors=classes, facts_schema=_schema_digest())
            cache = cache_dir()
            name = f"rundirs-{_digest(header.model_dump_json())}.json"
            memo = _MEMOS[(root, classes)] = JobsDirMemo(cache=cache / name if cache else None, header=header)
        return memo


def cache_dir() -> Path | None:
    """`$EVALCTL_CACHE_DIR`, else `$XDG_CACHE_HOME/evalrun-controller`, else `~/.cache/evalrun-controller`; an
    empty `EVALCTL_CACHE_DIR` turns the cache off."""
    configured = os.environ.get("EVALCTL_CACHE_DIR")
    if configured is not None:
        return Path(configured) if configured else None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "evalrun-controller"


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:24]


@functools.cache
def _schema_digest() -> str:
    return _digest(json.dumps(RunDirFacts.model_json_schema(), sort_keys=True))

