"""`RunDirs` over `$EVAL_JOBS_DIR/<run_tag>/` in Harbor's layout (RULES §3).

Trial dirs are the truth: the job `result.json` carries no trial results and its stats lag (and
go stale when a killed job's sandboxes keep writing), so every trial `result.json` is read once
per pass. Observation never mutates.

What cannot be read is never data: a file of a run dir that is there but cannot be read (see `tree` and
`harbor_format`) sets `RunDirFacts.unreadable`, and so does one of our (`ev_`) run dirs that cannot be
listed; its cell is then Unknown. A missing jobs dir raises `JobsDirMissing`; a transport error makes the
whole observation an `ObservationError`.

On a local disk a pass costs what is active (`memo`); the first pass reads everything, and when that is many run
dirs, they are read in worker processes on every core (`parallel`) while this process assembles the facts in order.

A run dir is written by the job: the text it holds (exception class names, task names, the agent's endpoint, why a
file cannot be read) and the probe's error lines leave `observe` masked with the cluster's secrets (`masked_facts`).
"""

from __future__ import annotations

import base64
import functools
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any, Literal, TypeVar

from fsspec import AbstractFileSystem

from controller.adapters.rundirs import parallel
from controller.adapters.rundirs.harbor_format import (
    FormatError,
    JobConfigFacts,
    MetaFacts,
    TrialOutcome,
    dataset_basename,
    job_config_facts,
    job_result_facts,
    meta_env_facts,
    trial_api_base,
)
from controller.adapters.rundirs.localfs import (
    Content,
    Signature,
    StatKey,
    Unreadable,
    describe,
    is_path_error,
    signature,
)
from controller.adapters.rundirs.memo import JobsDirMemo, memo_for
from controller.adapters.rundirs.remote import RunDirProbe
from controller.adapters.rundirs.tally import Reader, tally
from controller.adapters.rundirs.tree import JobsTree, LocalTree, RunScan, TrialRead, open_tree
from controller.adapters.secrets import SecretMask, masking_errors
from controller.core.observed import QuietFailure, Recorded, RecordedWhat, RunDirFacts
from controller.core.ports import JobsDirMissing, ObservationError, RunTagFilter, every_run_tag
from controller.core.trial_errors import ErrorClasses
from controller.core.types import RUN_TAG_PREFIX

log = logging.getLogger(__name__)
T = TypeVar("T")
# Never-read run dirs from which reading them in workers pays for starting those (~0.5 s). Measured, 100 trials a
# dir, from disk: 64 dirs 1.08 s serial, 1.15-1.22 s in workers; 128 dirs 2.2-2.3 s serial, 1.7 s in workers.
PARALLEL_FROM = 128
# Workers only when they win: from the page cache, 200 dirs read serially in 0.33 s and in workers in 0.72-0.81 s
# (their start). So the first SAMPLE_DIRS cold dirs are read here, timed, and the rest go to workers only when
# reading them here would take longer than WORKERS_WIN_FROM_S.
SAMPLE_DIRS = 16
WORKERS_WIN_FROM_S = 1.0
# Dirs not named like ours are read in full (their config says whose they are): a flood of them must not cost
# every pass gigabytes, so past this many the jobs dir is not observed (its cells Unknown, with why), never
# half-read into "no run dir, submit".
FOREIGN_DIRS_MAX = 10_000
BATCH = 8  # run dirs per worker task: ~800 trial results, small enough that the cores finish together

RunRead = RunDirFacts | OSError  # an OSError: a fault of the run dir's own path (see `read_run`)
ColdRead = tuple[Signature | None, RunRead, list[tuple[str, StatKey, TrialOutcome]]]  # and the trials it parsed
Ahead = tuple[Future[list[ColdRead]], int]  # a worker's task reading a batch of run dirs, and one's index in it


