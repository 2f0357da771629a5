"""What earlier passes of this process read from a local jobs dir, so a pass costs what is active.

- A run dir Harbor finished (`finished_at` set, nothing unreadable) is kept as its facts, with the stat of the
  dir and of its job files. While none of those change, later passes stat four paths and read nothing: a
  resume rewrites `result.json` and `meta.env`, a new or removed trial dir changes the dir's mtime.
- A trial result of an unfinished dir is kept as what it says, with its mtime and size: a pass stats each
  trial's `result.json` and reads only the new or changed ones. A dir's trials are dropped once it finishes.
- A run dir the memo does not know at all was never read by this process: the cold pass reads many of those in
  worker processes (`harbor`), which hand back what the memo keeps.

Process-wide, per jobs dir: the adapters are rebuilt every pass, and it is `--loop` and the operator that live
long. A one-shot `reconcile --once` starts cold. Entries are replaced whole, so threads observing the same
jobs dir at once only ever see a complete entry.
"""

from __future__ import annotations

import os
import threading

from controller.adapters.rundirs.tree import StatKey, stat_key
from controller.core.types import RunDirFacts

JOB_FILES = ("result.json", "config.json", "meta.env")
Signature = tuple[StatKey | None, ...]


class JobsDirMemo:
    def __init__(self) -> None:
        self._finished: dict[str, tuple[Signature, RunDirFacts]] = {}
        self._trials: dict[str, dict[str, tuple[StatKey, object]]] = {}

    def finished(self, run: str, signature: Signature | None) -> RunDirFacts | None:
        kept = self._finished.get(run)
        return kept[1] if kept is not None and signature is not None and kept[0] == signature else None

    def knows(self, run: str) -> bool:
        """Whether a pass of this process read the run dir (and it was not forgotten since)."""
        return run in self._finished or run in self._trials

    def recall(self, run: str, name: str, key: StatKey) -> object:
        kept = self._trials.get(run, {}).get(name)
        return kept[1] if kept is not None and kept[0] == key else None

    def remember_trial(self, run: str, name: str, key: StatKey, outcome: object) -> None:
        self._trials.setdefault(run, {})[name] = (key, outcome)

    def settle(self, run: str, signature: Signature | None, facts: RunDirFacts) -> None:
        """After a full read: keep a finished dir's facts (and forget its trials), or forget an unfinished one's
        facts, keeping it known (even with no trial result yet) so that it is not taken for a cold dir."""
        if facts.finished_at is not None and not facts.unreadable and signature is not None:
            self._finished[run] = (signature, facts)
            self._trials.pop(run, None)
        else:
            self._finished.pop(run, None)
            self._trials.setdefault(run, {})


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

