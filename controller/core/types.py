"""Values that cross module boundaries: identities and the desired cells (observed facts: `observed.py`; what
the rules remember and the remedies they start: `remedies.py`).

Everything here is a frozen pydantic model so the planner can stay a pure function of data: adapters
produce these, the planner consumes them. The words a plan is written in are in `vocabulary.py`.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from enum import StrEnum
from functools import cached_property
from typing import Any, Self, final

from pydantic import BaseModel, ConfigDict, Field, model_serializer, model_validator


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class NotedStrEnum(StrEnum):
    """A str enum whose members carry a note beside their value: `Member = "value", "note"`."""

    note: str

    def __new__(cls, value: str, note: str) -> Self:
        member = str.__new__(cls, value)
        member._value_ = value
        member.note = note
        return member


# --------------------------------------------------------------------------- identities


class ObjectRef(Frozen):
    """A resource as Kubernetes names it: `namespace/name`, or `name` for a spec file without a namespace.

    Stored and shown as that one string (it round-trips: a Kubernetes name cannot hold '/'), so the store,
    status, events and logs never know one object by two names.
    """

    namespace: str | None = None
    name: str

    @model_validator(mode="before")
    @classmethod
    def _from_text(cls, value: object) -> object:
        if isinstance(value, str):
            namespace, slash, name = value.partition("/")
            return {"namespace": namespace, "name": name} if slash else {"name": value}
        return value

    @model_serializer
    def _as_text(self) -> str:
        return str(self)

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}" if self.namespace else self.name

    @classmethod
    def parse(cls, text: str) -> Self:
        return cls.model_validate(text)


class EvalRunRef(ObjectRef):
    """One EvalRun, in cells, submissions, leases, claims, plans, status and events."""

    def known_as(self, stored: EvalRunRef) -> bool:
        """Is `stored` this EvalRun? Also its bare name, which versions before 0.2 wrote for a namespaced one."""
        return stored == self or (self.namespace is not None and stored == EvalRunRef(name=self.name))


class ClusterRef(ObjectRef):
    """One EvalCluster (an EvalRun's `spec.cluster` names one in the EvalRun's own namespace), or a cluster-scoped
    ClusterEvalCluster of the operator's admin."""

    cluster_scoped: bool = False

    def __str__(self) -> str:
        return f"ClusterEvalCluster/{self.name}" if self.cluster_scoped else super().__str__()


# --------------------------------------------------------------------------- desired state


class EnvironmentOverrides(Frozen):
    """Sandbox size overrides; part of a row's `config.environment` and of the fingerprint."""

    override_cpus: int | None = None
    override_memory_mb: int | None = None
    override_storage_mb: int | None = None


class Serving(Frozen):
    """How vLLM serves a cell's model for its harness's serving pattern (RULES §10): the registry entry's
    settings for every pattern, then the pattern's own. Unset = the job script's default (no flag)."""

    pattern: str | None = Field(None, description="the harness's serving pattern (harnesses.yaml)")
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    chat_template: str | None = None
    extra_args: str | None = Field(None, description="more vLLM flags, shell-quoted (the job splits them as xargs)")
    trust_remote_code: bool = False
    swap_space: int | None = Field(None, description="GiB of CPU swap per GPU (--swap-space)")
    enforce_eager: bool = False
    max_retries: int | None = Field(None, description="health checks the job makes before it gives up on vLLM")

    def fingerprinted(self) -> dict[str, str]:
        """The settings that change what the agent sees (a parser on terminus-2 is a silent 0%), set ones only:
        a cell without them keeps the identity it had before serving was resolved."""
        chosen = {"tool_call_parser": self.tool_call_parser, "reasoning_parser": self.reasoning_parser,
                  "chat_template": self.chat_template}
        return {name: value for name, value in chosen.items() if value is not None}


class Shard(Frozen):
    """One of the `count` disjoint task subsets a sharded cell runs as (RULES §17): the job contract's EVAL_SHARD
    `index/count` runs every count-th task dir of the dataset, in byte order, from the index-th (0-based)."""

    index: int = Field(ge=0)
    count: int = Field(ge=2)
    parent: str = Field(description="the key of the cell it is a shard of: the one that uploads their union")

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def tasks(self, total: int) -> int:
        """Its share of `total` tasks."""
        return len(range(self.index, total, self.count))


