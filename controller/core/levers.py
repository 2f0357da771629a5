"""What releases an upload hold short of a new attempt: `upload.forceUpload` (RULES §5, §14), in words that say
what it uploads. `evalctl retry` (RULES §13) re-runs the whole benchmark; the flag publishes the run that is there,
flagged, and every other run of the EvalRun it releases, so `status` and `explain` name it beside the retry."""

from __future__ import annotations

from collections.abc import Sequence

from controller.core.admission import Refused
from controller.core.types import Cell
from controller.core.vocabulary import CellPlan, Rule

FORCE_UPLOAD = "set upload.forceUpload: true in the EvalRun"
COMPLETENESS_HOLDS = frozenset({Rule.ADMISSION_INCOMPLETE, Rule.ADMISSION_INFRA_SHARE})


def force_upload_lever(cell: CellPlan) -> str | None:
    """The flag, where it would upload this held run: one held as overlong (`UploadGate`), or one held as
    incomplete or over the infra share that a partial upload may publish (at least upload.minCompletedFraction of
    its trials covered, something scored, partial uploads off). None for every other cell: the flag never lowers
    minCompletedFraction, nor releases identity, rewards or traffic."""
    if not cell.held:
        return None
    if cell.rule == Rule.UPLOAD_GATE:
        return (f"{FORCE_UPLOAD}: uploads this run and every other run of it held as overlong, flagged "
                "is_overlong (and the runs held as incomplete or over the infra share that cover "
                "upload.minCompletedFraction, flagged partial)")
    if cell.rule in COMPLETENESS_HOLDS and isinstance(cell.admission, Refused) and cell.admission.partial_would_publish:
        return (f"{FORCE_UPLOAD}: uploads this run and every other run of it held as incomplete or over the infra "
                "share that covers upload.minCompletedFraction, flagged partial (and the runs held as overlong)")
    return None


def retried(held: CellPlan, plans: Sequence[CellPlan]) -> list[Cell]:
    """The cells a retry of a held cell records a request for (`evalctl retry`, the retry annotation): the cell; a
    sharded cell, its shards, each of which then runs again (RULES §17: the cell itself launches nothing)."""
    if held.cell.shards == 1:
        return [held.cell]
    return [plan.cell for plan in plans if plan.cell.shard is not None and plan.cell.shard.parent == held.cell.key]
