"""`evalctl db audit`: the admission gate (RULES §14) re-applied to rows already in the results DB.

Pure. For every Finished row with metrics of a cell, the run dir its `job_name` names among the cell's observed
run dirs (ours, or a legacy one joined by its config, as `join_cells` does for plan) is judged again as the
planner would judge it for an upload that can no longer resume: `count_instant_failures` where the agent calls a
model, `can_resume=False`, the EvalRun's GatePolicy, the DB's names of the cell's model and benchmark. A row whose
run dir is not there, or cannot be read, is not auditable: counted, never a finding. Nor is the want of the job's
output: where only its vLLM requests could show the model answering, every other check is made and the row's
reason says traffic was not judged. Nothing is changed here; the marks a caller records are `RowAuditMark`s
(ports.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import timedelta

from pydantic import Field

from controller.core.admission import GATE_VERSION, Admitted, GatePolicy, Refused, admit, traffic_needs_requests
from controller.core.health import count_instant_failures
from controller.core.identity import identity_differences
from controller.core.metrics import holds_the_gates_numbers, repeated_names
from controller.core.observed import Observation, ObservedRow, RowStatus, RunDirFacts
from controller.core.records import AuditVerdict, RowAuditMark
from controller.core.shards import newest_dir, union_of
from controller.core.types import Cell, Frozen


class RowAudit(Frozen):
    """What the gate says today of one stored row."""

    row_id: str
    model: str = Field(description="the cell's model (the row joined it through the model's family)")
    benchmark: str = Field(description="the cell's benchmark name")
    username: str | None
    accuracy: float | None = Field(description="the accuracy the row stores")
    run_tag: str = Field(description="the run dir judged: the row's job_name")
    evalrun: str
    verdict: AuditVerdict
    refusal: str | None = None
    reason: str = ""
    n_scored: int | None = Field(None, description="what the gate counts as scored (admitted rows)")
    evidence: str = Field("", description="the gate's summary of what it saw")
    marked: RowAuditMark | None = Field(None, description="the row's mark in the store, if it has one")

    def mark(self) -> RowAuditMark:
        return RowAuditMark(row_id=self.row_id, gate=GATE_VERSION, verdict=self.verdict, refusal=self.refusal,
                            reason=self.reason)

    @property
    def finding(self) -> bool:
        """Not ok today, or ok today under a mark that says otherwise: a leaderboard filtering on marks would hide
        a correct number until `--apply` marks it ok."""
        return self.verdict != AuditVerdict.OK or (self.marked is not None and self.marked.verdict != AuditVerdict.OK)

    @property
    def already_marked(self) -> bool:
        """Marked before with this very verdict by this gate: a rerun after `--apply` lists nothing new."""
        return self.marked is not None and self.marked.same_verdict(self.mark())


class NotAuditable(Frozen):
    row_id: str
    why: str


class AuditReport(Frozen):
    audited: tuple[RowAudit, ...] = Field((), description="every row judged, fine ones included")
    not_auditable: tuple[NotAuditable, ...] = ()

    @property
    def findings(self) -> tuple[RowAudit, ...]:
        return tuple(a for a in self.audited if a.finding)

    @property
    def new(self) -> tuple[RowAudit, ...]:
        """Findings not marked yet with this verdict: what `--apply` writes, what makes the exit code 1."""
        return tuple(a for a in self.findings if not a.already_marked)

    @property
    def already_marked(self) -> tuple[RowAudit, ...]:
        return tuple(a for a in self.findings if a.already_marked)

    def with_marks(self, marks: Mapping[str, RowAuditMark]) -> AuditReport:
        return self.model_copy(update={"audited": tuple(a.model_copy(update={"marked": marks.get(a.row_id)})
                                                        for a in self.audited)})


def audit_cells(cells: Sequence[Cell], observations: Sequence[Observation], gate: GatePolicy,
                instant_fail: timedelta) -> AuditReport:
    """Judge every Finished row with metrics of these cells by its run dir; one entry per row id (a row two cells
    share is judged by the first cell whose observed run dirs hold its run dir)."""
    audited: dict[str, RowAudit] = {}
    unauditable: dict[str, str] = {}
    for cell, obs in zip(cells, with_unions(cells, observations), strict=True):
        for row in obs.rows or ():
            if row.id in audited or row.job_status != RowStatus.FINISHED or not row.has_metrics:
                continue
            judged = _audit_row(cell, obs, row, gate, instant_fail)
            if isinstance(judged, RowAudit):
                audited[row.id] = judged
                unauditable.pop(row.id, None)
            else:
                unauditable.setdefault(row.id, judged)
    return AuditReport(audited=tuple(audited.values()),
                       not_auditable=tuple(NotAuditable(row_id=i, why=w) for i, w in unauditable.items()))


def with_unions(cells: Sequence[Cell], observations: Sequence[Observation]) -> list[Observation]:
    """A sharded cell's observation with the union of its shards' newest run dirs (RULES §17), the run dir its row
    names; none where a shard has no dir, or one that is not its shard's run (its own gate would refuse it)."""
    found = list(observations)
    newest: dict[str, list[tuple[Cell, RunDirFacts | None]]] = {}
    for cell, obs in zip(cells, observations, strict=True):
        if cell.shard is not None:
            run = newest_dir(cell, obs.run_dirs or ())
            newest.setdefault(cell.shard.parent, []).append(
                (cell, run if run is not None and not identity_differences(cell, run) else None))
    for index, (cell, obs) in enumerate(zip(cells, observations, strict=True)):
        parts = [(shard, run) for shard, run in newest.get(cell.key, []) if run is not None]
        if cell.shards == 1 or len(parts) < cell.shards or obs.run_dirs is None:
            continue
        union = union_of(cell, parts, obs.submissions or ())
        if not isinstance(union, str):
            found[index] = obs.model_copy(update={"run_dirs": (*obs.run_dirs, union)})
    return found


