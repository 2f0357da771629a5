"""The adapter contracts (crossplane-style): observe never mutates; each mutation says whether it is safe to repeat.

The core imports these Protocols, never a backend. Each observe method is ONE batched read per
pass and raises `ObservationError` when the source cannot be read: callers turn that into
Unknown, never into "absent". Every mutation is idempotent but one, `Scheduler.submit`: the
submission protocol's find-first step is what keeps it from running twice.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Protocol

from pydantic import Field

from controller.core.intake import RegisteredModel, Selection
from controller.core.notify import Fact, Notification, NotifyEvent
from controller.core.observed import (
    JobOutput,
    ObservedJob,
    RowStatus,
    RunDirFacts,
    Submission,
    TunnelLease,
)
from controller.core.records import (
    NewRow,
    ResultsSnapshot,
    ResultUpload,
    RowAuditMark,
    SandboxJobRow,
    StateSnapshot,
)
from controller.core.remedies import CellMemory, Quarantined, QuarantineKind
from controller.core.retry import RetryRequest
from controller.core.types import EvalRunRef, Frozen


class ObservationError(RuntimeError):
    """A source could not be read this pass; its cells are Unknown."""


class StoreUnavailable(RuntimeError):
    """The store cannot be opened or written right now (not a database, read-only, locked, down).

    Every backend raises it, with one line that names the store without credentials and says what to check.
    """


class WriteRefused(RuntimeError):
    """The store will not make this write: it is open read-only, or the row belongs to another user."""


class JobsDirMissing(ObservationError):
    """The cluster's jobs dir does not exist: fresh (nothing ran yet) or unmounted, which only history tells. Its
    message says only what was seen (`join_cells` adds the guess where a cell's history makes it one).

    Cells with anything recorded (a row, a submission, a job) are Unknown; a cell with no history at all
    may still be submitted, since its job is what creates the dir.
    """


# --------------------------------------------------------------------------- store
#
# Two halves that may live in different places: the lab's shared results DB (the OT-Agent tables, e.g.
# Supabase) and the controller's own state (submissions, leases, cell owners, cell memory; Postgres or
# SQLite). The rules every backend keeps are stated here and proven by one contract suite
# (tests/store/contract) run against each backend.


class ResultsDB(Protocol):
    """The lab's shared OT-Agent tables (RULES §1), written by many users and tools.

    Rules for every backend:
    - Writes touch only rows whose `username` is `owner`; anything else raises `WriteRefused`, checked in the
      same statement as the write, so a row that changes hands meanwhile is not written either.
    - A row's status only moves forward (Pending → Started → Finished).
    - The tables are used as they are: never altered, never a row deleted.
    - A read that fails raises `ObservationError`; a write that cannot reach the DB raises `StoreUnavailable`.
    """

    def read_results(self, model_names: list[str] | None, benchmark_names: list[str] | None) -> ResultsSnapshot:
        """The families of the named models and benchmarks and every row between them, in a constant number of
        round trips whatever the number of names. `None` means every model (or benchmark): the whole table."""
        ...

    def read_row(self, row_id: str) -> SandboxJobRow | None:
        """One row, to verify an upload landed."""
        ...

    def read_models(self) -> tuple[RegisteredModel, ...]:
        """Every canonical registered model (`duplicate_of` null), with its `creation_time`, in one statement:
        what a modelSelector chooses from."""
        ...

    def create_row(self, row: NewRow) -> None:
        """Insert a row of `row.username`, registering its model and benchmark if new. An existing id (whoever
        owns it) is left as it is, so repeating it is a no-op.

        Legacy data has several rows of one name; the row reused is, among those of that exact name, a canonical
        one (`duplicate_of` null) first, then the oldest by `creation_time` (a row without one, or whose value is
        not a time, last; `benchmarks` has no such column), then the smallest id compared as text. Every backend
        picks the same row, so rows written through different backends point at the same model and benchmark."""
        ...

    def update_row(self, row_id: str, *, owner: str, status: RowStatus | None = None,
                   started_at: datetime | None = None, slurm_job_id: str | None = None) -> None:
        """Move one of `owner`'s rows forward and/or record its job id. Idempotent; never moves a row back."""
        ...

    def upload_result(self, row_id: str, result: ResultUpload, *, owner: str) -> bool:
        """Mark `owner`'s row Finished with metrics (a LIST of {name, value}) and `is_overlong`.

        Exactly once: a row already Finished with the same metrics and the same `is_overlong` (null reads as
        false) is left untouched (returns False).
        """
        ...

    def read_audit_marks(self, row_ids: Sequence[str]) -> dict[str, RowAuditMark]:
        """The audit marks of these rows (row id → mark), in one statement; a store without marks has none."""
        ...

    def mark_rows(self, marks: Sequence[RowAuditMark]) -> None:
        """Record the gate's verdict on rows of ANY user in `evalrun_row_audit`, the store's own table: the
        `sandbox_jobs` rows themselves are never written. One transaction; a row already marked with the same
        gate, verdict, refusal and reason keeps its mark (and its `audited_at`), another mark replaces it.
        A backend that cannot hold the table raises `WriteRefused`."""
        ...

    def close(self) -> None: ...


class SubmissionLedger(Protocol):
    """Submissions and claims: the exactly-once submission protocol, who owns a cell, what its rules remember."""

    def read_state(self, evalrun: EvalRunRef, cell_keys: list[str], owner_ttl_s: float,
                   benchmarks: Sequence[str] = ()) -> StateSnapshot:
        """Submissions of this EvalRun and of the named cells (whichever EvalRun made them: a cell's history is
        the cell's), every tunnel lease, the claims on the named cells renewed within `owner_ttl_s`, their
        memory, every unexpired quarantine, and the newest GPU_HISTORY_MAX finished attempts of the named
        `benchmarks` whose GPU-hours are all recorded (any EvalRun's, any cell's). One read transaction."""
        ...

    def read_inventory(self) -> StateSnapshot | None:
        """Every submission of every EvalRun (oldest first) and every cell's memory, in one read transaction: what
        `evalctl get` lists without a spec. None when no controller state is kept here at all (no file, no tables):
        nothing was ever recorded at this place, which is not the same as an empty record."""
        ...

    def record_submission(self, submission: Submission) -> None:
        """Step 1 of the submission protocol, durable before anything runs. Repeating it is a no-op.

        A new attempt (fire 1) consumes every pending retry request of its cell in the same transaction: the
        request that released a hold and the attempt it released are recorded together or not at all."""
        ...

    def record_job_id(self, submission_name: str, job_id: str) -> None:
        """Step 3: remember the scheduler's id. Idempotent."""
        ...

    def record_job_end(self, submission_name: str, gpu_hours: float | None, elapsed_hours: float | None) -> None:
        """What the submission's ended job used: its GPU-hours, how long it ran (None: leave as recorded).
        Idempotent."""
        ...

    def finish_attempt(self, run_tag: str) -> None:
        """Mark the attempt's submissions finished (its report was written): from now on its GPU-hours are history
        that estimates go by. The first time is kept; repeating it is a no-op."""
        ...

    def claim_cells(self, evalrun: EvalRunRef, cell_keys: list[str], ttl_s: float) -> dict[str, EvalRunRef]:
        """Make `evalrun` the owner of each named cell that is free, its own, or whose owner has not renewed
        its claim within `ttl_s`; drop its claims on cells it no longer names. One transaction, so two
        reconcilers never both own a cell. Returns the owner of every named cell afterwards."""
        ...

    def remember(self, cell_key: str, memory: CellMemory) -> None:
        """Replace what the rules remember about a cell (readings across passes). Idempotent."""
        ...

    def read_memories(self, cell_keys: Sequence[str]) -> dict[str, CellMemory]:
        """What the rules remember about the named cells (those with a memory), in one statement: read before a
        pass resolves its cells, for the shards an estimate chose (RULES §17)."""
        ...


class RetryLedger(Protocol):
    """A human's requests to release a held cell once (RULES §13); `read_state` returns the named cells'."""

    def request_retry(self, request: RetryRequest) -> bool:
        """Record a pending request. One of the same id is kept as it is (False): repeating it is a no-op."""
        ...


class SelectionLedger(Protocol):
    """What each EvalRun's modelSelector took."""

    def read_selections(self, evalrun: EvalRunRef) -> tuple[Selection, ...]:
        """The models `evalrun`'s modelSelector took, oldest first. One statement."""
        ...

    def record_selections(self, evalrun: EvalRunRef, selections: Sequence[Selection]) -> None:
        """Record what a selector took, before any of its cells acts. One transaction; a model recorded before
        keeps its first record."""
        ...


class EffectLedger(Protocol):
    """Remedies in force: quarantined nodes, locked pinggy pairs, a cluster's back-off."""

    def quarantine(self, kind: QuarantineKind, scope: str, name: str, reason: str, ttl_s: float,
                   owner: str = "") -> bool:
        """Keep `name` (a node, a pinggy pair, a cluster's launches) out of use for `ttl_s` seconds from now by the
        store's clock, decided by `owner`'s pass (an EvalRun); repeating it extends the time and keeps its `since`
        (the store's clock when it began). `read_state` and `live_quarantines` return it until then.

        One a human released is not brought back by the same decision (the same reason) before it would have
        ended: a pass that decides again from the failure it already saw must not undo the release. Returns whether
        the quarantine is in force now (False: that released decision)."""
        ...

    def release_quarantine(self, kind: QuarantineKind, scope: str, name: str) -> bool:
        """Lift a quarantine before its end (a human's call); True if one was in force. Releasing twice, or one
        that is absent or over, is a no-op (False)."""
        ...

    def live_quarantines(self) -> tuple[Quarantined, ...]:
        """Every quarantine in force by the store's clock, of every kind and scope, by kind, scope and name: what
        a human looks at. One statement; a store made before quarantines has none."""
        ...


class Leases(Protocol):
    """Who may act: an EvalRun's and a cluster's act-leases, and the pinggy pairs leased to jobs."""

    def try_lease(self, name: str, holder: str, ttl_s: float) -> bool:
        """Take or renew the act-lease `name` for `holder`; False when someone else holds it unexpired."""
        ...

    def lease_holder(self, name: str) -> str | None:
        """Who holds an unexpired lease `name`, if anyone (to notice a holder that died)."""
        ...

    def release_lease(self, name: str, holder: str) -> None: ...

    def take_tunnel(self, lease: TunnelLease) -> bool:
        """Lease a pinggy pair to `lease.holder`; True if it is now theirs (already theirs included)."""
        ...

    def release_tunnel(self, pair: str, holder: str) -> None:
        """Give a pair back; only the holder's lease is dropped, twice is a no-op."""
        ...

class Outbox(Protocol):
    """Notifications: a pass records its transitions and their messages in one transaction; a sender claims one
    message at a time (compare-and-set), delivers it, and marks it. Nothing here talks HTTP."""

    def record_transitions(self, evalrun: EvalRunRef, facts: Sequence[Fact],
                           webhooks: Mapping[NotifyEvent, Sequence[str]]) -> tuple[Notification, ...]:
        """In one transaction, serialized per EvalRun: compare `facts` with the recorded episodes
        (`core.notify.transitions`), write the changed ones and queue one pending message per new episode and webhook
        that wants its event (a message queued before is left as it is). Returns the EvalRun's undelivered messages
        afterwards (pending and given up), oldest first."""
        ...

    def read_notifications(self, evalrun: EvalRunRef) -> tuple[Notification, ...]:
        """The EvalRun's undelivered messages (pending and given up), oldest first. One statement; a store made before
        notifications has none."""
        ...

    def claim_notification(self, notification_id: str, holder: str, claim_s: float, *,
                           take_from: str | None = None) -> bool:
        """Make `holder` the only sender of a pending message that is due (its back-off passed, by the store's clock)
        and unclaimed, its own, claimed longer than its claim ago, or claimed by `take_from` (a sender known dead).
        One conditional write: two senders never both hold it."""
        ...

    def finish_notification(self, notification_id: str, holder: str, *, delivered: bool, error: str = "",
                            retry_in_s: float | None = None) -> None:
        """Record the attempt `holder` made (only while it holds the claim) and drop the claim: delivered; or failed
        with `error`, due again `retry_in_s` seconds from now, or given up when that is None."""
        ...


class ControllerState(SubmissionLedger, RetryLedger, SelectionLedger, EffectLedger, Leases, Outbox, Protocol):
    """The reconciler's own bookkeeping, one store holding every ledger. Expiry is decided by the database's
    clock, never a client's."""

    def close(self) -> None: ...


class SqlBackend(ResultsDB, ControllerState, Protocol):
    """A database that holds both halves (SQLite, PostgreSQL)."""


# --------------------------------------------------------------------------- scheduler


class SubmitRequest(Frozen):
    name: str = Field(description="deterministic job name (submission name)")
    comment: str = Field(description="the cell key, for humans and sacct")
    script: str
    args: tuple[str, ...]
    env: dict[str, str] = Field(description="EVAL_* environment, secrets included (never logged)")
    logs_dir: str
    time_limit: str
    exclude_nodes: tuple[str, ...] = Field((), description="nodes not to run on (sbatch --exclude)")


class OutputCursor(Frozen):
    """Where to go on reading a running job's output."""

    job_id: str
    name: str
    offset: int = 0


GPU_HISTORY_MAX = 2_000  # finished attempts an estimate reads, newest first: a constant-size read however old the lab

OUTPUT_READ_CAP = 256 << 10  # bytes of one job's output read per pass: a pass stays cheap, a backlog catches up


class Scheduler(Protocol):
    def observe(self) -> tuple[ObservedJob, ...]:
        """Queue and accounting, one read each, for our user and our job-name prefix."""
        ...

    def find(self, name: str) -> ObservedJob | None:
        """Look one name up in the queue AND accounting (step 2 of the submission protocol)."""
        ...

    def usable_nodes(self) -> tuple[str, ...] | None:
        """The nodes the cluster's jobs may run on (its partition's), one read; None where the scheduler cannot
        tell or has no nodes to choose. Raises ObservationError when the read fails: never "no nodes"."""
        ...

    def submit(self, request: SubmitRequest) -> str:
        """Start a job and return its id. NOT idempotent: only call after `find` returned None."""
        ...

    def cancel(self, job_id: str) -> None:
        """Cancel a job; cancelling a finished or unknown job is a no-op."""
        ...

    def read_output(self, cursors: Sequence[OutputCursor]) -> tuple[JobOutput, ...]:
        """What each job printed from its cursor's offset, at most OUTPUT_READ_CAP bytes each, masked with the
        cluster's secrets; one read for all (one command over ssh). A job whose output file is not there (yet)
        is left out; a read that fails raises `ObservationError`. Never mutates."""
        ...


# --------------------------------------------------------------------------- run dirs


RunTagFilter = Callable[[str], bool]  # which entries of a jobs dir a pass reads, by name


def every_run_tag(_: str) -> bool:
    return True


class RunDirs(Protocol):
    def observe(self, wanted: RunTagFilter = every_run_tag) -> tuple[RunDirFacts, ...]:
        """The Harbor job directories under the cluster's jobs dir that `wanted` names, reduced to facts."""
        ...


# --------------------------------------------------------------------------- tracker


class TrackerRecord(Frozen):
    """What one cell attempt logs: the tags find the run again, so re-analysis continues the same run."""

    run_tag: str
    owner: str = Field(description="the username whose results DB holds the cell's row: the run tag names no user")
    tags: dict[str, str] = Field(description="cell key, model, benchmark, cluster, EvalRun, …")
    params: dict[str, str]
    metrics: dict[str, float]
    report: str = Field(description="post_eval_report.txt, logged as an artifact")


class TrackedRun(Frozen):
    """A run as the tracking server returns it."""

    run_id: str
    tags: dict[str, str]
    params: dict[str, str]
    metrics: dict[str, float]
    artifacts: tuple[str, ...]


class Tracker(Protocol):
    """An experiment tracker (MLflow). One run per cell attempt, identified by its run tag."""

    def log(self, experiment: str, record: TrackerRecord) -> str:
        """Find `record.owner`'s run tagged `record.run_tag` (or create it) and log everything to it; its id.
        Repeating it logs to the same run. Raises `StoreUnavailable` when the server cannot be reached."""
        ...

    def read_back(self, experiment: str, run_tag: str, owner: str) -> TrackedRun | None:
        """`owner`'s run as the server stores it now, or None if there is none (another user's run of the same tag is
        not it). Raises `ObservationError` on failure."""
        ...

