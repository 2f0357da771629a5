"""The adapter contracts (crossplane-style): observe never mutates, every mutation is safe to repeat.

The core imports these Protocols, never a backend. Each observe method is ONE batched read per
pass and raises `ObservationError` when the source cannot be read: callers turn that into
Unknown, never into "absent".
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Protocol

from pydantic import Field

from controller.core.types import (
    CellOwner,
    Frozen,
    Metric,
    ObservedJob,
    ObservedRow,
    RowStatus,
    RunDirFacts,
    Submission,
    TunnelLease,
)


class ObservationError(RuntimeError):
    """A source could not be read this pass; its cells are Unknown."""


class StoreUnavailable(RuntimeError):
    """The store cannot be opened or written right now (not a database, read-only, locked, down).

    Every backend raises it, with one line that names the store without credentials and says what to check.
    """


class JobsDirMissing(ObservationError):
    """The cluster's jobs dir does not exist: fresh (nothing ran yet) or unmounted, which only history tells.

    Cells with anything recorded (a row, a submission, a job) are Unknown; a cell with no history at all
    may still be submitted, since its job is what creates the dir.
    """


# --------------------------------------------------------------------------- store


class NamedRow(Frozen):
    """A `models` or `benchmarks` row: enough to build families."""

    id: str
    name: str
    duplicate_of: str | None = None


class SandboxJobRow(ObservedRow):
    """A `sandbox_jobs` row as stored (OT-Agent schema): what a cell sees, plus what matching needs."""

    model_id: str | None = None
    benchmark_id: str | None = None
    config: dict[str, Any] | None = None


class StoreSnapshot(Frozen):
    """One pass's read of the store, already narrowed to the families the EvalRun names."""

    models: tuple[NamedRow, ...]
    benchmarks: tuple[NamedRow, ...]
    rows: tuple[SandboxJobRow, ...]
    submissions: tuple[Submission, ...]
    tunnel_leases: tuple[TunnelLease, ...] = Field((), description="every pinggy lease, of every EvalRun")
    cell_owners: tuple[CellOwner, ...] = Field((), description="who acts for the named cells, whoever claimed them")


class NewRow(Frozen):
    """What the actor writes when it records an intent (a Pending row) or an orphan's result."""

    id: str
    job_name: str
    username: str
    model_name: str
    benchmark_name: str
    job_status: RowStatus
    submitted_at: datetime | None = None
    started_at: datetime | None = None
    n_trials: int | None = None
    n_rep_eval: int = 1
    config: dict[str, Any] = Field(default_factory=dict)
    slurm_job_id: str = "pending"


class ResultUpload(Frozen):
    metrics: tuple[Metric, ...]
    stats: dict[str, Any]
    n_trials: int
    ended_at: datetime


class Store(Protocol):
    def observe(self, evalrun: str, model_names: list[str], benchmark_names: list[str],
                cell_keys: list[str] | None = None) -> StoreSnapshot:
        """Families of the named models/benchmarks, their sandbox_jobs rows, the submissions of this EvalRun
        and of the named cells (whichever EvalRun made them: a cell's history is the cell's), and the owners
        of the named cells.

        A store that lacks the reconciler's own tables (a legacy OT-Agent DB) returns no submissions.
        """
        ...

    def claim_cells(self, evalrun: str, cell_keys: list[str], ttl_s: float, now: datetime) -> dict[str, str]:
        """Make `evalrun` the owner of each named cell that is free, its own, or whose owner has not renewed
        its claim within `ttl_s`; drop its claims on cells it no longer names. One transaction, so two
        reconcilers never both own a cell. Returns the owner of every named cell afterwards."""
        ...

    def record_intent(self, submission: Submission, row: NewRow | None) -> None:
        """Step 1 of the submission protocol, durable before anything runs. Repeating it is a no-op."""
        ...

    def record_job_id(self, submission_name: str, job_id: str, row_id: str | None) -> None:
        """Step 3: remember the scheduler's id on the submission and its row. Idempotent."""
        ...

    def update_row_status(
        self, row_id: str, status: RowStatus, *, started_at: datetime | None = None, slurm_job_id: str | None = None
    ) -> None:
        """Move one of our rows along Pending → Started. Idempotent."""
        ...

    def create_row(self, row: NewRow) -> None:
        """Insert a row (for a result found on disk that no row points at). Idempotent on `row.id`."""
        ...

    def upload_result(self, row_id: str, result: ResultUpload) -> None:
        """Mark the row Finished with metrics (a LIST of {name, value}). Idempotent."""
        ...

    def read_row(self, row_id: str) -> SandboxJobRow | None:
        """Read one row back, to verify an upload landed."""
        ...

    def try_lease(self, name: str, holder: str, ttl_s: float, now: datetime) -> bool:
        """Take or renew the act-lease `name` for `holder`; False when someone else holds it."""
        ...

    def lease_holder(self, name: str, now: datetime) -> str | None:
        """Who holds an unexpired lease `name`, if anyone (to notice a holder that died)."""
        ...

    def release_lease(self, name: str, holder: str) -> None: ...

    def take_tunnel(self, lease: TunnelLease) -> bool:
        """Lease a pinggy pair to `lease.holder`; True if it is now theirs (already theirs included)."""
        ...

    def release_tunnel(self, pair: str, holder: str) -> None:
        """Give a pair back; only the holder's lease is dropped, twice is a no-op."""
        ...

    def close(self) -> None: ...


# --------------------------------------------------------------------------- scheduler


class SubmitRequest(Frozen):
    name: str = Field(description="deterministic job name (submission name)")
    comment: str = Field(description="the cell key, for humans and sacct")
    script: str
    args: tuple[str, ...]
    env: dict[str, str] = Field(description="EVAL_* environment, secrets included (never logged)")
    logs_dir: str
    time_limit: str


class Scheduler(Protocol):
    def observe(self) -> tuple[ObservedJob, ...]:
        """Queue and accounting, one read each, for our user and our job-name prefix."""
        ...

    def find(self, name: str) -> ObservedJob | None:
        """Look one name up in the queue AND accounting (step 2 of the submission protocol)."""
        ...

    def submit(self, request: SubmitRequest) -> str:
        """Start a job and return its id. NOT idempotent: only call after `find` returned None."""
        ...

    def cancel(self, job_id: str) -> None:
        """Cancel a job; cancelling a finished or unknown job is a no-op."""
        ...


# --------------------------------------------------------------------------- run dirs


class RunDirs(Protocol):
    def observe(self) -> tuple[RunDirFacts, ...]:
        """Every Harbor job directory under the cluster's jobs dir, reduced to facts."""
        ...
