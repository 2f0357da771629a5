"""The knobs of one EvalRun on its cluster, and the planner's fixed words."""

from __future__ import annotations

from datetime import timedelta
from typing import Literal

from pydantic import Field

from controller.core.admission import GatePolicy
from controller.core.gpu_hours import SizeBands
from controller.core.health import HealthLimits
from controller.core.types import Frozen
from controller.core.walltime import WalltimePolicy

OVER_BUDGET = "submission budget used up (maxSubmissionsPerPass / submissionsPerMinute); next pass"
UPLOAD_NOT_VERIFIED = "UploadNotVerified"
PAIR_LOCK = timedelta(hours=1)  # how long a pair whose token the pinggy server holds is handed to no job


class Policy(Frozen):
    """The knobs of one EvalRun on its cluster, in the units the rules use. No defaults here: each one is defined
    once, in the spec's models (controller/api), and `entry.wiring.policy_for` is the one place that turns a spec
    into a Policy. What the pass may do is read as predicates (`may_launch`, `may_upload`, `cancels_on_delete`),
    never worked out again from the spec's words."""

    username: str
    force_eval: bool
    suspend: bool
    stale_started: timedelta
    stale_pending: timedelta
    max_total_fires: int
    infra_error_threshold: int
    near_complete_fraction: float
    stale_near: timedelta
    stale_general: timedelta
    pre_walltime: timedelta
    settle: timedelta
    zombie_grace: timedelta
    may_upload: bool = Field(description="upload.db: an admitted score is written to the results DB (off: the "
                                         "post-eval report, and MLflow when tracked)")
    track: bool = Field(description="log to the tracker (MLflow); Completed needs its read-back")
    admission: GatePolicy = Field(description="what the admission gate lets through (RULES §14)")
    overlong: timedelta | Literal["walltime"] = Field(
        description="a run longer than this is overlong (walltime: than one job of its cell may run)")
    hold_overlong: bool = Field(description="upload.overlong hold: an overlong run waits for forceUpload; otherwise "
                                            "it is uploaded with is_overlong true")
    force_upload: bool = Field(description="an overlong hold is released by a human")
    max_submissions_per_pass: int
    max_live_jobs: int = Field(description="the cluster's ceiling on our queued + running jobs (the caller's budget "
                                           "counts it)")
    tunnel_pairs: tuple[str, ...]
    tunnel_urls: dict[str, str] = Field(description="pair → its public URL, where given")
    cancels_on_delete: bool = Field(description="deletionPolicy Cancel: deleting the EvalRun cancels its jobs")
    health: HealthLimits
    cluster: str = Field(description="the EvalCluster, as quarantines of its nodes and launches name it")
    max_gpu_hours: float | None = Field(description="spec.budget.maxGpuHours: launches past it are held")
    gpus_per_job: int = Field(description="the cluster's gpusPerJob: what a run dir's wall time costs")
    size_bands: SizeBands = Field(description="the size policy's bands: whose GPU-hours compare")
    walltime: WalltimePolicy = Field(description="spec.walltime: fixed, or each job's --time sized (RULES §16)")

    @property
    def may_launch(self) -> bool:
        """`spec.suspend` off: the pass may submit, resume and cancel (a suspended EvalRun only plans)."""
        return not self.suspend