class HarborRunDirs:
    """Every run dir under `jobs_dir` (a local path or an fsspec URL), reduced to `RunDirFacts`.

    `fs` reads a plain `jobs_dir` through that fsspec filesystem instead of the local disk (run dirs on a login
    node, over sftp). It may also be a zero-argument factory, called at every `observe()`: a connection that
    cannot be made (host down, host key refused) then makes that pass's observation unknown instead of failing
    at construction, and a cached-but-dead connection is replaced.

    `parallel_from`: how many never-read run dirs of a local jobs dir make a pass consider worker processes;
    `workers_from_s`: how long reading the rest here must promise to take for workers to be started (0: always).

    `probe`: `jobs_dir` is a path on that login node, read there by the run-dir probe in a few round trips a
    pass, told what this process (or its cache) already knows.

    `mask`: the cluster's secrets, which the facts' text and the errors' messages are masked with.
    """

    def __init__(self, jobs_dir: str, errors: ErrorClasses,
                 fs: AbstractFileSystem | Callable[[], AbstractFileSystem] | None = None,
                 parallel_from: int = PARALLEL_FROM, probe: RunDirProbe | None = None,
                 workers_from_s: float = WORKERS_WIN_FROM_S, mask: SecretMask | None = None) -> None:
        self.jobs_dir = jobs_dir
        self.errors = errors
        self.mask = mask or SecretMask()
        self.parallel_from, self.workers_from_s = parallel_from, workers_from_s
        self._fs_factory: Callable[[], AbstractFileSystem] | None = None
        self._tree: JobsTree | None = None
        self._memo: JobsDirMemo | None = None
        self._probe = probe
        if probe is not None:  # a plain path on the probe's login node: read there, remembered here
            self._memo = memo_for(jobs_dir, errors, host=probe.host)
        elif fs is None or isinstance(fs, AbstractFileSystem):
            self._tree = open_tree(jobs_dir, fs)
        else:
            self._fs_factory = fs
        if isinstance(self._tree, LocalTree):  # over sftp every read is a round trip anyway: no memo there yet
            self._memo = memo_for(self._tree.root, errors)
            self._tree.recall = self._memo.recall_for

    def observe(self, wanted: RunTagFilter = every_run_tag) -> tuple[RunDirFacts, ...]:
        """The facts of the run dirs `wanted` names: a pass reads its own cells' dirs, never a jobs dir's every
        entry (100,000 foreign `ev_` entries cost gigabytes of memo when they were all read). Masked here, after
        the memo, so a cached fact is masked with the secrets of today."""
        known = functools.lru_cache(maxsize=4096)(self.mask.known)  # task and class names repeat across dirs
        with masking_errors(self.mask):  # the probe's error line, a path the job named
            return tuple(masked_facts(facts, known) for facts in self._observe(wanted))

    def _observe(self, wanted: RunTagFilter) -> tuple[RunDirFacts, ...]:
        if self._probe is not None:
            observed = self._observe_probed(self._probe, wanted)
        else:
            tree = self._open_tree()
            try:
                run_tags = self._bounded([tag for tag in tree.run_tags() if wanted(tag)])
            except FileNotFoundError:  # fresh, or an unmounted filesystem: only the cells' history can tell
                raise JobsDirMissing(f"jobs dir {self.jobs_dir} does not exist") from None
            except ObservationError:
                raise
            except Exception as exc:
                raise ObservationError(f"cannot list jobs dir {self.jobs_dir}: {exc}") from exc
            sampled: dict[str, RunDirFacts | None] = {}
            with self._read_ahead(tree, run_tags, sampled) as ahead:
                observed = tuple(facts for run_tag in run_tags
                                 if (facts := sampled[run_tag] if run_tag in sampled
                                     else self._observe_run(tree, run_tag, ahead.get(run_tag))) is not None)
        if self._memo is not None:
            self._memo.save()
        return observed

    def _bounded(self, run_tags: list[str]) -> list[str]:
        foreign = sum(not tag.startswith(RUN_TAG_PREFIX) for tag in run_tags)
        if foreign > FOREIGN_DIRS_MAX:
            raise ObservationError(
                f"jobs dir {self.jobs_dir} holds {foreign} run dirs not named by evalrun-controller, over the "
                f"{FOREIGN_DIRS_MAX} a pass reads to adopt the old listener's runs: move the finished ones out of it")
        return run_tags

    def _observe_probed(self, probe: RunDirProbe, wanted: RunTagFilter) -> tuple[RunDirFacts, ...]:
        """Two probe calls (list, then scan what the pass wants, in batches), whatever the fleet."""
        memo = self._memo
        assert memo is not None
        run_tags = self._bounded([tag for tag in probe.run_tags(self.jobs_dir) if wanted(tag)])
        locations = {tag: f"{self.jobs_dir.rstrip('/')}/{tag}" for tag in run_tags}
        known = {tag: memo.known(location) for tag, location in locations.items()}
        answers = probe.scan(self.jobs_dir, known)
        observed = []
        for tag, location in locations.items():
            try:
                facts = self._probed_run(memo, tag, location, known[tag], answers[tag])
            except (KeyError, TypeError, ValueError, IndexError) as exc:
                raise ObservationError(f"the run-dir probe's answer for {location} is malformed: {exc!r}") from exc
            if facts is not None:
                observed.append(facts)
        return tuple(observed)

    def _probed_run(self, memo: JobsDirMemo, run_tag: str, location: str, known: dict[str, Any],
                    answer: dict[str, Any]) -> RunDirFacts | None:
        if answer.get("same"):
            kept = memo.finished(location, _signature(known["finished"]))
            if kept is None:
                raise ObservationError(f"{location}: forgotten while the probe read it; read again next pass")
            return kept
        if "fault" in answer:
            return self._settled(run_tag, location, OSError(0, str(answer["fault"])), None)  # strerror: the why
        sig = _signature(answer["signature"])
        scan = probed_scan(answer, functools.partial(memo.recall, location),
                           functools.partial(memo.remember_trial, location))
        return self._settled(run_tag, location, run_dir_facts(run_tag, location, scan, self.errors), sig)

    def _open_tree(self) -> JobsTree:
        if self._tree is not None:
            return self._tree
        assert self._fs_factory is not None
        try:  # never FileNotFoundError → "nothing ran": a missing key file must not read as an empty dir
            return open_tree(self.jobs_dir, self._fs_factory())
        except Exception as exc:
            raise ObservationError(f"cannot reach jobs dir {self.jobs_dir}: {exc}") from exc

    @contextmanager
    def _read_ahead(self, tree: JobsTree, run_tags: Sequence[str],
                    sampled: dict[str, RunDirFacts | None]) -> Iterator[dict[str, Ahead]]:
        """The run dirs of a local jobs dir that this process never read, being read in worker processes, when
        there are `parallel_from` of them, more than one CPU, the workers could be started, and the first few
        (read here, into `sampled`) say the rest would take longer here than `workers_from_s`; else none.
        The workers are gone after the block."""
        memo = self._memo if tree is self._tree else None
        cold = [tag for tag in run_tags if not memo.knows(tree.location(tag))] if memo is not None else []
        if len(cold) < max(self.parallel_from, 1) or parallel.cpus() < 2:
            yield {}
            return
        if self.workers_from_s > 0:
            started = time.perf_counter()
            for run_tag in cold[:SAMPLE_DIRS]:
                sampled[run_tag] = self._observe_run(tree, run_tag)
            cold = cold[SAMPLE_DIRS:]
            if (time.perf_counter() - started) / len(sampled) * len(cold) < self.workers_from_s:
                yield {}
                return
        assert isinstance(tree, LocalTree)  # the memo is for local trees only
        batches = [cold[start : start + BATCH] for start in range(0, len(cold), BATCH)]
        with parallel.worker_pool() as pool:
            tasks = parallel.submit_all(pool, read_cold, [(tree.root, batch, self.errors) for batch in batches])
            if tasks is None:
                yield {}
                return
            yield {tag: (task, index) for task, batch in zip(tasks, batches, strict=True)
                   for index, tag in enumerate(batch)}

    def _observe_run(self, tree: JobsTree, run_tag: str, ahead: Ahead | None = None) -> RunDirFacts | None:
        """The run dir's facts; None for another tool's dir that cannot be listed (we cannot tell whose cell).

        `ahead`: it is being read in a worker, which hands back what the memo keeps of it, as a read here would.
        """
        location = tree.location(run_tag)
        memo = self._memo if tree is self._tree else None
        if ahead is not None:
            assert memo is not None
            task, index = ahead
            sig, facts, trials = parallel.result(task)[index]
            for name, key, outcome in trials:
                memo.remember_trial(location, name, key, outcome)
        else:
            sig = signature(location) if memo is not None else None
            if memo is not None and (kept := memo.finished(location, sig)) is not None:
                return kept
            remember = functools.partial(memo.remember_trial, location) if memo is not None else None
            facts = read_run(tree, run_tag, self.errors, remember)
        return self._settled(run_tag, location, facts, sig)

    def _settled(self, run_tag: str, location: str, facts: RunRead, sig: Signature | None) -> RunDirFacts | None:
        """The facts of a dir read whole, kept by the memo; a fault of its own path makes one of ours unreadable,
        and another tool's dir skipped (we cannot tell whose cell it is)."""
        if isinstance(facts, OSError):
            if not run_tag.startswith(RUN_TAG_PREFIX):
                log.warning("skipping unreadable run dir %s: %s", location, facts)
                return None
            facts = RunDirFacts(run_tag=run_tag, path=location, unreadable=f"{location}: {describe(facts)}")
        if facts.unreadable:
            log.warning("run dir %s cannot be read (its cell is Unknown): %s", location, facts.unreadable)
        if self._memo is not None:
            self._memo.settle(location, sig, facts)
        return facts