@final  # never subclassed: the planner tests a decision's class exactly (planner.fleet.launch_of)
class Cell(Frozen):
    """One (model, benchmark) of an EvalRun with every parameter resolved. Its identities are computed once (a pass
    over 10,000 cells asked for keys 110,000 times)."""

    evalrun: EvalRunRef
    cluster: str = Field(description="the EvalCluster's name, as the results DB's `config.env` records it")
    model: str
    benchmark: str = Field(description="what the user wrote: a preset name or a dataset")
    dataset: str = Field(description="dataset repo or path, e.g. DCAgent2/terminal_bench_2")
    benchmark_name: str = Field(description="`benchmarks.name`: the dataset after its last '/'")
    agent: str
    n_concurrent: int
    n_attempts: int = 1
    harbor_config: str
    timeout_multiplier: float
    overrides: EnvironmentOverrides = EnvironmentOverrides()
    agent_kwargs: tuple[str, ...] = ()
    conda_env: str | None = None
    tensor_parallel_size: int | None = None
    data_parallel_size: int | None = None
    max_model_len: int | None = None
    max_output_tokens: int | None = None
    serving: Serving = Serving()
    config_yaml: str | None = Field(None, description="EVAL_CONFIG_YAML: the harness's scaffold config, else the "
                                                      "preset's (a bare file name the job script looks up)")
    time_limit: str = Field(description="walltime of its jobs, decided once by resolve: the preset's (at most the "
                                        "cluster's maxTimeLimit), else the cluster's timeLimit")
    walltime_auto: bool = Field(False, description="its preset asks for `walltime: auto`: its jobs are sized "
                                                   "whatever the EvalRun's walltime (RULES §16)")
    needs_pinggy: bool = False
    calls_model: bool = Field(True, description="its agent calls a model (not Harbor's oracle or nop): a trial that "
                                                "raised without a token may be an instant failure")
    reports_tokens: bool = Field(True, description="its harness reports token usage per trial; one that never does "
                                                   "is judged by the requests its job's vLLM logged")
    tasks: int | None = Field(None, description="tasks in its benchmark (the preset's, or spec.tasks): expected "
                                                "trials = tasks × n_attempts; None: only Harbor's total says")
    partial_credit: bool | None = Field(None, description="rewards strictly between 0 and 1 are valid (the preset "
                                                          "says so); False: only 0 or 1; None: not known, not checked")
    fingerprint: str = Field(description="hash of what changes results (agent, config, multiplier, overrides, kwargs)")
    shards: int = Field(1, description="K > 1: the cell runs as K shard cells (its own jobs: none) and uploads the "
                                       "union of their run dirs (RULES §17)")
    shard: Shard | None = Field(None, description="set on a shard cell: which of its cell's task subsets it runs")
    may_shard: bool = Field(False, description="walltime auto, no shards set, its tasks counted, one cluster: its "
                                               "estimate may choose its shards, once (RULES §17)")

    def sharded(self) -> tuple[Cell, ...]:
        """A cell of `shards` > 1: its shard cells, each its own identity (key, run tags, claims), walltime sized
        by its share of the tasks."""
        assert self.tasks is not None, "resolve shards only a benchmark whose tasks the catalog counts"
        return tuple(self.model_copy(update={
            "shards": 1, "may_shard": False, "shard": (shard := Shard(index=index, count=self.shards, parent=self.key)),
            "tasks": shard.tasks(self.tasks), "fingerprint": f"{self.fingerprint}+shard{index}of{self.shards}"})
            for index in range(self.shards))

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """A copy whose identities are computed afresh: pydantic copies the cached ones, which an update may change."""
        copy = super().model_copy(update=update, deep=deep)
        for name in ("key", "former_key", "label", "tag_stem", "tag_stems"):
            copy.__dict__.pop(name, None)
        return copy

    @cached_property
    def key(self) -> str:
        """Identity of the cell across passes and processes (RULES §12: model, dataset, fingerprint), scoped by the
        EvalRun's namespace: tenants never share a cell (its claim, run tags, jobs). Injective: a `|` or `\\` in
        a part is escaped, so parts never run into each other; for names without them, and without a namespace,
        the key is the one of every earlier version. A sharded cell's names its K (RULES §17): another K is another
        run of the benchmark (its unions, rows and memory its own), as another nAttempts is."""
        parts = [self.model, self.dataset, self.fingerprint + (f"+shards{self.shards}" if self.shards > 1 else "")]
        if self.evalrun.namespace:
            parts.insert(0, f"{NAMESPACE_MARK}{self.evalrun.namespace}")
        return "|".join(part.replace("\\", "\\\\").replace("|", "\\|") for part in parts)

    @cached_property
    def former_key(self) -> str | None:
        """An earlier identity of this cell whose submissions, jobs, run dirs and memory are still its own (read for
        this EvalRun only): for a sharded cell, its unsharded key (a run from before it was sharded is watched to its
        end, and uploaded if it completes: RULES §17); else what versions before 0.3 stored it under (no namespace,
        no escaping), when that differs."""
        if self.shards > 1:
            return self.model_copy(update={"shards": 1}).key
        former = f"{self.model}|{self.dataset}|{self.fingerprint}"
        return former if former != self.key else None

    @property
    def trials(self) -> int | None:
        """Trials one attempt runs (the catalog's tasks × nAttempts); None: the task count is not known."""
        return None if self.tasks is None else self.tasks * self.n_attempts

    @cached_property
    def label(self) -> str:
        """How people (and pass outcomes) name the cell."""
        shard = f" (shard {self.shard.index + 1}/{self.shard.count})" if self.shard is not None else ""
        return f"{self.model} × {self.benchmark}{shard}"

    @cached_property
    def tag_stem(self) -> str:
        """Readable slugs of model and benchmark, then a digest of the FULL key, so the tag is injective.

        Slugs drop what a file name cannot hold (`OrgA/x` and `OrgB/x` share the benchmark name; `/ckpts/r1`
        and `ckpts/r1` share a slug): the digest keeps such cells apart, so they never adopt each other's jobs.
        """
        return self._stem(self.key)

    @cached_property
    def tag_stems(self) -> tuple[str, ...]:
        """Every stem this cell's run dirs may carry: its own, and its former key's (submissions before 0.3)."""
        return (self.tag_stem,) + ((self._stem(self.former_key),) if self.former_key else ())

    def _stem(self, key: str) -> str:
        readable = f"{_slug(self.model)[:_SLUG_MAX]}__{_slug(self.benchmark_name)[:_SLUG_MAX]}"
        return f"{RUN_TAG_PREFIX}{readable}__{key_digest(key)}__a"

    def run_tag(self, attempt: int) -> str:
        """Deterministic Harbor run tag = SLURM job name = `sandbox_jobs.job_name` of a fresh attempt."""
        return f"{self.tag_stem}{attempt}"

    def attempt_of(self, run_tag: str) -> int | None:
        """The attempt number if `run_tag` is one of this cell's own tags, else None."""
        rest = run_tag.removeprefix(self.tag_stem)
        return int(rest) if rest != run_tag and rest.isdigit() else None


