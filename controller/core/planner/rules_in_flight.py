"""RULES §2 and §5: a job of the cell is queued or running. The oldest live job is watched, its duplicates
cancelled; `IN_FLIGHT_RULES` is read top to bottom: a stale queue, the walltime, then the health of a running job
(`RUNNING_RULES`, RULES §8); past them all the job runs on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta

from controller.core.actions import Action, Cancel, Wait
from controller.core.admission import expected_trials
from controller.core.health import read_output, verdict
from controller.core.observed import JobState, ObservedJob, RowStatus, RunDirFacts
from controller.core.planner.rules_remedy import quarantines
from controller.core.planner.rules_running import RUNNING_RULES, Running, with_advice
from controller.core.planner.view import CellView
from controller.core.planner.words import job_order, progress
from controller.core.remedies import (
    CellMemory,
    FailureMode,
    FailureStage,
    OutputReading,
    Remedy,
    RemedyCause,
    RemedyKind,
)
from controller.core.vocabulary import CellPlan, Phase, RowUpdate, Rule
from controller.core.walltime import clock


@dataclass(slots=True)
class InFlight:
    """The live job the rules watch, the cancels of its duplicates, our row's move to Started, its run dir."""

    view: CellView
    job: ObservedJob
    actions: Sequence[Action]
    updates: Sequence[RowUpdate]
    facts: RunDirFacts | None


def queued_stale(f: InFlight) -> CellPlan | None:
    """Queued longer than stalePending: cancel it, and a new attempt takes its place."""
    view, job = f.view, f.job
    queued_since = view.submitted_at(job) if job.state == JobState.QUEUED else None
    if queued_since is None or view.now - queued_since < view.policy.stale_pending:
        return None
    actions = [*f.actions,
               Cancel(reason="stale pending: cancel the queued job first", job_id=job.job_id,
                      clears_way_for_launch=True),
               view.submit(view.next_attempt(), f"stale pending: queued since {queued_since:%Y-%m-%d %H:%M}; new "
                                                "attempt")]
    return view.result(Phase.SUBMITTED, actions, f"stale pending (job {job.job_id})", Rule.QUEUED_STALE, f.updates,
                       f.facts)


def asked(job: ObservedJob) -> str:
    """The walltime the job asked for, as the queue says (`walltime: auto` sizes it)."""
    return f", --time {clock(job.time_limit_s)}" if job.time_limit_s is not None else ""


def queued(f: InFlight) -> CellPlan | None:
    if f.job.state != JobState.QUEUED:
        return None
    actions = [*f.actions, Wait(reason=f"job {f.job.job_id} queued")]
    return f.view.result(Phase.SUBMITTED, actions, f"job pending (job {f.job.job_id} queued{asked(f.job)})",
                         Rule.QUEUED, f.updates, f.facts)


def pre_walltime(f: InFlight) -> CellPlan | None:
    """A running job about to hit its walltime: cancel now, resume later."""
    job = f.job
    if job.time_left_s is None or job.time_left_s > f.view.policy.pre_walltime.total_seconds():
        return None
    actions = [*f.actions, Cancel(job_id=job.job_id,
                                  reason=f"{job.time_left_s // 60} min of walltime left; cancel now, resume later")]
    return f.view.result(Phase.RUNNING, actions, "pre-walltime cancel", Rule.PRE_WALLTIME, f.updates, f.facts)


def health(f: InFlight) -> CellPlan | None:
    """The running job's health and progress: the first of `RUNNING_RULES` that decides (RULES §8, §5)."""
    run = running(f)
    for check in RUNNING_RULES:
        decided = check(run)
        if decided is not None:
            return with_advice(decided, run.advice)
    view, job, facts = f.view, f.job, f.facts
    learnt = run.learnt  # progress ends a stall reading
    moving = learnt if learnt.stall_reading is None else learnt.model_copy(update={"stall_reading": None})
    state, note = verdict(run.reading, facts, job.started_at, view.policy.health, view.now)
    return view.result(Phase.RUNNING, [*run.actions, Wait(reason=f"job {job.job_id} running")],
                       f"job running ({progress(facts)}{asked(job)}); {note}", Rule.IN_FLIGHT, f.updates, facts,
                       remember=moving, health=(state, note))


