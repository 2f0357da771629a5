"""What `evalctl report` shows, built from one plan pass and the store's rows. Pure.

A score is an uploaded one: the newest Finished row with metrics matched to the cell (the planner's matching,
whoever wrote it), never a number computed from a run still going. A cell with fewer scored trials than the
EvalRun's `report.trustThreshold` is provisional. Checkpoint families are models that share a name stem once a
trailing checkpoint marker (`-step1200`, `_ckpt3`, `-epoch2`, …) is cut; each member is set against the base
(the member named exactly the stem, else the first listed).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime

from pydantic import Field

from controller.core.admission import infra_share
from controller.core.observed import Observation, ObservedRow, RunDirFacts
from controller.core.remedies import Remedy
from controller.core.trial_errors import ErrorClasses
from controller.core.types import Frozen
from controller.core.vocabulary import CellPlan, Phase, Plan

CHECKPOINT = re.compile(r"[-_.](?:step|ckpt|checkpoint|epoch|iter|global[-_]?step)[-_]?\d+$", re.IGNORECASE)


class Attempt(Frozen):
    attempt: int
    fire: int
    job_id: str | None
    cluster: str | None = Field(None, description="where the job was submitted (None: recorded before 0.6)")
    submitted_at: datetime
    refire_reason: str = Field("", description="the health rules' diagnosis that made the next attempt")


class HistoryRow(Frozen):
    """A row of the results DB matched to the cell: this EvalRun's attempts, and anyone else's."""

    row_id: str
    job_name: str | None
    username: str | None
    status: str | None
    created_at: datetime | None
    score: float | None
    stderr: float | None


class CellReport(Frozen):
    model: str
    benchmark: str
    phase: Phase
    reason: str
    score: float | None = Field(description="uploaded accuracy; None until a scored row exists")
    stderr: float | None
    n_valid: int | None = Field(description="valid trials of the uploaded score (or of the run dir, running)")
    n_scored: int | None
    n_total: int | None
    infra_share: float | None
    provisional: bool
    partial: bool = Field(False, description="uploaded under upload.partial: upload (incomplete, or over the infra "
                                             "share)")
    errors: dict[str, int] = Field(default_factory=dict, description="error class → trials, as MLflow has them")
    steps: dict[str, float] = Field(default_factory=dict, description="steps_* and tokens_* per trial")
    attempts: tuple[Attempt, ...] = ()
    history: tuple[HistoryRow, ...] = ()
    run_dir: str | None = None
    mlflow: str | None = Field(None, description="where the tracker has the cell's runs, in words")
    gpu_hours: float | None = Field(None, description="spent by this EvalRun's jobs of the cell (sacct / wall × GPUs)")


class FamilyMember(Frozen):
    model: str
    deltas: dict[str, float | None] = Field(description="benchmark → score − the base's score")


class Family(Frozen):
    stem: str
    base: str
    members: tuple[FamilyMember, ...]


class RunReport(Frozen):
    name: str
    trust_threshold: int
    models: tuple[str, ...]
    benchmarks: tuple[str, ...]
    cells: tuple[CellReport, ...]
    families: tuple[Family, ...]
    intake: str = ""


class Report(Frozen):
    runs: tuple[RunReport, ...]
    as_of: datetime | None = Field(description="the newest time in the data shown (the file holds no clock)")


def run_report(plan: Plan, observations: Sequence[Observation], errors: ErrorClasses, trust_threshold: int,
               steps: dict[str, dict[str, float]], mlflow: str | None, intake: str = "") -> RunReport:
    """`steps`: run tag → the step stats of its run dir, where they could be read; `intake`: what the
    modelSelector did."""
    cells = tuple(_cell(c, obs, errors, trust_threshold, steps, mlflow)
                  for c, obs in zip(plan.cells, observations, strict=True))
    models = tuple(dict.fromkeys(c.model for c in cells))
    return RunReport(name=str(plan.evalrun), trust_threshold=trust_threshold, models=models,
                     benchmarks=tuple(dict.fromkeys(c.benchmark for c in cells)), cells=cells,
                     families=families(models, cells), intake=intake)


def families(models: Sequence[str], cells: Sequence[CellReport]) -> tuple[Family, ...]:
    by_stem: dict[str, list[str]] = {}
    for model in models:
        by_stem.setdefault(CHECKPOINT.sub("", model), []).append(model)
    scores = {(c.model, c.benchmark): c.score for c in cells}
    benchmarks = list(dict.fromkeys(c.benchmark for c in cells))
    found = []
    for stem, members in by_stem.items():
        if len(members) < 2:
            continue
        base = stem if stem in members else members[0]
        found.append(Family(stem=stem, base=base, members=tuple(
            FamilyMember(model=m, deltas={b: _delta(scores.get((m, b)), scores.get((base, b))) for b in benchmarks})
            for m in members if m != base)))
    return tuple(found)


def as_of(reports: Sequence[RunReport]) -> datetime | None:
    times = [t for r in reports for c in r.cells for t in (*(h.created_at for h in c.history),
                                                            *(a.submitted_at for a in c.attempts)) if t is not None]
    return max(times, default=None)


def _cell(cell_plan: CellPlan, obs: Observation, errors: ErrorClasses, trust_threshold: int,
          steps: dict[str, dict[str, float]], mlflow: str | None) -> CellReport:
    history = tuple(sorted((_history(r) for r in obs.rows or ()),
                           key=lambda h: (h.created_at is not None, h.created_at), reverse=True))
    scored = next((h for h in history if h.status == "Finished" and h.score is not None), None)
    facts = cell_plan.run_dir
    admission = cell_plan.admission
    n_valid = _valid_of(obs.rows or (), scored) if scored else (admission.evidence.scored if admission else None)
    remedies = {r.run_tag: r for r in cell_plan.memory.remedies}
    return CellReport(
        model=cell_plan.cell.model, benchmark=cell_plan.cell.benchmark, phase=cell_plan.phase,
        reason=cell_plan.reason, score=scored.score if scored else None, stderr=scored.stderr if scored else None,
        n_valid=n_valid, n_scored=facts.n_scored if facts else None, n_total=facts.n_total if facts else None,
        infra_share=_infra_share(facts, cell_plan.cell.n_attempts), provisional=n_valid is None or n_valid < trust_threshold,
        partial=bool(cell_plan.partial),
        errors=errors.breakdown(facts.error_breakdown) if facts else {},
        steps=steps.get(facts.run_tag, {}) if facts else {},
        attempts=tuple(_attempts(obs, remedies)), history=history,
        run_dir=facts.path if facts else None, mlflow=mlflow, gpu_hours=cell_plan.gpu_hours)


def _attempts(obs: Observation, remedies: dict[str, Remedy]) -> list[Attempt]:
    subs = sorted(obs.submissions or (), key=lambda s: (s.attempt, s.fire), reverse=True)
    return [Attempt(attempt=s.attempt, fire=s.fire, job_id=s.job_id, cluster=s.cluster, submitted_at=s.created_at,
                    refire_reason=r.diagnosis if (r := remedies.get(s.run_tag)) else "") for s in subs]


def _history(row: ObservedRow) -> HistoryRow:
    metrics = {m.name: m.value for m in reversed(row.metrics or ())}  # the first of a name, as status shows it
    return HistoryRow(row_id=row.id, job_name=row.job_name, username=row.username, status=row.job_status,
                      created_at=row.created_at, score=metrics.get("accuracy"), stderr=metrics.get("accuracy_stderr"))


def _valid_of(rows: Sequence[ObservedRow], scored: HistoryRow) -> int | None:
    row = next(r for r in rows if r.id == scored.row_id)
    value = next((m.value for m in row.metrics or () if m.name == "n_valid_trials"), None)
    return None if value is None else int(value)


def _infra_share(facts: RunDirFacts | None, n_attempts: int) -> float | None:
    """The gate's share (RULES §14): of the distinct (task, attempt) pairs with a result, those only infra."""
    if facts is None or not facts.n_completed:
        return None
    return infra_share(facts, n_attempts)


def _delta(score: float | None, base: float | None) -> float | None:
    return None if score is None or base is None else score - base
