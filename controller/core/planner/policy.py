"""The knobs of one EvalRun on its cluster, and the planner's fixed words."""

from __future__ import annotations

from datetime import timedelta
from typing import Literal

from pydantic import Field

from controller.core.admission import GatePolicy
from controller.core.gpu_hours import SizeBands
from controller.core.health import HealthLimits
from controller.core.types import Frozen

OVER_BUDGET = "submission budget used up (maxSubmissionsPerPass / submissionsPerMinute); next pass"
UPLOAD_NOT_VERIFIED = "UploadNotVerified"
PAIR_LOCK = timedelta(hours=1)  # how long a pair whose token the pinggy server holds is handed to no job


class Policy(Frozen):
    """The knobs of one EvalRun on its cluster, in the units the rules use."""

    username: str
    force_eval: bool = False
    suspend: bool = False
    stale_started: timedelta = timedelta(hours=24)
    stale_pending: timedelta = timedelta(hours=6)
    max_total_fires: int = 2
    infra_error_threshold: int = 10
    near_complete_fraction: float = 0.97
    stale_near: timedelta = timedelta(minutes=60)
    stale_general: timedelta = timedelta(minutes=90)
    pre_walltime: timedelta = timedelta(minutes=15)
    settle: timedelta = timedelta(minutes=60)
    zombie_grace: timedelta = timedelta(minutes=10)
    upload_db: bool = True
    track: bool = Field(False, description="log to the tracker (MLflow); Completed needs its read-back")
    admission: GatePolicy = Field(GatePolicy(), description="what the admission gate lets through (RULES §14)")
    overlong: timedelta | Literal["walltime"] = Field(
        "walltime", description="a run longer than this is overlong (walltime: than one job of its cell may run)")
    hold_overlong: bool = Field(False, description="upload.overlong hold: an overlong run waits for forceUpload; "
                                                   "otherwise it is uploaded with is_overlong true")
    force_upload: bool = Field(False, description="an overlong hold is released by a human")
    max_submissions_per_pass: int = 6
    max_live_jobs: int = Field(50, description="the cluster's ceiling on our queued + running jobs (the caller's "
                                               "budget counts it)")
    tunnel_pairs: tuple[str, ...] = ()
    tunnel_urls: dict[str, str] = Field(default_factory=dict, description="pair → its public URL, where given")
    cancel_on_delete: bool = Field(False, description="deletionPolicy Cancel: deleting the EvalRun cancels its jobs")
    health: HealthLimits = HealthLimits()
    cluster: str = Field("", description="the EvalCluster, as quarantines of its nodes and launches name it")
    max_gpu_hours: float | None = Field(None, description="spec.budget.maxGpuHours: launches past it are held")
    gpus_per_job: int = Field(0, description="the cluster's gpusPerJob: what a run dir's wall time costs")
    size_bands: SizeBands = Field(SizeBands(), description="the size policy's bands: whose GPU-hours compare")