TEXT_FACTS = ("model", "dataset", "benchmark_name", "agent", "api_base", "invalid", "fractional", "unreadable")


def masked_facts(facts: RunDirFacts, mask: Callable[[str], str]) -> RunDirFacts:
    """The text a job wrote into its run dir, masked; its numbers, and our own names (run tag, path), as they are.

    Names that mask alike are counted together. Unchanged facts are the same object: a pass masks every dir."""
    update: dict[str, Any] = {name: masked for name in TEXT_FACTS
                              if (value := getattr(facts, name)) and (masked := mask(value)) != value}
    for field in ("error_breakdown", "infra_error_breakdown"):
        breakdown: dict[str, int] = getattr(facts, field)
        if any(mask(name) != name for name in breakdown):
            errors: Counter[str] = Counter()
            for name, count in breakdown.items():
                errors[mask(name)] += count
            update[field] = dict(errors)
    if any(mask(name) != name for name in facts.tasks):
        tasks: dict[str, tuple[int, int, float]] = {}
        for name, (completed, scored, reward) in facts.tasks.items():
            was = tasks.get(key := mask(name), (0, 0, 0.0))
            tasks[key] = (was[0] + completed, was[1] + scored, was[2] + reward)
        update["tasks"] = tasks
    quiet = tuple(_masked_quiet(q, mask) for q in facts.quiet_failures)
    if any(new is not old for new, old in zip(quiet, facts.quiet_failures, strict=True)):
        update["quiet_failures"] = quiet
    if any(mask(claim.value) != claim.value for claim in facts.recorded):
        update["recorded"] = tuple(dict.fromkeys(claim.model_copy(update={"value": mask(claim.value)})
                                                 for claim in facts.recorded))
    return facts.model_copy(update=update) if update else facts


