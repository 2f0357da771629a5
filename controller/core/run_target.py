"""What a pass reconciles: an EvalRun with its cells resolved, its policy bound and its cluster (or lanes) named,
made by the entry points from a spec and read by the core's pass."""

from __future__ import annotations

from pydantic import Field

from controller.core.intake import Selection
from controller.core.lanes import ClusterLane
from controller.core.notify import NotifyEvent
from controller.core.placement import PlacementPolicy
from controller.core.planner import Policy
from controller.core.types import Cell, ClusterRef, EvalRunRef, Frozen


class RunTarget(Frozen):
    """An EvalRun ready to reconcile: its resolved cells, its policy, and the cluster it runs on. An EvalRun with
    several clusters also has `lanes` (one per cluster, spec order); `cluster`, `cells` and `policy` are then its
    first lane's, each cell as the first lane that lists it resolves it."""

    evalrun: EvalRunRef
    cluster: ClusterRef
    cells: tuple[Cell, ...]
    policy: Policy
    generation: int | None = Field(None, description="the object's metadata.generation (operator), for status")
    selections: tuple[Selection, ...] = Field((), description="the models its modelSelector took (cells included)")
    intake: str = Field("", description="what its modelSelector did this pass, in words")
    unknown: str = Field("", description="why this pass cannot know its cells (its selections could not be read)")
    notify: dict[NotifyEvent, tuple[str, ...]] = Field(default_factory=dict, description="event → the webhooks told "
                                                                                         "of it (spec.notify)")
    lanes: tuple[ClusterLane, ...] = Field((), description="spec.clusters: one lane per cluster; empty for one cluster")
    placement: PlacementPolicy | None = Field(None, description="spec.placement, with spec.clusters")
