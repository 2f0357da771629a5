"""Join the three observed sources to cells: which rows, jobs and run dirs belong to which cell.

Pure and batched: every index is built once per pass, so matching 1,000 cells costs one walk of
each source. Rules (RULES §1, §3):
- a row belongs to a cell through the model's and the benchmark's families and a matching config;
- a run dir belongs to a cell by its run tag (ours) or, for dirs the old listener made, by the
  model/benchmark/agent/multiplier its config.json and meta.env name;
- a job belongs to a cell through the run tag its name carries.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from controller.core.identity import same_multiplier
from controller.core.observed import JobState, Observation, ObservedJob, RunDirFacts, Submission
from controller.core.records import NamedRow, SandboxJobRow, StoreSnapshot
from controller.core.remedies import CellMemory
from controller.core.retry import RetryRequest
from controller.core.types import RUN_TAG_PREFIX, Cell, run_tag_of

OVERRIDE_KEYS = ("override_cpus", "override_memory_mb", "override_storage_mb")


class Families:
    """Name → ids (and names) of the whole family: canonical row plus every row that duplicates it."""

    def __init__(self, rows: Iterable[NamedRow]):
        rows = list(rows)
        canonical = {row.id: row.duplicate_of or row.id for row in rows}
        members: dict[str, set[str]] = defaultdict(set)
        for row in rows:
            members[canonical[row.id]].add(row.id)
        name_of = {row.id: row.name for row in rows}
        self._ids: dict[str, frozenset[str]] = {}
        self._names: dict[str, frozenset[str]] = {}
        for row in rows:
            family = members[canonical[row.id]] | {canonical[row.id]}
            self._ids[row.name] = self._ids.get(row.name, frozenset()) | family
        for name, ids in self._ids.items():
            self._names[name] = frozenset(name_of[i] for i in ids if i in name_of) | {name}

    def ids(self, name: str) -> frozenset[str]:
        return self._ids.get(name, frozenset())

    def names(self, name: str) -> frozenset[str]:
        return self._names.get(name, frozenset({name}))


def row_config_matches(config: dict[str, Any] | None, cell: Cell, n_rep_eval: int | None = None) -> bool:
    """Agent, timeout multiplier, attempts per task and sandbox overrides equal; keys a legacy row lacks match
    anything. A row of one attempt per task is no score of a cell of three (RULES §14 holds such a run dir too):
    our rows say it in their config, and those from before it did in `n_rep_eval` (a row of ours has a fingerprint;
    the old listener's `n_rep_eval` is not known to mean attempts, and is not read). A shard's row matches its shard
    alone; a shard sees the rows of its cell (the union's row settles it)."""
    if not config:
        return True
    if config.get("shard") is not None and config["shard"] != str(cell.shard):
        return False  # a shard's row (no score) is its shard's alone (RULES §17)
    agent = config.get("agent")
    if agent is not None and agent != cell.agent:
        return False
    attempts = config.get("n_attempts", n_rep_eval if "fingerprint" in config else None)
    if attempts is not None and attempts != cell.n_attempts:
        return False
    multiplier = config.get("timeout_multiplier")
    if multiplier is not None and _as_float(multiplier) != cell.timeout_multiplier:
        return False
    environment = config.get("environment") or {}
    return all(environment.get(key) == getattr(cell.overrides, key) for key in OVERRIDE_KEYS)


def run_dir_matches(facts: RunDirFacts, cell: Cell, model_names: frozenset[str], bench_names: frozenset[str]) -> bool:
    """A dir the old listener made: same model and benchmark family, and no conflicting config."""
    if facts.model not in model_names or facts.benchmark_name not in bench_names:
        return False
    if facts.agent is not None and facts.agent != cell.agent:
        return False
    return same_multiplier(facts.timeout_multiplier, cell)


def join_cells(
    cells: Sequence[Cell],
    snapshot: StoreSnapshot | None,
    jobs: Sequence[ObservedJob] | None,
    run_dirs: Sequence[RunDirFacts] | None,
    unknown_reason: str = "",
    jobs_dir_missing: str = "",
) -> list[Observation]:
    """One Observation per cell, in order. A source that is None stays None (Unknown) in every cell.

    `jobs_dir_missing` (the reason; `run_dirs` is then empty): a cell whose history says a run dir should
    exist cannot tell "no dir yet" from "dir on an unmounted filesystem", so its run dirs are Unknown; its
    `jobs_dir_missing` says so without the guess, for the rules that know a likelier cause (a failed job).
    """
    index = _Index.of(snapshot, jobs, run_dirs)
    return [_observe(cell, index, snapshot, jobs, run_dirs, unknown_reason, jobs_dir_missing) for cell in cells]


@dataclass(slots=True)
class _Index:
    """Every source by what joins it to a cell, built once per pass."""

    model_families: Families | None
    bench_families: Families | None
    rows_by_pair: dict[tuple[str | None, str | None], list[SandboxJobRow]]
    subs_by_cell: dict[str, list[Submission]]  # the cell's, whichever EvalRun made them
    jobs_by_tag: dict[str, list[ObservedJob]]
    tags_by_stem: dict[str, set[str]]
    dirs_by_tag: dict[str, RunDirFacts]
    legacy_dirs: dict[tuple[str | None, str | None], list[RunDirFacts]]
    retries_by_cell: dict[str, list[RetryRequest]]

    @classmethod
    def of(cls, snapshot: StoreSnapshot | None, jobs: Sequence[ObservedJob] | None,
           run_dirs: Sequence[RunDirFacts] | None) -> _Index:
        subs_by_cell: dict[str, list[Submission]] = defaultdict(list)
        for sub in snapshot.submissions if snapshot else ():
            subs_by_cell[sub.cell_key].append(sub)
        jobs_by_tag: dict[str, list[ObservedJob]] = defaultdict(list)
        for job in jobs or ():
            jobs_by_tag[run_tag_of(job.name)].append(job)
        dirs_by_tag = {d.run_tag: d for d in run_dirs or ()}
        tags_by_stem: dict[str, set[str]] = defaultdict(set)
        for tag in [*jobs_by_tag, *dirs_by_tag]:
            tags_by_stem[_stem(tag)].add(tag)
        legacy_dirs: dict[tuple[str | None, str | None], list[RunDirFacts]] = defaultdict(list)
        for facts in run_dirs or ():
            if not facts.run_tag.startswith(RUN_TAG_PREFIX):
                legacy_dirs[(facts.model, facts.benchmark_name)].append(facts)
        retries_by_cell: dict[str, list[RetryRequest]] = defaultdict(list)
        for request in snapshot.retries if snapshot else ():
            retries_by_cell[request.cell_key].append(request)
        return cls(Families(snapshot.models) if snapshot else None, Families(snapshot.benchmarks) if snapshot else None,
                   _rows_by_family_pair(snapshot) if snapshot else {}, subs_by_cell, jobs_by_tag, tags_by_stem,
                   dirs_by_tag, legacy_dirs, retries_by_cell)


def _observe(cell: Cell, index: _Index, snapshot: StoreSnapshot | None, jobs: Sequence[ObservedJob] | None,
             run_dirs: Sequence[RunDirFacts] | None, unknown_reason: str, jobs_dir_missing: str) -> Observation:
    models, benchmarks = index.model_families, index.bench_families
    subs = _cell_subs(cell, index.subs_by_cell) if snapshot else None
    rows = None
    if snapshot is not None:
        assert models is not None and benchmarks is not None
        rows = _cell_rows(cell, models, benchmarks, index.rows_by_pair)
    cell_dirs = None
    if run_dirs is not None:
        own_dirs = [index.dirs_by_tag[t] for t in index.tags_by_stem.get(cell.tag_stem, ()) if t in index.dirs_by_tag]
        cell_dirs = _cell_dirs(cell, own_dirs, subs or (), index.dirs_by_tag, index.legacy_dirs, models, benchmarks)
    cell_jobs = None if jobs is None else _cell_jobs(cell, subs or (), cell_dirs or (), index.tags_by_stem,
                                                     index.jobs_by_tag)
    reason, dir_missing = unknown_reason, ""
    if jobs_dir_missing and _expects_run_dirs(rows, subs, cell_jobs):
        cell_dirs, dir_missing = None, jobs_dir_missing
        reason = "; ".join(r for r in (unknown_reason, f"{jobs_dir_missing} (unmounted filesystem?)") if r)
    memory = snapshot.cell_memory.get(cell.key) or snapshot.cell_memory.get(cell.former_key or "") \
        if snapshot else None
    return Observation(
        rows=rows, submissions=subs, jobs=cell_jobs, run_dirs=cell_dirs, unknown_reason=reason,
        jobs_dir_missing=dir_missing, memory=memory or CellMemory(),
        model_names=models.names(cell.model) if models else frozenset(),
        benchmark_names=benchmarks.names(cell.benchmark_name) if benchmarks else frozenset(),
        retries=tuple(index.retries_by_cell.get(cell.key, ())))


def _cell_jobs(cell: Cell, subs: Sequence[Submission], dirs: Sequence[RunDirFacts], tags_by_stem: dict[str, set[str]],
               jobs_by_tag: dict[str, list[ObservedJob]]) -> tuple[ObservedJob, ...]:
    """The jobs of the cell's run tags: its submissions', its run dirs' and its stem's (the old listener's tags
    with our prefix too, as resumes of its run dirs are named)."""
    tags = {s.run_tag for s in subs} | {d.run_tag for d in dirs} | tags_by_stem.get(cell.tag_stem, set())
    tags |= {RUN_TAG_PREFIX + t for t in tags if not t.startswith(RUN_TAG_PREFIX)}
    return tuple(job for tag in sorted(tags) for job in jobs_by_tag.get(tag, ()))


def _cell_subs(cell: Cell, subs_by_cell: dict[str, list[Submission]]) -> tuple[Submission, ...]:
    """The cell's submissions, whichever EvalRun made them, and those its own EvalRun made under its former key
    (before keys were scoped by namespace): never another tenant's."""
    former = [s for s in subs_by_cell.get(cell.former_key or "", ()) if cell.evalrun.known_as(s.evalrun)]
    return (*subs_by_cell.get(cell.key, ()), *former)


def _expects_run_dirs(rows: Sequence[SandboxJobRow] | None, subs: Sequence[Submission] | None,
                      jobs: Sequence[ObservedJob] | None) -> bool:
    """Evidence that a job ran for the cell: one is running or has started, or a row says Started (or Finished
    without metrics, or Pending with a job id whose job is out of sight). A queued job, a bare intent (a crash
    before sbatch) or a scored row needs no run dir to be judged."""
    if rows is None or subs is None or jobs is None:
        return True
    if any(job.state == JobState.RUNNING or job.started_at is not None for job in jobs):
        return True
    return any(row.job_status == "Started" or (row.job_status == "Finished" and not row.has_metrics)
               or (row.job_status == "Pending" and not jobs and row.slurm_job_id not in (None, "", "pending"))
               for row in rows)


def _rows_by_family_pair(snapshot: StoreSnapshot) -> dict[tuple[str | None, str | None], list[SandboxJobRow]]:
    pairs: dict[tuple[str | None, str | None], list[SandboxJobRow]] = defaultdict(list)
    for row in snapshot.rows:
        pairs[(row.model_id, row.benchmark_id)].append(row)
    return pairs


def _cell_rows(
    cell: Cell,
    models: Families,
    benchmarks: Families,
    rows_by_pair: dict[tuple[str | None, str | None], list[SandboxJobRow]],
) -> tuple[SandboxJobRow, ...]:
    model_ids = models.ids(cell.model)
    bench_ids = benchmarks.ids(cell.benchmark_name)
    matched = [
        row
        for model_id in model_ids
        for bench_id in bench_ids
        for row in rows_by_pair.get((model_id, bench_id), ())
        if row_config_matches(row.config, cell, row.n_rep_eval)
    ]
    return tuple(matched)


def _cell_dirs(
    cell: Cell,
    own_dirs: Sequence[RunDirFacts],
    subs: Sequence[Submission],
    dirs_by_tag: dict[str, RunDirFacts],
    legacy_dirs: dict[tuple[str | None, str | None], list[RunDirFacts]],
    models: Families | None,
    benchmarks: Families | None,
) -> tuple[RunDirFacts, ...]:
    found = {d.run_tag: d for d in own_dirs}
    for sub in subs:
        if sub.run_tag in dirs_by_tag:
            found[sub.run_tag] = dirs_by_tag[sub.run_tag]
    if cell.shard is not None:  # the old listener ran whole datasets: no dir of its is a shard's
        return tuple(found.values())
    model_names = models.names(cell.model) if models else frozenset({cell.model})
    bench_names = benchmarks.names(cell.benchmark_name) if benchmarks else frozenset({cell.benchmark_name})
    for model in model_names:
        for bench in bench_names:
            for facts in legacy_dirs.get((model, bench), ()):
                if run_dir_matches(facts, cell, model_names, bench_names):
                    found[facts.run_tag] = facts
    return tuple(found.values())


def _stem(tag: str) -> str:
    """`ev_model__bench__fp__a3` → `ev_model__bench__fp__a`; other tags stay as they are."""
    return tag.rstrip("0123456789") if tag.startswith(RUN_TAG_PREFIX) else tag


def _as_float(value: object) -> float | None:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