def _masked_quiet(failure: QuietFailure, mask: Callable[[str], str]) -> QuietFailure:
    task, kind = mask(failure.task), failure.exception_type and mask(failure.exception_type)
    return failure if (task, kind) == (failure.task, failure.exception_type) else \
        failure.model_copy(update={"task": task, "exception_type": kind})


def read_run(tree: JobsTree, run_tag: str, errors: ErrorClasses,
             remember: Callable[[str, StatKey, TrialOutcome], None] | None = None) -> RunRead:
    """The run dir's facts, or the fault of its own path that kept it from being listed (a value, which a worker
    can hand back); the transport failing raises `ObservationError`: the whole read is unknown, not "absent"."""
    try:
        return run_dir_facts(run_tag, tree.location(run_tag), tree.scan(run_tag), errors, remember)
    except Exception as exc:
        if isinstance(exc, OSError) and is_path_error(exc):
            return exc
        raise ObservationError(f"cannot read run dir {tree.location(run_tag)}: {exc}") from exc


def read_cold(root: str, run_tags: Sequence[str], errors: ErrorClasses) -> list[ColdRead]:
    """In a worker: run dirs of the local jobs dir at `root` read whole, each with its signature (taken first,
    as in `_observe_run`) and every trial outcome it parsed, with the StatKey the memo keeps it by."""
    tree = LocalTree(root)
    reads: list[ColdRead] = []
    for run_tag in run_tags:
        trials: list[tuple[str, StatKey, TrialOutcome]] = []
        sig = signature(tree.location(run_tag))
        reads.append((sig, read_run(tree, run_tag, errors, functools.partial(_collect, trials)), trials))
    return reads


def probed_scan(answer: dict[str, Any], recall: Callable[[str, StatKey], object],
                remember: Callable[[str, StatKey, TrialOutcome], None]) -> RunScan:
    """A probe's answer for one run dir, as the scan of a local tree would give it: trials it found unchanged
    come from `recall`, the outcomes it parsed are told to `remember`."""
    files = {name: _probed_content(value) for name, value in answer["files"].items()}
    config = answer["trial_config"]
    trials = []
    for name, kind, value, mtime, key, active in answer["trials"]:
        key = (int(key[0]), int(key[1])) if key else None
        if kind == "known":
            known = recall(name, key) if key else None
            if known is None:
                raise ObservationError(f"{name}: the probe found it unchanged, but it was forgotten meanwhile")
            trials.append(TrialRead(name, None, mtime, known, key))
        elif kind == "outcome":
            outcome = TrialOutcome(*value)
            if key is not None:
                remember(name, key, outcome)
            trials.append(TrialRead(name, None, mtime, outcome, key))
        elif kind == "unreadable":
            trials.append(TrialRead(name, Unreadable(str(value)), None))
        else:
            trials.append(TrialRead(name, None, None, agent_active=bool(active)))
    return RunScan(files, bool(answer["no_resume"]), iter(trials),
                   None if config is None else _probed_content(config))


