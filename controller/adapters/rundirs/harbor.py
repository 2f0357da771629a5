"""`RunDirs` over `$EVAL_JOBS_DIR/<run_tag>/` in Harbor's layout (REFERENCE.md §3).

Trial dirs are the truth: the job `result.json` carries no trial results and its stats lag (and
go stale when a killed job's sandboxes keep writing), so every trial `result.json` is read once
per pass. Observation never mutates.

What cannot be read is never data: a file of a run dir that is there but cannot be read (see `tree` and
`harbor_format`) sets `RunDirFacts.unreadable`, and so does one of our (`ev_`) run dirs that cannot be
listed; its cell is then Unknown. A missing jobs dir raises `JobsDirMissing`; a transport error makes the
whole observation an `ObservationError`.
"""

from __future__ import annotations

import functools
import logging
from collections import Counter
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any, TypeVar, cast

from fsspec import AbstractFileSystem

from controller.adapters.rundirs.harbor_format import (
    FormatError,
    JobConfigFacts,
    MetaFacts,
    TrialOutcome,
    dataset_basename,
    job_config_facts,
    job_result_facts,
    meta_env_facts,
    trial_outcome,
)
from controller.adapters.rundirs.memo import JobsDirMemo, memo_for, signature
from controller.adapters.rundirs.tree import (
    TRIAL_RESULT,
    Content,
    JobsTree,
    LocalTree,
    RunScan,
    StatKey,
    TrialRead,
    Unreadable,
    describe,
    is_path_error,
    open_tree,
)
from controller.core.errors import ErrorClasses, ErrorKind
from controller.core.ports import JobsDirMissing, ObservationError
from controller.core.types import RUN_TAG_PREFIX, RunDirFacts

log = logging.getLogger(__name__)
T = TypeVar("T")


class HarborRunDirs:
    """Every run dir under `jobs_dir` (a local path or an fsspec URL), reduced to `RunDirFacts`.

    `fs` reads a plain `jobs_dir` through that fsspec filesystem instead of the local disk (run dirs on a login
    node, over sftp). It may also be a zero-argument factory, called at every `observe()`: a connection that
    cannot be made (host down, host key refused) then makes that pass's observation unknown instead of failing
    at construction, and a cached-but-dead connection is replaced.
    """

    def __init__(self, jobs_dir: str, errors: ErrorClasses,
                 fs: AbstractFileSystem | Callable[[], AbstractFileSystem] | None = None) -> None:
        self.jobs_dir = jobs_dir
        self.errors = errors
        self._fs_factory: Callable[[], AbstractFileSystem] | None = None
        self._tree: JobsTree | None = None
        self._memo: JobsDirMemo | None = None
        if fs is None or isinstance(fs, AbstractFileSystem):
            self._tree = open_tree(jobs_dir, fs)
        else:
            self._fs_factory = fs
        if isinstance(self._tree, LocalTree):  # over sftp every read is a round trip anyway: no memo there yet
            self._memo = memo_for(self._tree.root)
            self._tree.recall = self._memo.recall

    def observe(self) -> tuple[RunDirFacts, ...]:
        tree = self._open_tree()
        try:
            run_tags = tree.run_tags()
        except FileNotFoundError:  # fresh, or an unmounted filesystem: only the cells' history can tell
            raise JobsDirMissing(f"jobs dir {self.jobs_dir} does not exist (unmounted filesystem?)") from None
        except Exception as exc:
            raise ObservationError(f"cannot list jobs dir {self.jobs_dir}: {exc}") from exc
        return tuple(facts for run_tag in run_tags if (facts := self._observe_run(tree, run_tag)) is not None)

    def _open_tree(self) -> JobsTree:
        if self._tree is not None:
            return self._tree
        assert self._fs_factory is not None
        try:  # never FileNotFoundError → "nothing ran": a missing key file must not read as an empty dir
            return open_tree(self.jobs_dir, self._fs_factory())
        except Exception as exc:
            raise ObservationError(f"cannot reach jobs dir {self.jobs_dir}: {exc}") from exc

    def _observe_run(self, tree: JobsTree, run_tag: str) -> RunDirFacts | None:
        """The run dir's facts; None for another tool's dir that cannot be listed (we cannot tell whose cell)."""
        location = tree.location(run_tag)
        memo = self._memo if tree is self._tree else None
        sig = signature(location) if memo is not None else None
        if memo is not None and (kept := memo.finished(location, sig)) is not None:
            return kept
        remember = functools.partial(memo.remember_trial, location) if memo is not None else None
        try:
            facts = run_dir_facts(run_tag, location, tree.scan(run_tag), self.errors, remember)
        except Exception as exc:
            if not isinstance(exc, OSError) or not is_path_error(exc):  # the transport failing: the whole read
                raise ObservationError(f"cannot read run dir {location}: {exc}") from exc  # is unknown, not "absent"
            if not run_tag.startswith(RUN_TAG_PREFIX):
                log.warning("skipping unreadable run dir %s: %s", location, exc)
                return None
            facts = RunDirFacts(run_tag=run_tag, path=location, unreadable=f"{location}: {describe(exc)}")
        if facts.unreadable:
            log.warning("run dir %s cannot be read (its cell is Unknown): %s", location, facts.unreadable)
        if memo is not None:
            memo.settle(location, sig, facts)
        return facts


