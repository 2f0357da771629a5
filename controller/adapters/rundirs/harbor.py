"""`RunDirs` over `$EVAL_JOBS_DIR/<run_tag>/` in Harbor's layout (REFERENCE.md §3).

Trial dirs are the truth: the job `result.json` carries no trial results and its stats lag (and
go stale when a killed job's sandboxes keep writing), so every trial `result.json` is read once
per pass. Observation never mutates and never raises for one bad dir or file.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime

from fsspec import AbstractFileSystem

from controller.adapters.rundirs.harbor_format import (
    dataset_basename,
    job_config_facts,
    load_json,
    parse_float,
    parse_int,
    parse_meta_env,
    parse_time,
    trial_outcome,
)
from controller.adapters.rundirs.tree import JobsTree, TrialRead, open_tree
from controller.core.errors import ErrorClasses, ErrorKind
from controller.core.ports import ObservationError
from controller.core.types import RUN_TAG_PREFIX, RunDirFacts

log = logging.getLogger(__name__)


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
        if fs is None or isinstance(fs, AbstractFileSystem):
            self._tree = open_tree(jobs_dir, fs)
        else:
            self._fs_factory = fs

    def observe(self) -> tuple[RunDirFacts, ...]:
        tree = self._tree
        if tree is None:
            assert self._fs_factory is not None
            try:  # never FileNotFoundError → "nothing ran": a missing key file must not read as an empty dir
                tree = open_tree(self.jobs_dir, self._fs_factory())
            except Exception as exc:
                raise ObservationError(f"cannot reach jobs dir {self.jobs_dir}: {exc}") from exc
        try:
            run_tags = tree.run_tags()
        except FileNotFoundError:
            return ()  # a fresh cluster: nothing has run yet
        except Exception as exc:
            raise ObservationError(f"cannot list jobs dir {self.jobs_dir}: {exc}") from exc
        observed: list[RunDirFacts] = []
        for run_tag in run_tags:
            try:
                observed.append(self._observe_run(tree, run_tag))
            except (FileNotFoundError, NotADirectoryError) as exc:  # vanished since the listing, or a stray file
                log.warning("skipping run dir %s: %s", tree.location(run_tag), exc)
            except Exception as exc:
                if _foreign_and_unreadable(run_tag, exc):  # another tool's dir we may not read: not ours to judge
                    log.warning("skipping unreadable run dir %s: %s", tree.location(run_tag), exc)
                    continue
                # ours and unreadable, or the transport failing: the whole read is unknown, never "absent"
                raise ObservationError(f"cannot read run dir {tree.location(run_tag)}: {exc}") from exc
        return tuple(observed)

    def _observe_run(self, tree: JobsTree, run_tag: str) -> RunDirFacts:
        scan = tree.scan(run_tag)
        return run_dir_facts(run_tag, tree.location(run_tag), scan.files, scan.trials, self.errors)


def _foreign_and_unreadable(run_tag: str, exc: Exception) -> bool:
    transport = isinstance(exc, (TimeoutError, ConnectionError))
    return isinstance(exc, OSError) and not transport and not run_tag.startswith(RUN_TAG_PREFIX)


def run_dir_facts(
    run_tag: str,
    path: str,
    files: Mapping[str, bytes | None],
    trials: Iterable[TrialRead],
    errors: ErrorClasses,
) -> RunDirFacts:
    """Reduce one run dir's files to facts (pure over its inputs)."""
    meta = parse_meta_env(files.get("meta.env"))
    config_doc = load_json(files.get("config.json"))
    result_doc = load_json(files.get("result.json"))
    config = job_config_facts(config_doc or {})
    dataset = meta.get("REPO_ID") or config.dataset
    resume_count = parse_int(meta.get("RESUME_COUNT"))
    fires = resume_count + 1 if resume_count is not None else int("config.json" in files)
    tally = _tally(trials, errors)
    return RunDirFacts(
        run_tag=run_tag,
        path=path,
        model=meta.get("MODEL") or config.model,
        dataset=dataset,
        benchmark_name=meta.get("BENCHMARK_NAME") or (dataset_basename(dataset) if dataset else None),
        agent=config.agent or meta.get("AGENT_NAME") or None,
        timeout_multiplier=config.timeout_multiplier
        if config.timeout_multiplier is not None
        else parse_float(meta.get("TIMEOUT_MULTIPLIER")),
        has_config=config_doc is not None,
        has_result=result_doc is not None,
        n_total=parse_int((result_doc or {}).get("n_total_trials")),
        started_at=parse_time((result_doc or {}).get("started_at")),
        finished_at=parse_time((result_doc or {}).get("finished_at")),
        fires=fires,
        no_resume=".no-resume" in files,
        **tally,
    )


def _tally(trials: Iterable[TrialRead], errors: ErrorClasses) -> dict:
    """Per-trial counts. Reward sums cover valid (non-infra) trials only, so metrics can use them directly."""
    n_dirs = n_completed = n_scored = 0
    reward_sum = reward_sq_sum = 0.0
    newest: float | None = None
    kinds: Counter[ErrorKind] = Counter()
    classes: Counter[str] = Counter()
    for trial in trials:
        n_dirs += 1
        doc = load_json(trial.result)
        if doc is None:
            continue
        if trial.mtime is not None and (newest is None or trial.mtime > newest):
            newest = trial.mtime
        reward, exception_type = trial_outcome(doc)
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