def _signature(value: Sequence[Sequence[int] | None]) -> Signature:
    """A signature as JSON carries it (lists) or the memo keeps it (tuples), as the memo compares it."""
    return tuple((int(key[0]), int(key[1])) if key else None for key in value)


def _probed_content(value: list[str]) -> Content:
    kind, text = value
    return Unreadable(text) if kind == "unreadable" else base64.b64decode(text, validate=True)


def _collect(into: list[tuple[str, StatKey, TrialOutcome]], name: str, key: StatKey, outcome: TrialOutcome) -> None:
    into.append((name, key, outcome))


def run_dir_facts(run_tag: str, path: str, scan: RunScan, errors: ErrorClasses,
                  remember: Callable[[str, StatKey, TrialOutcome], None] | None = None) -> RunDirFacts:
    """Reduce one run dir's files to facts (pure over its inputs; `remember` is told each trial it parsed).

    A dir with a file that cannot be read keeps only what matching needs (which model and benchmark it is)
    and `unreadable`: its other numbers are not data. Trials are read no further than the first bad one.
    """
    reader = Reader(path)
    meta = reader.parse("meta.env", scan.files.get("meta.env"), meta_env_facts) or MetaFacts()
    config = reader.parse("config.json", scan.files.get("config.json"), job_config_facts)
    result = reader.parse("result.json", scan.files.get("result.json"), job_result_facts)
    identity = _identity(meta, config or JobConfigFacts())
    if reader.problem:
        return RunDirFacts(run_tag=run_tag, path=path, unreadable=reader.problem, **identity)
    counts = tally(scan.trials, errors, reader, remember)
    if reader.problem:
        return RunDirFacts(run_tag=run_tag, path=path, unreadable=reader.problem, **identity)
    trial_claims = counts.pop("recorded")
    return RunDirFacts(
        run_tag=run_tag,
        path=path,
        **identity,
        recorded=_job_claims(meta, config or JobConfigFacts()) + trial_claims,
        has_config=config is not None,
        has_result=result is not None,
        n_total=result.n_total if result else None,
        started_at=result.started_at if result else None,
        finished_at=result.finished_at if result else None,
        fires=meta.resume_count + 1 if meta.resume_count is not None else int(config is not None),
        no_resume=scan.no_resume,
        api_base=_api_base(scan.trial_config),
        **counts,
    )


def _api_base(content: Content | None) -> str | None:
    """The first trial's endpoint; None when its config.json is absent or cannot be read.

    Not fatal, unlike the files the counts come from: it only feeds the pinggy wiring check (a hint that holds
    no count or score), which says nothing when it is None; and Harbor writes it as the trial starts, so a pass
    can catch it half-written. Failing the whole dir closed over it would make a cell Unknown for nothing.
    """
    if not isinstance(content, bytes):
        return None
    try:
        return trial_api_base(content)
    except FormatError:
        return None


def _job_claims(meta: MetaFacts, config: JobConfigFacts) -> tuple[Recorded, ...]:
    """What config.json (what Harbor ran) and meta.env (what the job script was told) each say, neither standing in
    for the other: two that disagree are both the gate's to see."""
    return (*_claims(config._asdict(), "config.json"), *_claims(meta._asdict(), "meta.env"))


CLAIMED: dict[str, RecordedWhat] = {"model": "model", "dataset": "dataset", "benchmark_name": "benchmark",
                                    "agent": "agent", "timeout_multiplier": "timeout multiplier",
                                    "n_attempts": "attempts", "task_subset": "tasks"}


def _claims(said: dict[str, Any], source: Literal["config.json", "meta.env"]) -> Iterator[Recorded]:
    for field, what in CLAIMED.items():
        if (value := said.get(field)) is not None:
            yield Recorded(what=what, value=str(value), source=source)


def _identity(meta: MetaFacts, config: JobConfigFacts) -> dict[str, Any]:
    """Which model/benchmark/agent/multiplier the dir is for, to match it to a cell and show it: meta.env wins for
    model and dataset (what each file says on its own is `_job_claims`, which the gate checks)."""
    dataset = meta.dataset or config.dataset
    return {
        "model": meta.model or config.model,
        "dataset": dataset,
        "benchmark_name": meta.benchmark_name or (dataset_basename(dataset) if dataset else None),
        "agent": config.agent or meta.agent,
        "timeout_multiplier": config.timeout_multiplier if config.timeout_multiplier is not None
        else meta.timeout_multiplier,
    }