def merge(reports: Iterable[AuditReport]) -> AuditReport:
    """Several EvalRuns' reports as one: a row judged by any of them is judged once; not auditable only when none
    of them could judge it."""
    audited: dict[str, RowAudit] = {}
    unauditable: dict[str, NotAuditable] = {}
    for report in reports:
        for entry in report.audited:
            audited.setdefault(entry.row_id, entry)
        for missing in report.not_auditable:
            unauditable.setdefault(missing.row_id, missing)
    return AuditReport(audited=tuple(audited.values()),
                       not_auditable=tuple(u for i, u in unauditable.items() if i not in audited))


SCORE_DIFFERS = "ScoreDiffers"  # the refusal of a row whose run the gate admits, at another number
TRAFFIC_NOT_JUDGED = "traffic not judged: only its job's output (vLLM requests, not read here) shows the model " \
                     "answering"


def _audit_row(cell: Cell, obs: Observation, row: ObservedRow, gate: GatePolicy,
               instant_fail: timedelta) -> RowAudit | str:
    """The row's verdict, or why it cannot be judged."""
    if obs.run_dirs is None:
        return f"run dirs not observed: {obs.unknown_reason or 'the jobs dir could not be read'}"
    if not row.job_name:
        return "the row names no run dir (job_name is empty)"
    facts = next((d for d in obs.run_dirs if d.run_tag == row.job_name), None)
    if facts is None:
        return f"run dir {row.job_name} is not among the cell's run dirs (moved, deleted, or another cluster's)"
    if facts.unreadable:
        return f"run dir {row.job_name} cannot be read: {facts.unreadable}"
    if cell.calls_model:
        facts = count_instant_failures(facts, instant_fail)
    unjudged = cell.calls_model and traffic_needs_requests(cell, facts)  # its job's output is not read here
    admission = admit(cell, facts, gate, requests=None, can_resume=False, model_names=obs.model_names,
                      benchmark_names=obs.benchmark_names, judge_traffic=not unjudged)
    traffic = TRAFFIC_NOT_JUDGED if unjudged else ""

    def judged(verdict: AuditVerdict, *, refusal: str | None = None, reason: str = "",
               n_scored: int | None = None) -> RowAudit:
        return RowAudit(row_id=row.id, model=cell.model, benchmark=cell.benchmark_name, username=row.username,
                        accuracy=_accuracy(row), run_tag=facts.run_tag, evalrun=str(cell.evalrun), verdict=verdict,
                        refusal=refusal, reason=reason, n_scored=n_scored, evidence=admission.evidence.summary())

    if isinstance(admission, Refused):
        return judged(AuditVerdict.REFUSED, refusal=admission.refusal.value, reason=admission.reason)
    assert isinstance(admission, Admitted)
    if not holds_the_gates_numbers(row.metrics, admission):  # admitted, but not at the number the row holds
        repeated = repeated_names(row.metrics)
        return judged(AuditVerdict.REFUSED, refusal=SCORE_DIFFERS, n_scored=admission.n_scored,
                      reason=f"the gate gives {admission.score:.4f} (n={admission.n_scored}) where the row holds "
                             f"{_accuracy(row)}" + (f"; the row names {', '.join(repeated)} more than once"
                                                    if repeated else ""))
    small = f"{admission.n_scored} scored trials, fewer than report.trustThreshold {gate.trust_threshold}" \
        if admission.provisional else ""
    if admission.partial:  # a number of part of the run, whatever its stats say: said before how small it is
        return judged(AuditVerdict.PARTIAL, reason=_joined(f"partial: {admission.partial_why}", small, traffic),
                      n_scored=admission.n_scored)
    if admission.provisional:
        return judged(AuditVerdict.PROVISIONAL, reason=_joined(small, traffic), n_scored=admission.n_scored)
    return judged(AuditVerdict.OK, reason=traffic, n_scored=admission.n_scored)


def _joined(*parts: str) -> str:
    return "; ".join(part for part in parts if part)


def _accuracy(row: ObservedRow) -> float | None:
    """The first accuracy: what the row shows (`repeated_names`)."""
    return next((m.value for m in row.metrics or () if m.name == "accuracy"), None)
