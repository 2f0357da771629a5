"""What the store knows of every EvalRun and cell, without a spec (`evalctl get`). Pure.

Only what is recorded: the controller state's submissions and cell memory, and the results-DB rows they name. The
planner's phase needs the spec (its desired state) and the cluster's queue and run dirs, so it is not here; a
cell's `status` is its newest attempt's row status (`Submitted` while no row is recorded; `Unknown` for a record
before 0.4, which names no model whose rows could be read). A score is an uploaded
row's; whether it is provisional is what the admission gate recorded when it admitted that upload, else unknown.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime

from pydantic import Field

from controller.core.metrics import same_number
from controller.core.observed import Submission
from controller.core.records import SandboxJobRow, StateSnapshot
from controller.core.remedies import CellMemory
from controller.core.types import Frozen

SUBMITTED = "Submitted"  # an intent whose row is not (yet) in the results DB
UNKNOWN = "Unknown"  # its row was not read (a record before 0.4), or it has no status


class CellRecord(Frozen):
    evalrun: str
    cell_key: str
    model: str | None = Field(description="None in records before 0.4, which kept only the cell key")
    benchmark: str | None = Field(description="`benchmarks.name` of the cell (its dataset after the last '/')")
    cluster: str | None = Field(description="the cluster its newest job was submitted to (its ClusterRef), else for a "
                                            "record before that was kept the EvalCluster its rows name (`config.env`); "
                                            "None: neither")
    status: str = Field(description="the newest attempt's row status (Pending, Started, Finished), Submitted or "
                                    "Unknown")
    attempts: int
    run_tag: str = Field(description="the newest attempt's run tag (= job name)")
    job_id: str | None
    score: float | None = Field(description="accuracy of the newest uploaded row of its attempts")
    n_scored: int | None = Field(description="that row's n_valid_trials")
    provisional: bool | None = Field(description="as the admission gate recorded it for that upload; None: no record")
    submitted_at: datetime = Field(description="when its newest attempt was recorded")


class EvalRunRecord(Frozen):
    evalrun: str
    cells: int
    statuses: dict[str, int] = Field(description="cells by status")
    scored: int
    provisional: int
    clusters: tuple[str, ...]
    submitted_at: datetime = Field(description="its newest submission")


def cell_records(state: StateSnapshot, rows: Sequence[SandboxJobRow]) -> tuple[CellRecord, ...]:
    """One record per (EvalRun, cell) that submitted, by EvalRun then model and benchmark."""
    by_id = {row.id: row for row in rows}
    grouped: dict[tuple[str, str], list[Submission]] = defaultdict(list)
    for submission in state.submissions:
        grouped[(str(submission.evalrun), submission.cell_key)].append(submission)
    records = [_cell(evalrun, subs, by_id, state.cell_memory.get(key)) for (evalrun, key), subs in grouped.items()]
    return tuple(sorted(records, key=lambda r: (r.evalrun, r.model or r.cell_key, r.benchmark or "")))


def evalrun_records(cells: Sequence[CellRecord]) -> tuple[EvalRunRecord, ...]:
    grouped: dict[str, list[CellRecord]] = defaultdict(list)
    for cell in cells:
        grouped[cell.evalrun].append(cell)
    records = []
    for evalrun, its in sorted(grouped.items()):
        statuses: dict[str, int] = defaultdict(int)
        for cell in its:
            statuses[cell.status] += 1
        records.append(EvalRunRecord(
            evalrun=evalrun, cells=len(its), statuses=dict(sorted(statuses.items())),
            scored=sum(1 for c in its if c.score is not None), provisional=sum(1 for c in its if c.provisional),
            clusters=tuple(sorted({c.cluster for c in its if c.cluster})),
            submitted_at=max(c.submitted_at for c in its)))
    return tuple(records)


def _cell(evalrun: str, subs: list[Submission], rows: dict[str, SandboxJobRow],
          memory: CellMemory | None) -> CellRecord:
    ordered = sorted(subs, key=lambda s: (s.attempt, s.fire, s.created_at))
    newest = ordered[-1]
    own_rows = [rows[s.row_id] for s in reversed(ordered) if s.row_id in rows]
    newest_row = rows.get(newest.row_id or "")
    scored = next((r for r in own_rows if r.job_status == "Finished" and _metric(r, "accuracy") is not None), None)
    admitted = memory.admitted if memory is not None else None
    config = next((r.config for r in own_rows if r.config), None) or {}
    n_valid = _metric(scored, "n_valid_trials") if scored is not None else None
    return CellRecord(
        evalrun=evalrun, cell_key=newest.cell_key, model=newest.model, benchmark=newest.benchmark,
        cluster=newest.cluster or (str(config["env"]) if config.get("env") else None),
        status=_status(newest, newest_row),
        attempts=max(s.attempt for s in subs), run_tag=newest.run_tag,
        job_id=next((s.job_id for s in reversed(ordered) if s.job_id), None),
        score=_metric(scored, "accuracy") if scored is not None else None,
        n_scored=int(n_valid) if n_valid is not None else None,
        provisional=admitted.provisional if admitted is not None and scored is not None
        and admitted.run_tag == scored.job_name and same_number(admitted.score, _metric(scored, "accuracy"))
        else None,  # the record speaks for the number it admitted, not for a row changed since
        submitted_at=newest.created_at)


def _status(newest: Submission, row: SandboxJobRow | None) -> str:
    if row is not None:
        return row.job_status or UNKNOWN
    return UNKNOWN if newest.model is None or newest.benchmark is None else SUBMITTED


def _metric(row: SandboxJobRow, name: str) -> float | None:
    return next((m.value for m in row.metrics or () if m.name == name), None)
