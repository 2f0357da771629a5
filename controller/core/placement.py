"""Placement: on which of an EvalRun's clusters an unbound cell's first job goes (RULES §15). Pure."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from controller.core.types import Frozen

Strategy = Literal["soonest", "ordered"]


class PlacementPolicy(Frozen):
    """How an EvalRun with several clusters places a cell that has not run anywhere yet."""

    strategy: Strategy = Field(description="soonest: where the job is expected to start first; ordered: the first "
                                           "eligible cluster in the spec's order")
