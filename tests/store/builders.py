"""Small constructors for the values the actor hands the store."""

from __future__ import annotations

from datetime import UTC, datetime

from controller.core.observed import RowStatus, Submission
from controller.core.records import NewRow

T0 = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
RUN_TAG = "ev_laion__Qwen3-8B-sft-v3__dev_set_v2__abcd1234__a1"


def submission(name: str = RUN_TAG, *, evalrun: str = "qwen-evals", row_id: str | None = "row-1") -> Submission:
    return Submission(
        name=name,
        run_tag=RUN_TAG,
        evalrun=evalrun,
        cell_key="laion/Qwen3-8B-sft-v3|DCAgent/dev_set_v2|abcd1234",
        attempt=1,
        fire=1,
        row_id=row_id,
        created_at=T0,
    )


def new_row(
    row_id: str = "row-1",
    *,
    model: str = "laion/Qwen3-8B-sft-v3",
    benchmark: str = "dev_set_v2",
    username: str = "alice",
    status: RowStatus = RowStatus.PENDING,
) -> NewRow:
    return NewRow(
        id=row_id,
        job_name=RUN_TAG,
        username=username,
        model_name=model,
        benchmark_name=benchmark,
        job_status=status,
        submitted_at=T0,
        config={"agent": "terminus-2", "env": "daytona", "timeout_multiplier": 2.0, "run_tag": RUN_TAG},
    )
