"""Values that cross module boundaries: identities, desired cells and observed facts.

Everything here is a frozen pydantic model so the planner can stay a pure function of data: adapters
produce these, the planner consumes them. The words a plan is written in are in `vocabulary.py`.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from datetime import datetime, timedelta
from enum import StrEnum
from functools import cached_property
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_serializer, model_validator


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


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
        the key is the one of every earlier version."""
        parts = [self.model, self.dataset, self.fingerprint]
        if self.evalrun.namespace:
            parts.insert(0, f"{NAMESPACE_MARK}{self.evalrun.namespace}")
        return "|".join(part.replace("\\", "\\\\").replace("|", "\\|") for part in parts)

    @cached_property
    def former_key(self) -> str | None:
        """What versions before 0.3 stored this cell under (no namespace, no escaping), when that differs: its
        submissions and memory from then are still its own (read for this EvalRun only)."""
        former = f"{self.model}|{self.dataset}|{self.fingerprint}"
        return former if former != self.key else None

    @cached_property
    def label(self) -> str:
        """How people (and pass outcomes) name the cell."""
        return f"{self.model} × {self.benchmark}"

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
    return _RESUBMISSION.sub("", job_name)


_SLUG_MAX = 64  # per part: the digest carries identity, the slugs only help humans; the tag stays a file name


def key_digest(key: str) -> str:
    """48 bits of the cell key's SHA-256: no collision in practice among a lab's few thousand cells."""
    return hashlib.sha256(key.encode()).hexdigest()[:12]


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text.replace("/", "__")).strip("_")


# --------------------------------------------------------------------------- observed state


class RowStatus(StrEnum):
    PENDING = "Pending"
    STARTED = "Started"
    FINISHED = "Finished"


class Metric(Frozen):
    name: str
    value: float | None


class ObservedRow(Frozen):
    """A `sandbox_jobs` row that belongs to a cell (family + config match already decided)."""

    id: str
    job_name: str | None = None
    username: str | None = None
    job_status: str | None = None
    created_at: datetime | None = None
    submitted_at: datetime | None = None
    started_at: datetime | None = None
    ended_at: datetime | None = None
    slurm_job_id: str | None = None
    metrics: tuple[Metric, ...] | None = None
    is_overlong: bool | None = Field(None, description="flagged as having run past upload.overlongHours")

    @property
    def has_metrics(self) -> bool:
        return bool(self.metrics)


class ErrorKind(StrEnum):
    """How a trial's exception counts (RULES §3): infra is not the model's fault, benign is a valid 0."""

    INFRA = "infra"
    BENIGN = "benign"


class JobState(StrEnum):
    """The scheduler's view of one job, normalised across local and SLURM backends."""

    QUEUED = "Queued"
    RUNNING = "Running"
    COMPLETED = "Completed"
    FAILED = "Failed"
    TIMEOUT = "Timeout"
    CANCELLED = "Cancelled"
    NODE_FAIL = "NodeFail"
    PREEMPTED = "Preempted"
    OUT_OF_MEMORY = "OutOfMemory"
    LOST = "Lost"  # the scheduler lost track of it (e.g. the local runner died without an exit code)

    @property
    def active(self) -> bool:
        return self in (JobState.QUEUED, JobState.RUNNING)


class ObservedJob(Frozen):
    job_id: str
    name: str
    state: JobState
    submitted_at: datetime | None = None
    started_at: datetime | None = None
    ended_at: datetime | None = None
    time_left_s: int | None = None
    exit_code: int | None = None
    reason: str = ""
    nodes: str = Field("", description="where it ran (SLURM NodeList), when the scheduler says")
    log_tail: str = Field("", description="the last lines of a failed job's output, masked: what diagnoses it")
    gpu_hours: float | None = Field(None, description="elapsed × allocated GPUs, so far while it runs (sacct "
                                                      "ElapsedRaw × AllocTRES gres/gpu; local: wall × gpusPerJob); "
                                                      "None: the scheduler does not say (yet)")