IN_FLIGHT_RULES: tuple[Callable[[InFlight], CellPlan | None], ...] = (
    queued_stale,  # queued past stalePending          → cancel, new attempt
    queued,        # queued                            → wait
    pre_walltime,  # walltime nearly used              → cancel, resume later
    health,        # running: RUNNING_RULES, else      → wait
)


def in_flight(view: CellView, live: Sequence[ObservedJob]) -> CellPlan:
    ordered = sorted(live, key=lambda j: (job_order(j.job_id), j.job_id)) if len(live) > 1 else live
    job = ordered[0]
    duplicates = [Cancel(reason=f"duplicate live job for one cell (keeping {job.job_id})", job_id=dup.job_id)
                  for dup in ordered[1:]] if len(ordered) > 1 else []
    f = InFlight(view, job, duplicates, bookkeeping(view, job), view.dirs.get(view.dir_tag(job)))
    for rule in IN_FLIGHT_RULES:
        decided = rule(f)
        if decided is not None:
            return decided
    raise AssertionError("no in-flight rule decided")  # health decides every running job


def bookkeeping(view: CellView, job: ObservedJob) -> list[RowUpdate]:
    """Move our Pending row to Started once its job runs."""
    if job.state != JobState.RUNNING:
        return []
    sub = view.submission_of(job)
    row = view.own_row(sub.row_id) if sub is not None else None
    if row is not None and row.job_status == RowStatus.PENDING:
        return [RowUpdate(row_id=row.id, status=RowStatus.STARTED, started_at=job.started_at or view.now)]
    return []


def running(f: InFlight) -> Running:
    """The derived view every running rule reads, with the effect of a back-off or hold match already among
    its actions: whatever rule decides, the match's back-off starts (once per matched line)."""
    view, job, facts = f.view, f.job, f.facts
    learnt = learn(view, job)
    output = learnt.output
    reading = output if output is not None and output.job_id == job.job_id else None
    readable = facts if facts is not None and not facts.unreadable else None
    catalogued = running_match(view, reading) if reading is not None else None
    advises = catalogued is not None and catalogued.remedy in (RemedyKind.BACK_OFF, RemedyKind.HOLD)
    advice = catalogued if advises else None
    actions = f.actions
    if advice is not None and reading is not None and reading.failure_at == view.now:
        actions = [*actions, *quarantines(view, Remedy(
            run_tag="", kind=advice.remedy, diagnosis=f"{advice.name}: {advice.advice}", at=view.now,
            backoff_minutes=advice.backoff_minutes, cause=RemedyCause.KNOWN_FAILURE), since=view.now)]
    expected = expected_trials(view.cell, readable)[0] if readable is not None else None
    last = readable.last_progress_at or job.started_at if readable is not None else None
    quiet = view.now - last if last is not None else timedelta(0)
    return Running(view, job, facts, readable, reading, learnt, actions, f.updates, expected or None, quiet,
                   catalogued, advice)


def running_match(view: CellView, reading: OutputReading) -> FailureMode | None:
    """The running catalog entry the job's output matched."""
    return next((mode for mode in view.policy.health.failure_modes
                 if mode.name == reading.failure and mode.when == FailureStage.RUNNING), None)


def learn(view: CellView, job: ObservedJob) -> CellMemory:
    """The memory with what this pass read of the job's output."""
    output = view.outputs.get(job.job_id)
    if output is None or not output.text:
        return view.memory
    reading = read_output(view.memory.output, output, view.policy.health.failure_modes, view.now)
    return view.memory.model_copy(update={"output": reading})
