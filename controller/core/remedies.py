"""What the rules remember about a cell across passes, and the remedies they start: failure modes of the catalog,
quarantines, refires, readings of a job's output (all frozen data, like `types.py`)."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from controller.core.types import (
    Frozen,
)


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


class Spill(BaseModel):
    """A queued job cancelled to run elsewhere (RULES §15), remembered before the cancel is sent: once accounting
    shows the job ended without starting, the cell is placed anew, never on `cluster` again for this move."""

    model_config = ConfigDict(frozen=True)

    run_tag: str
    job_id: str
    cluster: str = Field(description="the cluster it left")
    at: datetime


class ShardChoice(BaseModel):
    """How many shards a cell's estimate asked for (RULES §17), chosen once, before its first launch, and kept with
    the unsharded cell: its shards are cells whose identity holds the count, so it must not follow each new
    estimate (another count is another run, whose shards would abandon these)."""

    model_config = ConfigDict(frozen=True)

    count: int = Field(ge=2)
    reason: str = Field(description="why: the estimate and the limit it exceeds, for status and explain")
    at: datetime


class CellMemory(BaseModel):
    """What the rules remember about a cell between passes (kept in the controller state, per cell key).

    The planner says what it becomes (`CellPlan.remember`); the actor records what its actions learnt.
    Stored as JSON without its empty fields; keys it does not know (a newer version's) are ignored.
    """

    model_config = ConfigDict(frozen=True, extra="ignore")

    analyzed_run_tag: str | None = Field(None, description="the run tag whose post-eval report was last written")
    db_verified: str | None = Field(None, description="the last results-DB upload that read back as written")
    db_unverified: str | None = Field(None, description="the run tag whose results-DB upload did not read back as "
                                                        "written (another writer, a store that rounds): until one does")
    db_unverified_uploads: int = Field(0, description="uploads of that run tag in a row that did not read back")
    tracked_run_tag: str | None = Field(None, description="the run tag whose MLflow run read back as logged")
    track_error: str | None = Field(None, description="why the last MLflow upload did not read back")
    upload_as_is: str | None = Field(None, description="a run tag the monitor cancelled: upload it as is, never resume")
    stall_reading: StallReading | None = None
    remedies: tuple[Remedy, ...] = Field((), description="one per failed attempt the health rules diagnosed")
    output: OutputReading | None = Field(None, description="the running job's output, read so far")
    admitted: AdmissionRecord | None = Field(None, description="the last upload the admission gate admitted")
    spill: Spill | None = Field(None, description="its queued job cancelled to run on another cluster (RULES §15)")
    shards: ShardChoice | None = Field(None, description="the shards its estimate chose (walltime auto, RULES §17)")
    shards_undecodable: bool = Field(False, exclude=True, description="a choice of shards is stored that does not "
                                                                      "decode: the cell's shards cannot be known")

    def stored(self) -> dict[str, Any]:
        """The JSON the controller state keeps (the key names of every earlier version)."""
        return self.model_dump(mode="json", exclude_none=True)

    @classmethod
    def from_stored(cls, data: object) -> CellMemory:
        """Field by field: a value that does not decode is no reading (as an unknown key is), not a failed pass; a
        choice of shards that does not decode is said (`shards_undecodable`): read as none, it would run the cell as
        one job beside its shards."""
        if not isinstance(data, dict):
            return cls()
        kept = {}
        for name, value in data.items():
            if name in cls.model_fields:
                try:
                    cls.model_validate({name: value})
                except ValidationError:
                    if name == "shards":
                        kept["shards_undecodable"] = True
                    continue
                kept[name] = value
        return cls.model_validate(kept)
