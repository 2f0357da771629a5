"""RULES §2: nothing of the cell is queued or running; the newest matching row decides, on its line of the dedup
table (`controller.core.dedup`). `SETTLED_RULES` is read top to bottom; the first that decides wins.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from controller.core.actions import Hold, Skip
from controller.core.dedup import DEDUP_TABLE, Dedup, RowCase, newest, row_case
from controller.core.observed import ObservedRow, RowStatus
from controller.core.planner.rules_resume import finish_interrupted, from_dir, own_row_without_live_job
from controller.core.planner.rules_upload import finished, upload
from controller.core.planner.view import CellView
from controller.core.planner.words import when
from controller.core.resume import DirClass
from controller.core.vocabulary import CellPlan, Phase, Rule


@dataclass(slots=True)
class Settled:
    """The row that decides (None: no row), its line of the §2 table, and that line."""

    view: CellView
    row: ObservedRow | None
    case: RowCase
    dedup: Dedup


def union_of_shards(s: Settled) -> CellPlan | None:
    """RULES §17: a sharded cell's union of its shards' run dirs goes through the upload gate (its shards' own rules
    resumed what they could: no §4 class of its own) into a row of its own, whatever row is newest, unless that is a
    Finished row with metrics written after the union's last trial (a later run: it decides, as for any cell). The
    cell writes no row before its upload: a newer row that is not done, or an earlier union's that the shards ran
    again after, must not hold it back. Once the union's row is Finished with metrics, it is done (read back,
    tracked). (A union row cleared makes no union of the runs before it: `shards.cleared_union_at`.)"""
    view = s.view
    union = next((facts for facts in view.dirs.values() if facts.shards), None)
    if union is None:
        return None
    row = next((r for r in view.rows if r.job_name == union.run_tag and view.ours(r)), None)
    if row is not None and row.job_status == RowStatus.FINISHED and row.has_metrics:
        return finished(view, row, DEDUP_TABLE[RowCase.FINISHED].rule)
    newest = s.row
    if s.case == RowCase.FINISHED and newest is not None and newest is not row and (
            newest.created_at is None or union.last_progress_at is None or newest.created_at > union.last_progress_at):
        return None  # a run of the benchmark done after the union's last trial: `done` decides
    return upload(view, union, row.id if row is not None else None, DirClass.DONE, Rule.SHARDS)


def interrupted(s: Settled) -> CellPlan | None:
    """No row, but the intent was recorded: the same submission, not a new one (RULES §12)."""
    if s.case != RowCase.NONE or not s.view.subs:
        return None
    return finish_interrupted(s.view, s.view.subs[-1], row=None)


def orphan(s: Settled) -> CellPlan | None:
    """No row, a run dir no row points at: a dir on disk is worth more than a fresh start (RULES §4)."""
    if s.case != RowCase.NONE or (facts := s.view.orphan_dir()) is None:
        return None
    return from_dir(s.view, facts, row=None, why="orphan run dir (no row points at it)")


def fresh_start(s: Settled) -> CellPlan | None:
    """No row, nothing on disk; or a Finished row whose metrics were cleared: a new attempt."""
    if s.case not in (RowCase.NONE, RowCase.METRICS_CLEARED):
        return None
    return s.view.result(Phase.PENDING, [s.view.submit(s.view.next_attempt(), s.dedup.reason)], s.dedup.reason,
                         s.dedup.rule)


def done(s: Settled) -> CellPlan | None:
    """A Finished row with metrics: done (the upload rules check its run dir and its read-back)."""
    if s.case != RowCase.FINISHED or s.row is None:
        return None
    return finished(s.view, s.row, s.dedup.rule)


def unrecognised(s: Settled) -> CellPlan | None:
    """A job_status we cannot read is not evidence that nothing runs: a human decides."""
    if s.case != RowCase.UNRECOGNISED or s.row is None:
        return None
    reason = (f"row {s.row.id} has job_status {s.row.job_status!r}, which the controller does not read: a human "
              "decides; `evalctl retry` starts a new attempt (the row is left as it is)")
    return s.view.result(Phase.FAILED, [Hold(reason=reason)], reason, s.dedup.rule)


def ours(s: Settled) -> CellPlan | None:
    """Our Pending/Started row and none of our jobs in the queue: its run dir decides (RULES §4)."""
    if s.row is None or not s.view.ours(s.row):
        return None
    return own_row_without_live_job(s.view, s.row)


def someone_elses(s: Settled) -> CellPlan | None:
    """Someone else's Started/Pending row: their job is invisible to us, so the thresholds decide."""
    row, view, dedup = s.row, s.view, s.dedup
    if row is None:
        return None
    who = row.username or "unknown user"
    if not dedup.start:
        since = row.started_at if s.case == RowCase.STARTED_FRESH else row.submitted_at
        phase = Phase.RUNNING if s.case == RowCase.STARTED_FRESH else Phase.SUBMITTED
        reason = f"{dedup.reason} (row of {who} since {when(since)})"
        return view.result(phase, [Skip(reason=reason)], reason, dedup.rule)
    return view.result(Phase.PENDING, [view.submit(view.next_attempt(), f"{dedup.reason} (row of {who})")],
                       dedup.reason, dedup.rule)


SETTLED_RULES: tuple[Callable[[Settled], CellPlan | None], ...] = (
    union_of_shards,  # a sharded cell's union of its shards' run dirs → its gate, its own row (§17)
    interrupted,    # no row, an intent without its job            → finish that submission
    orphan,         # no row, an orphan run dir                    → classify the dir (§4)
    fresh_start,    # no row / metrics cleared                     → submit
    done,           # Finished with metrics                        → done, or verify / hold (§5, §14)
    unrecognised,   # unknown job_status                           → hold
    ours,           # our Started/Pending row, no live job         → finish, or classify the dir (§4)
    someone_elses,  # another's Started/Pending row                → skip while young, submit once stale
)


def settled(view: CellView) -> CellPlan:
    row = newest(view.rows)
    case = row_case(row, stale_started=view.policy.stale_started, stale_pending=view.policy.stale_pending,
                    now=view.now)
    s = Settled(view, row, case, DEDUP_TABLE[case])
    for rule in SETTLED_RULES:
        decided = rule(s)
        if decided is not None:
            return decided
    raise AssertionError(f"no settled rule decided {case}")  # someone_elses decides every row left