class _Reader:
    """Parses the files of one run dir, keeping the first that could not be read as '<path>: <why>'."""

    def __init__(self, run_path: str) -> None:
        self.run_path = run_path
        self.problem = ""

    def parse(self, name: str, content: Content | None, parse: Callable[[bytes], T]) -> T | None:
        """`parse(content)`; None when the file is absent, or cannot be read (then noted)."""
        if content is None:
            return None
        if isinstance(content, Unreadable):
            reason = content.reason
        else:
            try:
                return parse(content)
            except FormatError as exc:
                reason = str(exc)
        self.problem = self.problem or f"{self.run_path}/{name}: {reason}"
        return None


def run_dir_facts(run_tag: str, path: str, scan: RunScan, errors: ErrorClasses,
                  remember: Callable[[str, StatKey, TrialOutcome], None] | None = None) -> RunDirFacts:
    """Reduce one run dir's files to facts (pure over its inputs; `remember` is told each trial it parsed).

    A dir with a file that cannot be read keeps only what matching needs (which model and benchmark it is)
    and `unreadable`: its other numbers are not data. Trials are read no further than the first bad one.
    """
    reader = _Reader(path)
    meta = reader.parse("meta.env", scan.files.get("meta.env"), meta_env_facts) or MetaFacts()
    config = reader.parse("config.json", scan.files.get("config.json"), job_config_facts)
    result = reader.parse("result.json", scan.files.get("result.json"), job_result_facts)
    identity = _identity(meta, config or JobConfigFacts())
    if reader.problem:
        return RunDirFacts(run_tag=run_tag, path=path, unreadable=reader.problem, **identity)
    tally = _tally(scan.trials, errors, reader, remember)
    if reader.problem:
        return RunDirFacts(run_tag=run_tag, path=path, unreadable=reader.problem, **identity)
    return RunDirFacts(
        run_tag=run_tag,
        path=path,
        **identity,
        has_config=config is not None,
        has_result=result is not None,
        n_total=result.n_total if result else None,
        started_at=result.started_at if result else None,
        finished_at=result.finished_at if result else None,
        fires=meta.resume_count + 1 if meta.resume_count is not None else int(config is not None),
        no_resume=scan.no_resume,
        **tally,
    )


def _identity(meta: MetaFacts, config: JobConfigFacts) -> dict[str, Any]:
    """Which model/benchmark/agent/multiplier the dir is for: meta.env wins for model and dataset."""
    dataset = meta.dataset or config.dataset
    return {
        "model": meta.model or config.model,
        "dataset": dataset,
        "benchmark_name": meta.benchmark_name or (dataset_basename(dataset) if dataset else None),
        "agent": config.agent or meta.agent,
        "timeout_multiplier": config.timeout_multiplier if config.timeout_multiplier is not None
        else meta.timeout_multiplier,
    }


def _tally(trials: Iterable[TrialRead], errors: ErrorClasses, reader: _Reader,
           remember: Callable[[str, StatKey, TrialOutcome], None] | None = None) -> dict[str, Any]:
    """Per-trial counts. Reward sums cover valid (non-infra) trials only, so metrics can use them directly.

    Stops at the first trial result `reader` cannot read: the counts are then not data anyway.
    """
    n_dirs = n_completed = n_scored = 0
    reward_sum = reward_sq_sum = 0.0
    newest: float | None = None
    kinds: Counter[ErrorKind] = Counter()
    classes: Counter[str] = Counter()
    for trial in trials:
        n_dirs += 1
        if trial.known is not None:
            outcome: TrialOutcome | None = cast(TrialOutcome, trial.known)
        else:
            outcome = reader.parse(f"{trial.name}/{TRIAL_RESULT}", trial.result, trial_outcome)
            if reader.problem:
                break
            if outcome is not None and remember is not None and trial.key is not None:
                remember(trial.name, trial.key, outcome)
        if outcome is None:
            continue  # no result yet: the trial is running
        if trial.mtime is not None and (newest is None or trial.mtime > newest):
            newest = trial.mtime
        reward, exception_type = outcome
        if exception_type in errors.interrupted:
            continue  # not completed: a resume runs it again
        n_completed += 1
        kind = None
        if exception_type is not None:
            kind = errors.classify(exception_type, reward is not None)
            kinds[kind] += 1
            classes[exception_type] += 1
        if reward is not None:
            n_scored += 1
            if kind is not ErrorKind.INFRA:
                reward_sum += reward
                reward_sq_sum += reward * reward
    return {
        "n_trial_dirs": n_dirs,
        "n_completed": n_completed,
        "n_scored": n_scored,
        "n_infra_errors": kinds[ErrorKind.INFRA],
        "n_benign_errors": kinds[ErrorKind.BENIGN],
        "n_other_errors": kinds[ErrorKind.OTHER],
        "error_breakdown": errors.breakdown(classes),
        "reward_sum": reward_sum,
        "reward_sq_sum": reward_sq_sum,
        "last_progress_at": datetime.fromtimestamp(newest, UTC) if newest is not None else None,
    }
