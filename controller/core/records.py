"""What the store's ports read and write: results-DB rows and the snapshots one pass reads, new rows and
uploads, and the audit's marks (frozen data; the protocols are in `ports.py`)."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import Field

from controller.core.gpu_hours import AttemptCost
from controller.core.observed import (
    CellOwner,
    Metric,
    ObservedRow,
    RowStatus,
    Submission,
    TunnelLease,
)
from controller.core.remedies import CellMemory, Quarantined
from controller.core.retry import RetryRequest
from controller.core.types import Frozen


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
    n_rep_eval: int | None = Field(None, description="attempts per task, as the writer recorded it (None: unreadable)")


class ResultsSnapshot(Frozen):
    """One read of the results DB, narrowed to the families of the named models and benchmarks."""

    models: tuple[NamedRow, ...]
    benchmarks: tuple[NamedRow, ...]
    rows: tuple[SandboxJobRow, ...]
    undecodable: tuple[str, ...] = Field((), description="'row <id>: why' for rows that could not be read")


class StateSnapshot(Frozen):
    """One read of the controller's own state for an EvalRun and its cells."""

    submissions: tuple[Submission, ...] = ()
    tunnel_leases: tuple[TunnelLease, ...] = Field((), description="every pinggy lease, of every EvalRun")
    cell_owners: tuple[CellOwner, ...] = Field((), description="live claims on the named cells, whoever holds them")
    cell_memory: dict[str, CellMemory] = Field(default_factory=dict, description="what rules remembered per cell")
    quarantined: tuple[Quarantined, ...] = Field((), description="every unexpired quarantine (nodes, pairs, clusters)")
    gpu_history: tuple[AttemptCost, ...] = Field((), description="finished attempts of the named benchmarks, newest "
                                                                 "first: what GPU-hours are estimated from")
    retries: tuple[RetryRequest, ...] = Field((), description="retry requests of the named cells (RULES §13)")


class StoreSnapshot(Frozen):
    """Both halves as one pass sees them."""

    models: tuple[NamedRow, ...]
    benchmarks: tuple[NamedRow, ...]
    rows: tuple[SandboxJobRow, ...]
    submissions: tuple[Submission, ...]
    tunnel_leases: tuple[TunnelLease, ...] = ()
    cell_owners: tuple[CellOwner, ...] = ()
    cell_memory: dict[str, CellMemory] = Field(default_factory=dict)
    quarantined: tuple[Quarantined, ...] = ()
    gpu_history: tuple[AttemptCost, ...] = ()
    retries: tuple[RetryRequest, ...] = ()


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
    is_overlong: bool = Field(False, description="the run took longer than upload.overlongHours")
    env: str | None = Field(None, description="the cluster the run dir ran on, the row's `config.env` from then on: "
                                              "a cell that spilled was given its row on the cluster it left")


class AuditVerdict(StrEnum):
    """What the admission gate says today of a row already in the results DB (`evalctl db audit`)."""

    OK = "ok"
    PROVISIONAL = "provisional"  # admitted, but on fewer scored trials than report.trustThreshold
    PARTIAL = "partial"  # admitted only flagged partial (upload.partial: upload): not a whole run of the cell
    REFUSED = "refused"  # the gate would not publish this number


class RowAuditMark(Frozen):
    """The gate's verdict on one `sandbox_jobs` row, kept beside the lab's tables (never in them): what a
    leaderboard filters by. `audited_at` is the store's clock at the first write of this verdict."""

    row_id: str
    gate: int = Field(description="GATE_VERSION of the gate that judged it")
    verdict: AuditVerdict
    refusal: str | None = Field(None, description="the Refusal, when refused")
    reason: str = ""
    audited_at: datetime | None = None

    def same_verdict(self, other: RowAuditMark) -> bool:
        """One gate's same judgement of the row (the time it was recorded aside)."""
        return (self.row_id, self.gate, self.verdict, self.refusal, self.reason) == \
            (other.row_id, other.gate, other.verdict, other.refusal, other.reason)