class QuietFailure(Frozen):
    """A trial that raised without producing one output token; its agent time tells an instant failure."""

    exception_type: str | None = Field(description="None: a graded trial without an exception whose agent reported "
                                                   "0 output tokens (the verifier graded an untouched workspace)")
    kind: ErrorKind | None = Field(description="how its class counted in the run dir's tallies; None: graded")
    agent_seconds: float | None = Field(description="agent_execution finished - started; None: never ran")
    reward: float | None = None
    answered: bool = Field(False, description="the model answered at least one request (input tokens reported)")
    task: str = Field("", description="its task, whose tally it is counted in")


class RunDirFacts(Frozen):
    """What one Harbor job directory says, reduced to the numbers the rules need."""

    run_tag: str
    path: str
    model: str | None = Field(None, description="from config.json agents[0].model_name or meta.env MODEL")
    dataset: str | None = None
    benchmark_name: str | None = None
    agent: str | None = None
    timeout_multiplier: float | None = None
    has_config: bool = False
    has_result: bool = False
    n_total: int | None = Field(None, description="expected trials; None when nothing says")
    n_trial_dirs: int = 0
    n_completed: int = Field(0, description="trials with a result.json")
    n_scored: int = Field(0, description="trials with a reward")
    n_infra_errors: int = Field(0, description="trials that are no measurement of the model: an exception not the "
                                               "model's (known or unknown), ungraded, or without model output")
    n_benign_errors: int = Field(0, description="trials that raised the model's own failure (a valid 0)")
    n_graded: int = Field(0, description="trials without an exception with a usable reward")
    n_invalid: int = Field(0, description="trials whose reward is out of [0, 1], not a number, or under another key")
    invalid: str = Field("", description="'<trial>/result.json: why' of the first invalid reward")
    n_fractional: int = Field(0, description="trials whose reward is strictly between 0 and 1 (partial credit)")
    fractional: str = Field("", description="'<trial>/result.json: reward' of the first fractional reward")
    n_answered: int = Field(0, description="trials whose agent reported output tokens (> 0): the model answered")
    n_usage_reported: int = Field(0, description="trials whose agent reported its output tokens at all (0 included)")
    error_breakdown: dict[str, int] = Field(default_factory=dict)
    reward_sum: float = Field(0.0, description="over the scored trials: graded, and the model's failures")
    tasks: dict[str, tuple[int, int, float]] = Field(
        default_factory=dict, description="task → (completed trials, scored trials, their reward sum): coverage "
                                          "of (task, attempt) pairs and the task-clustered standard error")
    started_at: datetime | None = None
    finished_at: datetime | None = None
    last_progress_at: datetime | None = Field(None, description="newest trial result written")
    fires: int = Field(0, description="jobs that ran on this dir, from meta.env RESUME_COUNT (+1)")
    no_resume: bool = False
    quiet_failures: tuple[QuietFailure, ...] = Field((), description="errored trials without an output token, and "
                                                                    "graded ones whose agent reported 0 of them")
    n_instant_failures: int = Field(0, description="of those, the instant failures (the EvalRun's health policy)")
    n_started_trials: int = Field(0, description="trials with a result or with agent/ content: the launch works")
    api_base: str | None = Field(None, description="the LLM endpoint the first trial's config.json names")
    unreadable: str = Field("", description="'<path>: <error>' of the first file that could not be read; "
                                            "non-empty makes the cell Unknown (its numbers are not data)")


class Submission(Frozen):
    """The reconciler's own record of one job it launched or is about to launch (the intent)."""

    name: str
    run_tag: str
    evalrun: EvalRunRef
    cell_key: str
    attempt: int
    fire: int
    row_id: str | None = None
    job_id: str | None = None
    created_at: datetime
    model: str | None = Field(None, description="the cell's model and benchmark name: what GPU-hour history is "
                                                "grouped by (None in records before 0.4)")
    benchmark: str | None = None
    gpu_hours: float | None = Field(None, description="its job's actual GPU-hours, recorded once the job ended")

    def may_have_launched(self, job: ObservedJob) -> bool:
        """Could `job`, found by this submission's name, be the one it launched (the crash repair)?

        A live job always could (adopting it is what prevents a duplicate). An ended job submitted before
        this intent existed is from an earlier life of the name (a deleted store, another reconciler):
        adopting it would stand for a job that never ran for this intent.
        """
        return job.state.active or job.submitted_at is None or job.submitted_at >= self.created_at - CLOCK_SKEW


