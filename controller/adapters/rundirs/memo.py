"""What earlier passes of this process read from a local jobs dir, so a pass costs what is active.

- A run dir Harbor finished (`finished_at` set, nothing unreadable) is kept as its facts, with the stat of the
  dir and of its job files. While none of those change, later passes stat four paths and read nothing: a
  resume rewrites `result.json` and `meta.env`, a new or removed trial dir changes the dir's mtime.
- A trial result of an unfinished dir is kept as what it says, with its mtime and size: a pass stats each
  trial's `result.json` and reads only the new or changed ones. A dir's trials are dropped once it finishes.
- A run dir the memo does not know at all was never read by this process: the cold pass reads many of those in
  worker processes (`harbor`), which hand back what the memo keeps.

Process-wide, per jobs dir: the adapters are rebuilt every pass, and it is `--loop` and the operator that live
long. A one-shot `reconcile --once` starts cold. A lock keeps the entries whole while the operator's passes
observe the same jobs dir from several threads.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from dataclasses import dataclass, field

from controller.adapters.rundirs.tree import StatKey, stat_key
from controller.core.types import RunDirFacts

JOB_FILES = ("result.json", "config.json", "meta.env")
MEMO_RUNS_MAX = 20_000  # run dirs remembered per jobs dir: a lab's whole history, not a flood of foreign entries
Signature = tuple[StatKey | None, ...]


class JobsDirMemo:
    """Bounded: at most `max_runs` run dirs are remembered, the least recently read forgotten first (a forgotten
    dir is read again when a pass asks for it). A jobs dir of 100,000 foreign entries can no longer grow it."""

    def __init__(self, max_runs: int = MEMO_RUNS_MAX) -> None:
        self.max_runs = max_runs
        self._runs: OrderedDict[str, _Kept] = OrderedDict()  # least recently read first
        self._lock = threading.Lock()  # passes of several EvalRuns on one jobs dir run in threads at once

    def finished(self, run: str, signature: Signature | None) -> RunDirFacts | None:
        with self._lock:
            kept = self._runs.get(run)
            if kept is None or kept.finished is None or signature is None or kept.finished[0] != signature:
                return None
            self._runs.move_to_end(run)
            return kept.finished[1]

    def knows(self, run: str) -> bool:
        """Whether a pass of this process read the run dir (and it was not forgotten since)."""
        return run in self._runs

    def recall(self, run: str, name: str, key: StatKey) -> object:
        kept = self._runs.get(run)
        trial = kept.trials.get(name) if kept is not None else None
        return trial[1] if trial is not None and trial[0] == key else None

    def remember_trial(self, run: str, name: str, key: StatKey, outcome: object) -> None:
        with self._lock:
            self._kept(run).trials[name] = (key, outcome)

    def settle(self, run: str, signature: Signature | None, facts: RunDirFacts) -> None:
        """After a full read: keep a finished dir's facts (and forget its trials), or forget an unfinished one's
        facts, keeping it known (even with no trial result yet) so that it is not taken for a cold dir."""
        with self._lock:
            kept = self._kept(run)
            if facts.finished_at is not None and not facts.unreadable and signature is not None:
                kept.finished, kept.trials = (signature, facts), {}
            else:
                kept.finished = None

    def _kept(self, run: str) -> _Kept:
        """The run's entry, made the most recent (under the lock); the oldest beyond `max_runs` are dropped."""
        kept = self._runs.get(run)
        if kept is None:
            kept = self._runs[run] = _Kept()
        self._runs.move_to_end(run)
        while len(self._runs) > self.max_runs:
            self._runs.popitem(last=False)
        return kept


@dataclass
class _Kept:
    finished: tuple[Signature, RunDirFacts] | None = None
    trials: dict[str, tuple[StatKey, object]] = field(default_factory=dict)


def signature(run: str) -> Signature | None:
    """The stat of the run dir and its job files; None when the dir itself cannot be stat-ed."""
    key = stat_key_of_dir(run)
    if key is None:
        return None
    return (key, *(stat_key(os.path.join(run, name)) for name in JOB_FILES))


def stat_key_of_dir(path: str) -> StatKey | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


_MEMOS: dict[str, JobsDirMemo] = {}
_GUARD = threading.Lock()


def memo_for(jobs_dir: str) -> JobsDirMemo:
    with _GUARD:
        return _MEMOS.setdefault(os.path.abspath(jobs_dir), JobsDirMemo())