def walltime_seconds(text: str) -> int:
    """SLURM walltime syntax → seconds: `MM`, `HH:MM:SS`, `D-HH:MM:SS`."""
    days = 0
    if "-" in text:
        day_text, text = text.split("-", 1)
        days = int(day_text)
    parts = [int(p) for p in text.split(":")]
    if len(parts) == 1:
        seconds = parts[0] * 60
    else:
        while len(parts) < 3:
            parts.insert(0, 0)
        seconds = parts[0] * 3600 + parts[1] * 60 + parts[2]
    return days * 86400 + seconds


RUN_TAG_PREFIX = "ev_"
NAMESPACE_MARK = "ns:"  # the first part of a namespaced cell's key


def submission_name(run_tag: str, fire: int) -> str:
    """Scheduler job name of the `fire`-th job on a run dir: the run tag itself, then `-r<n>` for resumes.

    Resumes of run dirs the old listener made get our prefix too, so queue filters still find them.
    """
    if fire <= 1:
        return run_tag
    name = f"{run_tag}-r{fire - 1}"
    return name if name.startswith(RUN_TAG_PREFIX) else RUN_TAG_PREFIX + name


def stem_of(run_tag: str) -> str | None:
    """The cell stem of one of our run tags (`ev_…__<digest>__a<attempt>`); None for any other name."""
    stem, mark, attempt = run_tag.rpartition("__a")
    return f"{stem}{mark}" if run_tag.startswith(RUN_TAG_PREFIX) and mark and attempt.isdigit() else None


_RESUBMISSION = re.compile(r"-r\d+$")


def run_tag_of(job_name: str) -> str:
    """Inverse of `submission_name` up to the legacy prefix: the run tag a job works on."""
    return _RESUBMISSION.sub("", job_name) if "-r" in job_name else job_name


_SLUG_MAX = 64  # per part: the digest carries identity, the slugs only help humans; the tag stays a file name


def key_digest(key: str) -> str:
    """48 bits of the cell key's SHA-256: no collision in practice among a lab's few thousand cells."""
    return hashlib.sha256(key.encode()).hexdigest()[:12]


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text.replace("/", "__")).strip("_")
