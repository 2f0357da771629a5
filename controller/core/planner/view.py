"""The derived view of one cell every rule reads, built once per cell, and the plan a rule returns."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from controller.core.actions import Action, Submit
from controller.core.admission import Admission, Admitted, distinct_trials, expected_trials
from controller.core.gpu_hours import cell_hours, job_of
from controller.core.metrics import same_number
from controller.core.observed import JobOutput, Observation, ObservedJob, ObservedRow, RunDirFacts, Submission
from controller.core.planner.policy import Policy
from controller.core.planner.words import newest_job
from controller.core.remedies import CellMemory, Quarantined
from controller.core.resume import DirClass, classify
from controller.core.retry import RetryRequest, pending_request, retried_from
from controller.core.trusted import every_field, trusted
from controller.core.types import Cell, run_tag_of, stem_of
from controller.core.vocabulary import CellPlan, HealthState, Phase, RowUpdate, Rule

_NO_OUTPUTS: Mapping[str, JobOutput] = {}


@dataclass(slots=True)
class CellView:
    """One cell's observation as the rules read it: its submissions in order, the rows it may act on, its run dirs
    by tag, its jobs (and those queued or running), its memory; and the bookkeeping every plan of it carries
    (adoptions, GPU-hours).

    Read-only by convention, as are the other views of the rules (`Settled`, `DirCase`, `InFlight`, `Running`,
    `UploadCase`): a frozen dataclass would cost 3 µs more per cell, a third of the cheapest cell's plan. The views
    built for every cell are made with positional arguments, named as their fields: on Python 3.11 a keyword
    argument costs more than a field read, and eighteen of CellView's were 7 % of a finished cell's plan."""

    cell: Cell
    policy: Policy
    now: datetime
    subs: list[Submission]  # by (attempt, fire, created_at)
    all_rows: tuple[ObservedRow, ...]
    rows: tuple[ObservedRow, ...]  # the rows that decide (with forceEval: only our own)
    dirs: dict[str, RunDirFacts]
    jobs: tuple[ObservedJob, ...]
    live: list[ObservedJob]  # its jobs queued or running
    memory: CellMemory
    outputs: Mapping[str, JobOutput]
    leased: Mapping[str, str]
    quarantined: Sequence[Quarantined]
    model_names: frozenset[str]
    benchmark_names: frozenset[str]
    adoptions: tuple[RowUpdate, ...]
    gpu_hours: float | None
    retry: RetryRequest | None  # a human's request to release a hold, not consumed yet (RULES §13)
    retried_from: int  # the attempt the last consumed retry started: refires count from it

    # ------------------------------------------------------------------ reading the observation

    def dir_tag(self, job: ObservedJob) -> str:
        tag = run_tag_of(job.name)
        if tag not in self.dirs and tag.startswith("ev_") and tag.removeprefix("ev_") in self.dirs:
            return tag.removeprefix("ev_")
        return tag

    def jobs_of_dir(self, run_tag: str) -> list[ObservedJob]:
        return [j for j in self.jobs if self.dir_tag(j) == run_tag]

    def last_job(self, run_tag: str) -> ObservedJob | None:
        return newest_job(self.jobs_of_dir(run_tag))

    def jobs_named(self, name: str) -> list[ObservedJob]:
        return [j for j in self.jobs if j.name == name]

    def fires(self, facts: RunDirFacts) -> int:
        """Jobs that ran on the dir: what its meta.env says, or what we launched, whichever is more."""
        launched = sum(1 for s in self.subs if s.run_tag == facts.run_tag)
        return max(facts.fires, launched)

    def classify(self, facts: RunDirFacts, job: ObservedJob | None) -> DirClass:
        return classify(
            facts,
            expected=expected_trials(self.cell, facts)[0],
            seen=distinct_trials(facts, self.cell.n_attempts),
            job_active=job is not None and job.state.active,
            job_ended_at=job.ended_at if job is not None else None,
            fires=self.fires(facts),
            max_total_fires=self.policy.max_total_fires,
            infra_error_threshold=self.policy.infra_error_threshold,
            settle=self.policy.settle,
            now=self.now,
        )

    def orphan_dir(self) -> RunDirFacts | None:
        """The newest run dir of the cell that no row (of anyone) points at."""
        pointed = {r.job_name for r in self.all_rows if r.job_name}
        orphans = [d for tag, d in self.dirs.items() if tag not in pointed]
        return max(orphans, key=lambda d: (d.started_at or d.last_progress_at or datetime.min.replace(
            tzinfo=self.now.tzinfo), d.run_tag), default=None)

    def ours(self, row: ObservedRow) -> bool:
        """A row this cell may resume, adopt or upload to: of our username AND of this cell (RULES §2) — one of its
        submissions wrote it, or it names one of its run tags. Every tenant on a ClusterEvalCluster has the same
        username, and the cell key (so the run tag) carries the namespace: a row of another cell, however alike, is
        someone else's evidence, never ours to act on. A row under a tag of no EvalRun (the old listener's) is
        adopted only by an EvalRun outside any namespace (in the operator two tenants could both adopt it), and never
        by a shard (its dirs ran the whole dataset)."""
        if row.username != self.policy.username:
            return False
        stem = stem_of(row.job_name or "")
        return (self.wrote(row) or stem in self.cell.tag_stems
                or (stem is None and self.cell.evalrun.namespace is None and self.cell.shard is None))

    def wrote(self, row: ObservedRow) -> bool:
        """One of the cell's submissions wrote the row."""
        return bool(row.id) and any(s.row_id == row.id for s in self.subs)

    def own_row(self, row_id: str | None) -> ObservedRow | None:
        if row_id:
            for row in self.all_rows:
                if row.id == row_id:
                    return row
        return None

    def submission_of(self, job: ObservedJob) -> Submission | None:
        """The intent of the job's name (the first, in order)."""
        for sub in self.subs:
            if sub.name == job.name:
                return sub
        return None

    def submitted_at(self, job: ObservedJob) -> datetime | None:
        sub = self.submission_of(job)
        return sub.created_at if sub is not None else job.submitted_at

    def next_attempt(self) -> int:
        return next_attempt(self.cell, self.subs, self.dirs, self.all_rows)

    def attempt_of(self, run_tag: str) -> int:
        return self.cell.attempt_of(run_tag) or next((s.attempt for s in self.subs if s.run_tag == run_tag), 0)

    def attempt_hours(self, run_tag: str) -> float | None:
        return cell_hours(self.subs, self.jobs, run_tag=run_tag)

    def submit(self, attempt: int, reason: str) -> Submit:
        return Submit(reason=reason, run_tag=self.cell.run_tag(attempt), attempt=attempt)

    # ------------------------------------------------------------------ the plan a rule returns

    def result(
        self,
        phase: Phase,
        actions: Sequence[Action],
        reason: str,
        rule: Rule,
        updates: Sequence[RowUpdate] = (),
        facts: RunDirFacts | None = None,
        score: float | None = None,
        remember: CellMemory | None = None,
        health: tuple[HealthState, str] | None = None,
        admission: Admission | None = None,
        n_scored: int | None = None,
    ) -> CellPlan:
        """`remember`: the memory after this pass, written only if it differs from what was observed. `score`: only
        what an uploaded row holds, never one computed from a run dir (a running cell has no score)."""
        state, note = health if health is not None else (None, "")
        if remember is not None and (remember is self.memory or remember == self.memory):
            remember = None
        n_scored, provisional, partial, evidence = self.trust(admission, facts, score, n_scored)
        return built_plan({"cell": self.cell, "phase": phase, "actions": tuple(actions), "reason": reason,
                           "rule": rule,
                           "row_updates": (*self.adoptions, *updates) if self.adoptions else tuple(updates),
                           "run_dir": facts, "score": score,
                           "eta_at": self.now if phase == Phase.RUNNING and facts is not None else None,
                           "memory": self.memory, "remember": remember, "health": state, "health_note": note,
                           "gpu_hours": self.gpu_hours, "admission": admission, "n_scored": n_scored,
                           "provisional": provisional, "partial": partial, "evidence": evidence,
                           "refire_due": None, "retry": None})

    def trust(self, admission: Admission | None, facts: RunDirFacts | None, score: float | None,
              n_scored: int | None) -> tuple[int | None, bool | None, bool | None, str]:
        """How far the cell's score can be trusted (RULES §14), as (n_scored, provisional, partial, evidence): the
        gate's verdict of this pass, else what it said of the upload that holds the score (the controller state),
        else the row's own n_valid_trials. The record speaks only for the number it admitted: a row another writer
        changed after our upload read back shows another score, which its own n_valid_trials describes."""
        if admission is None:
            record = self.memory.admitted if score is not None and facts is not None else None
            if record is not None and facts is not None and record.run_tag == facts.run_tag \
                    and same_number(record.score, score):
                return record.n_scored, record.provisional, record.partial, record.evidence
        elif isinstance(admission, Admitted):
            return admission.n_scored, admission.provisional, admission.partial, admission.summary()
        else:
            return n_scored, self.provisional(n_scored), None, admission.summary()
        return n_scored, self.provisional(n_scored), None, ""

    def provisional(self, n_scored: int | None) -> bool | None:
        return None if n_scored is None else n_scored < self.policy.admission.trust_threshold