CLOCK_SKEW = timedelta(minutes=1)  # tolerated between this host's clock and the scheduler's (NTP keeps them closer)


class TunnelLease(Frozen):
    """A pinggy pair handed to one submission (its job), recorded in the store so no two jobs share it."""

    pair: str
    holder: str = Field(description="submission name of the job that uses the pair")
    evalrun: EvalRunRef
    leased_at: datetime


class CellOwner(Frozen):
    """Which EvalRun acts for a cell. One cell, one job, whatever EvalRuns name it: the others only watch."""

    cell_key: str
    evalrun: EvalRunRef
    renewed_at: datetime


class RemedyKind(StrEnum):
    """What a known failure calls for (RULES §9): a new attempt, one elsewhere, fewer launches, or a human."""

    REFIRE = "refire"
    REFIRE_ELSEWHERE = "refire-elsewhere"
    BACK_OFF = "back-off"
    HOLD = "hold"


class RemedyCause(StrEnum):
    """Which health rule diagnosed the attempt (RULES §8, §9)."""

    DEAD_LAUNCH = "dead-launch"
    LAUNCH_STALLED = "launch-stalled"
    PINGGY_NOT_WIRED = "pinggy-not-wired"
    PINGGY_LOCKED = "pinggy-locked"
    KNOWN_FAILURE = "known-failure"


class FailureStage(StrEnum):
    START = "start"  # the job ended (FAILED) before it did any work: its log tail says why
    RUNNING = "running"  # a running job's new output


class FailureMode(Frozen):
    """One entry of the failure catalog (`catalog/failures.yaml`, an EvalCluster's `failureCatalog`)."""

    name: str
    patterns: tuple[str, ...] = Field(description="regular expressions; any one matching a line is this failure")
    when: FailureStage
    remedy: RemedyKind
    advice: str
    job_env: dict[str, str] = Field(default_factory=dict, description="added to the refire's environment")
    backoff_minutes: int = Field(15, description="back-off: how long the cluster launches nothing")


class QuarantineKind(StrEnum):
    NODE = "node"  # failed a job in a way that blames the node: excluded from the cluster's submissions
    PAIR = "pinggy-pair"  # its token is locked on the pinggy server: handed to no job
    CLUSTER = "cluster"  # launching backs off (load shedding, rate limits): its submission budget is 0


class Quarantined(Frozen):
    """Something not to use until `until` (the store's clock): a node, a pinggy pair, a cluster's launches."""

    kind: QuarantineKind
    scope: str = Field(description="where the name means something: the cluster (nodes, back-off), the EvalRun (pairs)")
    name: str
    reason: str
    until: datetime
    since: datetime | None = Field(None, description="when it began (None: recorded before versions kept it)")
    owner: str = Field("", description="the EvalRun whose pass decided it ('' when not recorded)")


class JobOutput(Frozen):
    """What a running job printed since `offset` (bytes), read a bounded amount at a time."""

    job_id: str
    offset: int
    end: int = Field(description="the offset after this read: where the next one starts")
    text: str = Field(description="decoded (bad bytes replaced) and masked with the cluster's secrets")


class Remedy(Frozen):
    """What the health rules decided for a run that failed or was cancelled, kept until it is carried out."""

    run_tag: str = Field(description="the attempt it is about")
    kind: RemedyKind
    diagnosis: str = Field(description="what was wrong and what to do, for status, explain and Events")
    at: datetime
    node: str | None = Field(None, description="refire-elsewhere: where it failed")
    job_env: dict[str, str] = Field(default_factory=dict)
    backoff_minutes: int = 15
    cause: RemedyCause


