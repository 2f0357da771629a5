"""Observed state: rows of the results DB, jobs of the scheduler, run dirs on disk, the controller's own
submissions and leases — and `Observation`, one cell's view of all of them (frozen data, like `types.py`)."""

from __future__ import annotations

from datetime import datetime, timedelta
from enum import StrEnum
from typing import Literal

from pydantic import Field

from controller.core.remedies import (
    CellMemory,
)
from controller.core.retry import RetryRequest
from controller.core.types import (
    EvalRunRef,
    Frozen,
)


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
        return self in _ACTIVE


_ACTIVE = (JobState.QUEUED, JobState.RUNNING)  # once: a member looked up on its class costs more than the test


class ObservedJob(Frozen):
    job_id: str
    name: str
    state: JobState
    submitted_at: datetime | None = None
    started_at: datetime | None = None
    ended_at: datetime | None = None
    expected_start: datetime | None = Field(None, description="when a queued job is expected to start, as the "
                                                              "scheduler says (SLURM: its --begin or the backfill "
                                                              "estimate); None: it says nothing")
    time_left_s: int | None = None
    time_limit_s: int | None = Field(None, description="the walltime it asked for (SLURM --time), as the queue says")
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
                                                   "0 output tokens or never ran (the verifier graded an untouched "
                                                   "workspace)")
    kind: ErrorKind | None = Field(description="how its class counted in the run dir's tallies; None: graded")
    agent_seconds: float | None = Field(description="agent_execution finished - started; None: never ran")
    reward: float | None = None
    answered: bool = Field(False, description="the model answered at least one request (input tokens reported)")
    task: str = Field("", description="its task, whose tally it is counted in")


RecordedWhat = Literal["model", "dataset", "benchmark", "agent", "timeout multiplier", "attempts", "tasks"]


class Recorded(Frozen):
    """One thing a file of a run dir says about what ran (RULES §14 identity). Each job file, and the trials
    together, say it on their own: the gate compares every one with the cell, so files that disagree are all seen
    and none outvotes another."""

    what: RecordedWhat
    value: str = Field(description="as the file writes it (a number as Python prints it)")
    source: Literal["config.json", "meta.env", "trials"] = Field(description="trials: one or more trial results")


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
    error_breakdown: dict[str, int] = Field(default_factory=dict, description="completed trials by exception class "
                                                                          "(or the reconciler's own bucket), any kind")
    infra_error_breakdown: dict[str, int] = Field(
        default_factory=dict, description="the infra trials alone by class: a class name the model's failures share "
                                          "(an ungraded AgentTimeoutError) is counted here only for its infra trials")
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
    recorded: tuple[Recorded, ...] = Field((), description="what config.json, meta.env and the trial results each "
                                                           "say ran, distinct: the identity the gate checks")
    unreadable: str = Field("", description="'<path>: <error>' of the first file that could not be read; "
                                            "non-empty makes the cell Unknown (its numbers are not data)")
    shards: tuple[str, ...] = Field((), description="a sharded cell's union (RULES §17): the paths of the shard run "
                                                    "dirs it was made of, `path` the first")

    def shard_run_tags(self) -> tuple[str, ...]:
        """A union's shard run dirs by their run tags (a run dir is named by its tag)."""
        return tuple(path.rstrip("/").rsplit("/", 1)[-1] for path in self.shards)


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
    cluster: str | None = Field(None, description="the ClusterRef (as text) its job was submitted to: where the cell "
                                                  "is bound (None in records before several clusters per EvalRun)")
    estimated_hours: float | None = Field(None, description="walltime auto: how long its job was expected to run "
                                                            "(the p90 for its share, and its server start where the "
                                                            "estimate lacks it)")
    elapsed_hours: float | None = Field(None, description="how long its job ran, recorded once it ended: an "
                                                          "attempt's wall time, and what walltime auto learns from")
    trials: int | None = Field(None, description="the trials its attempt was to run, the catalog's tasks × nAttempts: "
                                                 "an estimate from attempts of another size is scaled to the cell's "
                                                 "(None: the task count is not known, or a record before 0011)")
    concurrency: int | None = Field(None, description="its attempt's nConcurrent (None: a record before 0011)")
    finished_at: datetime | None = Field(None, description="when its attempt finished (its report was written): "
                                                           "its jobs are history from then on")

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


class JobOutput(Frozen):
    """What a running job printed since `offset` (bytes), read a bounded amount at a time."""

    job_id: str
    offset: int
    end: int = Field(description="the offset after this read: where the next one starts")
    text: str = Field(description="decoded (bad bytes replaced) and masked with the cluster's secrets")


class Observation(Frozen):
    """Everything observed about one cell in one pass. `None` means the source could not be read."""

    rows: tuple[ObservedRow, ...] | None
    submissions: tuple[Submission, ...] | None
    jobs: tuple[ObservedJob, ...] | None
    run_dirs: tuple[RunDirFacts, ...] | None
    unknown_reason: str = ""
    jobs_dir_missing: str = Field("", description="why `run_dirs` is None when it is the cluster's jobs dir that does "
                                                  "not exist (the adapter's words, no guess at the cause)")
    memory: CellMemory = Field(CellMemory(), description="what earlier passes remembered for this cell")
    outputs: tuple[JobOutput, ...] | None = Field((), description="new output of its running jobs (None: unread)")
    model_names: frozenset[str] = Field(frozenset(), description="the DB's names of the cell's model (its family)")
    benchmark_names: frozenset[str] = Field(frozenset(), description="the DB's names of the cell's benchmark")
    retries: tuple[RetryRequest, ...] = Field((), description="a human's retry requests for the cell (RULES §13)")