_PLAN_FIELDS = every_field(CellPlan)


def built_plan(values: dict[str, Any]) -> CellPlan:
    """`CellPlan(**values)`, every field given, without validating again what is valid already (`trusted`): every
    value is a model the planner built or observed, an enum, a str, a bool or a number of its field's type; an int
    in a float field is made a float as validation would. A field left out would be missing from the plan, not
    defaulted: tests/core/conftest.py fails any plan that lacks one."""
    if type(values["score"]) is int:
        values["score"] = float(values["score"])
    if type(values["gpu_hours"]) is int:
        values["gpu_hours"] = float(values["gpu_hours"])
    return trusted(CellPlan, values, _PLAN_FIELDS)


def spent(cell: Cell, obs: Observation) -> float | None:
    """The actual GPU-hours of the EvalRun's own jobs of the cell (another EvalRun's are its own)."""
    subs, jobs = obs.submissions or (), obs.jobs or ()
    if hours_unknown(subs, jobs):
        return None  # what cell_hours answers for any subset of them: nothing is known
    return cell_hours([s for s in subs if cell.evalrun.known_as(s.evalrun)], jobs)


def hours_unknown(subs: Sequence[Submission], jobs: Sequence[ObservedJob]) -> bool:
    """No job or submission of the cell says its GPU-hours (a scheduler that does not say): no look-ups to make."""
    for job in jobs:
        if job.gpu_hours is not None:
            return False
    for sub in subs:
        if sub.gpu_hours is not None:
            return False
    return True