class OutputReading(Frozen):
    """What a running job's output has said so far, read incrementally (`offset` bytes of it)."""

    job_id: str
    offset: int = 0
    read_at: datetime
    requests: int = Field(0, description="`POST /v1/(chat/)completions` lines (vLLM's access log)")
    bad_requests: int = Field(0, description="of those, answered 400")
    requests_per_minute: float | None = Field(None, description="over the last reading interval")
    ready_at: datetime | None = Field(None, description="the pass that first saw the vLLM server ready")
    last_request_at: datetime | None = Field(None, description="the last pass that saw a new request")
    pinggy: str | None = Field(None, description="'live' (authenticated) or 'locked' (token already active)")
    failure: str | None = Field(None, description="a catalogued running failure matched in it")
    failure_at: datetime | None = Field(None, description="the pass that last read a new line matching `failure`: "
                                                          "a back-off runs from it, once per match")


class StallReading(Frozen):
    """The first stuck-general reading of a run: escalated only if a later one finds the same score count."""

    run_tag: str
    scored: int
    at: datetime


class AdmissionRecord(Frozen):
    """What the admission gate admitted for an upload that read back as written: what status and explain show of
    a Completed cell (RULES §14)."""

    run_tag: str
    score: float
    n_scored: int
    provisional: bool
    partial: bool = False
    evidence: str = Field(description="the gate's evidence in words: trials by class, expected vs seen, traffic")


class CellMemory(BaseModel):
    """What the rules remember about a cell between passes (kept in the controller state, per cell key).

    The planner says what it becomes (`CellPlan.remember`); the actor records what its actions learnt.
    Stored as JSON without its empty fields; keys it does not know (a newer version's) are ignored.
    """

    model_config = ConfigDict(frozen=True, extra="ignore")

    analyzed_run_tag: str | None = Field(None, description="the run tag whose post-eval report was last written")
    db_verified: str | None = Field(None, description="the last results-DB upload that read back as written")
    tracked_run_tag: str | None = Field(None, description="the run tag whose MLflow run read back as logged")
    track_error: str | None = Field(None, description="why the last MLflow upload did not read back")
    upload_as_is: str | None = Field(None, description="a run tag the monitor cancelled: upload it as is, never resume")
    stall_reading: StallReading | None = None
    remedies: tuple[Remedy, ...] = Field((), description="one per failed attempt the health rules diagnosed")
    output: OutputReading | None = Field(None, description="the running job's output, read so far")
    admitted: AdmissionRecord | None = Field(None, description="the last upload the admission gate admitted")

    def stored(self) -> dict[str, Any]:
        """The JSON the controller state keeps (the key names of every earlier version)."""
        return self.model_dump(mode="json", exclude_none=True)

    @classmethod
    def from_stored(cls, data: object) -> CellMemory:
        """Field by field: a value that does not decode is no reading (as an unknown key is), not a failed pass."""
        if not isinstance(data, dict):
            return cls()
        kept = {}
        for name, value in data.items():
            if name in cls.model_fields:
                try:
                    cls.model_validate({name: value})
                except ValidationError:
                    continue
                kept[name] = value
        return cls.model_validate(kept)


class Observation(Frozen):
    """Everything observed about one cell in one pass. `None` means the source could not be read."""

    rows: tuple[ObservedRow, ...] | None
    submissions: tuple[Submission, ...] | None
    jobs: tuple[ObservedJob, ...] | None
    run_dirs: tuple[RunDirFacts, ...] | None
    unknown_reason: str = ""
    memory: CellMemory = Field(CellMemory(), description="what earlier passes remembered for this cell")
    outputs: tuple[JobOutput, ...] | None = Field((), description="new output of its running jobs (None: unread)")
    model_names: frozenset[str] = Field(frozenset(), description="the DB's names of the cell's model (its family)")
    benchmark_names: frozenset[str] = Field(frozenset(), description="the DB's names of the cell's benchmark")
