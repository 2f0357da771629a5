"""summarize(): one status for an EvalRun, from its plan and what acting on it did. Pure.

`evalctl status` and the operator's `.status` both come from here, so the CLI and Kubernetes can never
tell two stories. Conditions follow kstatus: `Ready` is always present; `Reconciling` and `Stalled` only
while True, each with a CamelCase reason and a human message.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Literal

from pydantic import Field

from controller.core.types import EvalRunRef, Frozen
from controller.core.vocabulary import CellPlan, Effect, Outcome, PassNotes, Phase, Plan, Rule

NO_NOTES = PassNotes()
ATTENTION_LIMIT = 20  # a status is read by people and stored in etcd: the full table lives in `evalctl status`
IN_FLIGHT = frozenset({Phase.PENDING, Phase.SUBMITTED, Phase.RUNNING, Phase.SETTLING, Phase.EVALUATED})
NEEDS_A_HUMAN = frozenset({Phase.FAILED, Phase.STALLED})


class Condition(Frozen):
    type: Literal["Ready", "Reconciling", "Stalled"]
    status: Literal["True", "False", "Unknown"]
    reason: str
    message: str
    observed_generation: int | None = None


class AttentionItem(Frozen):
    """A cell that needs a human (or is not observed), with the reason the planner gave."""

    model: str
    benchmark: str
    phase: Phase
    reason: str
    cluster: str | None = Field(None, description="several clusters (RULES §15): where it ran or is placed")


class GpuSummary(Frozen):
    """GPU-hours of an EvalRun: spent so far, estimated for the cells not yet run, and its budget."""

    spent: float = Field(0.0, description="actual GPU-hours of its jobs, summed over its cells")
    estimated: float = Field(0.0, description="estimated GPU-hours of its cells not yet run (known estimates)")
    not_yet_run: int = Field(0, description="cells not yet run")
    by_source: dict[str, int] = Field(default_factory=dict, description="of those, how many each source estimated "
                                                                        "(history, run dirs, unknown)")
    by_cluster: dict[str, float] = Field(default_factory=dict, description="several clusters (RULES §15): spent "
                                                                           "on each")
    max_hours: float | None = Field(None, description="spec.budget.maxGpuHours")
    held: int = Field(0, description="launches the budget held this pass")


def gpu_summary(plan: Plan) -> GpuSummary:
    spent = sum(c.gpu_hours for c in plan.cells if c.gpu_hours is not None)
    waiting = [e for c in plan.cells if (e := plan.estimate(c)) is not None]
    sources = Counter(e.source.value for e in waiting)
    by_cluster: dict[str, float] = {}
    for c in plan.cells:
        if c.gpu_hours is not None and c.cell.key in plan.clusters:
            where = plan.clusters[c.cell.key]
            by_cluster[where] = by_cluster.get(where, 0.0) + c.gpu_hours
    return GpuSummary(spent=spent, estimated=sum(e.hours for e in waiting if e.hours is not None),
                      not_yet_run=len(waiting), by_source=dict(sorted(sources.items())),
                      by_cluster=dict(sorted(by_cluster.items())),
                      max_hours=plan.gpu_budget.max_hours, held=plan.gpu_budget.held)


class RunStatus(Frozen):
    evalrun: EvalRunRef
    observed_generation: int | None = None
    total: int
    counts: dict[Phase, int] = Field(description="every phase, zeros included")
    conditions: tuple[Condition, ...]
    attention: tuple[AttentionItem, ...]
    attention_omitted: int = Field(0, description="cells that need attention beyond the list")
    failed_actions: int = 0
    held: int = Field(0, description="cells whose plan holds an action for a human, whatever their phase")
    held_unsettled: int = Field(0, description="of those, the cells neither Completed nor Failed (a launch the GPU "
                                               "budget or a failed preflight holds stays Pending)")
    suspended: bool = False
    selected: int = Field(0, description="models its modelSelector took, cells included in `total`")
    selection: str = Field("", description="what its modelSelector did in the last pass")
    gpu_hours: GpuSummary = GpuSummary()
    notifications: str = Field("", description="its webhook messages not delivered (yet), in words")
    effects: tuple[Effect, ...] = Field((), description="remedies in force: back-offs, quarantines, refires waiting")
    clusters: dict[str, int] = Field(default_factory=dict, description="several clusters (RULES §15): cluster → its "
                                                                       "cells that ran or are placed there")
    walltime: str = Field("", description="walltime auto: how its sized jobs fared against their estimate (RULES §16)")

    @property
    def done(self) -> int:
        return self.counts[Phase.COMPLETED]

    @property
    def running(self) -> int:
        return self.counts[Phase.SUBMITTED] + self.counts[Phase.RUNNING]

    @property
    def failed(self) -> int:
        return self.counts[Phase.FAILED]

    @property
    def settled(self) -> bool:
        """Nothing more will happen without a human: every cell Completed, Failed or held (a launch the GPU budget,
        a failed preflight or a suspended EvalRun holds stays Pending)."""
        return self.total == self.counts[Phase.COMPLETED] + self.counts[Phase.FAILED] + self.held_unsettled

    def condition(self, kind: str) -> Condition | None:
        return next((c for c in self.conditions if c.type == kind), None)


def summarize(plan: Plan, outcomes: Sequence[Outcome] = (), generation: int | None = None,
              notes: PassNotes = NO_NOTES) -> RunStatus:
    counts = Counter(c.phase for c in plan.cells)
    all_counts = {phase: counts.get(phase, 0) for phase in Phase}
    failed_actions = [o for o in outcomes if not o.ok]
    failures = {o.key: f"{o.action} failed: {o.message}" for o in failed_actions if o.key}
    attention = [_attention(c, failures.get(c.cell.key), plan.clusters.get(c.cell.key)) for c in plan.cells
                 if c.phase in NEEDS_A_HUMAN | {Phase.UNKNOWN} or c.cell.key in failures or c.holds
                 or c.rule == Rule.OWNED_ELSEWHERE]  # another EvalRun acts for it: this one will not, a human asks why
    held = [c for c in plan.cells if c.holds]
    return RunStatus(
        evalrun=plan.evalrun,
        observed_generation=generation,
        total=len(plan.cells),
        counts=all_counts,
        conditions=_conditions(plan, all_counts, len(failed_actions), generation),
        attention=tuple(attention[:ATTENTION_LIMIT]),
        attention_omitted=max(len(attention) - ATTENTION_LIMIT, 0),
        failed_actions=len(failed_actions),
        held=len(held),
        held_unsettled=sum(1 for c in held if c.phase not in (Phase.COMPLETED, Phase.FAILED)),
        suspended=plan.suspended,
        selected=len(notes.selections),
        selection=notes.intake,
        gpu_hours=gpu_summary(plan),
        notifications=notes.notifications,
        effects=plan.effects,
        clusters=dict(sorted(Counter(plan.clusters.values()).items())),
        walltime=plan.walltime.summary() if plan.walltime is not None else "",
    )


def _conditions(plan: Plan, counts: dict[Phase, int], failed_actions: int,
                generation: int | None) -> tuple[Condition, ...]:
    total = len(plan.cells)
    completed = counts[Phase.COMPLETED]
    in_flight = sum(counts[p] for p in IN_FLIGHT)
    held = _held_in_flight(plan)
    stuck = sum(counts[p] for p in NEEDS_A_HUMAN) + held
    unknown = counts[Phase.UNKNOWN]

    def condition(kind: Literal["Ready", "Reconciling", "Stalled"], status: bool, reason: str,
                  message: str) -> Condition:
        return Condition(type=kind, status="True" if status else "False", reason=reason, message=message,
                         observed_generation=generation)

    if completed == total:
        ready = condition("Ready", True, "AllCellsCompleted", f"{completed}/{total} cells completed and uploaded")
    elif plan.suspended:
        ready = condition("Ready", False, "Suspended", f"spec.suspend is true; {completed}/{total} completed")
    elif stuck:
        ready = condition("Ready", False, "CellsNeedAttention", f"{stuck} cell(s) need a human; "
                                                                f"{completed}/{total} completed")
    elif unknown:
        ready = condition("Ready", False, "ObservationFailed", f"{unknown} cell(s) could not be observed; "
                                                               f"{completed}/{total} completed")
    elif plan.preflight:
        ready = condition("Ready", False, "PreflightFailed", f"launches held; {completed}/{total} completed")
    else:
        ready = condition("Ready", False, "InProgress", f"{completed}/{total} completed, {in_flight} in flight")
    found = [ready]
    if (in_flight or unknown) and not plan.suspended:
        reason = "ObservationFailed" if unknown and not in_flight else "Progressing"
        found.append(condition("Reconciling", True, reason,
                               _breakdown(counts, IN_FLIGHT | {Phase.UNKNOWN}) + _health(plan)))
    if stuck or failed_actions:
        reason = "CellsNeedAttention" if stuck else "ActionsFailed"
        message = ", ".join(part for part in (_breakdown(counts, NEEDS_A_HUMAN), f"{held} held" if held else "")
                            if part) if stuck else f"{failed_actions} action(s) failed in the last pass"
        found.append(condition("Stalled", True, reason, message))
    elif plan.preflight:  # a human fixes the cluster or the spec: RULES §12
        found.append(condition("Stalled", True, "PreflightFailed", plan.preflight))
    return tuple(found)


def _held_in_flight(plan: Plan) -> int:
    """Cells held in a phase that does not say so (a launch the GPU budget, the quarantines or the spec holds stays
    Pending): they need a human as a Failed one does. Not those of a suspended EvalRun (suspend holds everything,
    and says so) nor of a failed preflight (a condition of its own)."""
    if plan.suspended:
        return 0
    return sum(1 for c in plan.cells if c.holds and c.phase not in NEEDS_A_HUMAN and c.rule != Rule.PREFLIGHT_FAILED)


def _health(plan: Plan) -> str:
    """How the running jobs are doing (RULES §8), e.g. ' (running jobs: 2 alive, 1 launching)'."""
    verdicts = Counter(c.health for c in plan.cells if c.health is not None)
    if not verdicts:
        return ""
    return " (running jobs: " + ", ".join(f"{n} {state.value}" for state, n in sorted(verdicts.items())) + ")"


def _breakdown(counts: dict[Phase, int], phases: frozenset[Phase]) -> str:
    return ", ".join(f"{counts[p]} {p.value}" for p in Phase if p in phases and counts[p])


def _attention(cell: CellPlan, failure: str | None, cluster: str | None) -> AttentionItem:
    """What a human needs to read: the action that failed, else why the planner stopped (its hold, where it holds
    one) and where."""
    return AttentionItem(model=cell.cell.model, benchmark=cell.cell.benchmark, phase=cell.phase,
                         reason=failure or cell.hold_reason or cell.reason, cluster=cluster)