def cell_view(cell: Cell, obs: Observation, policy: Policy, now: datetime,
              leased: Mapping[str, str] | None = None, quarantined: Sequence[Quarantined] = ()) -> CellView:
    """The view of a cell whose every source was read."""
    all_rows, submissions, jobs, run_dirs, retries = obs.rows, obs.submissions, obs.jobs, obs.run_dirs, obs.retries
    assert all_rows is not None and submissions is not None and jobs is not None and run_dirs is not None
    subs = in_order(submissions)
    rows = all_rows
    dirs = {d.run_tag: d for d in run_dirs}
    if policy.force_eval:  # only what this EvalRun's own submissions made (another's, of the same cell, is not)
        own = [s for s in subs if cell.evalrun.known_as(s.evalrun)]
        unions = {tag for tag, d in dirs.items() if d.shards}  # of this EvalRun's own shards, and their row
        own_row_ids = {s.row_id for s in own if s.row_id}
        rows = tuple(r for r in all_rows if r.id in own_row_ids or r.job_name in unions)

        own_tags = {s.run_tag for s in own} | unions
        dirs = {tag: d for tag, d in dirs.items() if tag in own_tags}
    memory, model_names, benchmark_names = obs.memory, obs.model_names, obs.benchmark_names
    outputs = {output.job_id: output for output in obs.outputs} if obs.outputs else _NO_OUTPUTS
    retry = pending_request(retries) if retries else None
    live = [job for job in jobs if job.state.active]
    return CellView(cell, policy, now, subs, all_rows, rows, dirs, jobs, live, memory, outputs, leased or {}, quarantined,
                    model_names, benchmark_names, adoptions(subs, jobs, live), spent(cell, obs), retry,
                    retried_from(retries) if retries else 0)


def next_attempt(cell: Cell, subs: Sequence[Submission], run_tags: Iterable[str], rows: Sequence[ObservedRow]) -> int:
    """One past every attempt the cell's submissions, run dirs and rows name."""
    seen = [s.attempt for s in subs]
    seen += [a for a in (cell.attempt_of(t) for t in run_tags) if a is not None]
    seen += [a for a in (cell.attempt_of(r.job_name or "") for r in rows) if a is not None]
    return max(seen, default=0) + 1


def in_order(subs: Sequence[Submission]) -> list[Submission]:
    """A cell's submissions by (attempt, fire, created_at): the last is its newest intent."""
    return sorted(subs, key=lambda s: (s.attempt, s.fire, s.created_at)) if len(subs) > 1 else list(subs)


def adoptions(subs: Sequence[Submission], jobs: Sequence[ObservedJob], live: Sequence[ObservedJob]
              ) -> tuple[RowUpdate, ...]:
    """What every plan of the cell records: a job found by the name of a submission that has none recorded (a crash
    after sbatch); and our submissions whose job has ended with GPU-hours not recorded yet: recorded now, so they
    outlive the scheduler's accounting window (sacct looks back 14 days)."""
    if not jobs:
        return ()
    found: list[RowUpdate] = []
    for sub in subs:
        if sub.job_id is None and (job := newest_job(
                [j for j in jobs if j.name == sub.name and sub.may_have_launched(j)])) is not None:
            found.append(RowUpdate(submission_name=sub.name, job_id=job.job_id, row_id=sub.row_id))
    if len(live) < len(jobs):  # else no look-ups: nothing ended to record
        found.extend(update for sub in subs if (update := job_end(sub, jobs)) is not None)
    return tuple(found)


def job_end(sub: Submission, jobs: Sequence[ObservedJob]) -> RowUpdate | None:
    """What a submission's ended job used, not recorded yet: its GPU-hours, and how long it ran (an attempt's wall
    time, and what `walltime: auto` learns from)."""
    wants_hours, wants_elapsed = sub.gpu_hours is None, sub.elapsed_hours is None
    job = job_of(sub, jobs) if wants_hours or wants_elapsed else None
    if job is None or job.state.active:
        return None
    hours = job.gpu_hours if wants_hours else None
    ran = job.ended_at - job.started_at if wants_elapsed and job.started_at and job.ended_at else None
    elapsed = ran.total_seconds() / 3600 if ran is not None else None
    if hours is None and elapsed is None:
        return None
    return RowUpdate(submission_name=sub.name, gpu_hours=hours, elapsed_hours=elapsed)
