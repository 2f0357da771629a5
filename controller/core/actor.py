"""act(): execute a Plan step by step through the adapters, and say what happened.

Submissions follow the create-pending protocol of DESIGN.md:
  1. record the intent (our submission record + a Pending row with the deterministic run tag);
  2. look for a job with that name in the queue AND accounting; if found, adopt it;
  3. only then submit, and record the job id.
A crash between any two steps is repaired by the next pass: the planner sees the intent, and the
job (if any) by its name. `EVALCTL_KILL_AT=<step>` SIGKILLs this process at a step, which is how
the tests prove it.
"""

from __future__ import annotations

import logging
import os
import signal
import uuid
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from controller.core.errors import ErrorClasses
from controller.core.metrics import run_metrics
from controller.core.planner import ANALYZED, DB_VERIFIED, TRACK_ERROR, TRACKED
from controller.core.ports import NewRow, ObservationError, Scheduler, StoreUnavailable, SubmitRequest, Tracker
from controller.core.store import Store
from controller.core.tracking import Analysis, differences, tracker_record
from controller.core.types import (
    Action,
    ActionKind,
    Cell,
    CellPlan,
    Frozen,
    Metric,
    Plan,
    RowStatus,
    RunDirFacts,
    Submission,
    TunnelLease,
    submission_name,
)

log = logging.getLogger("evalctl.act")
ROW_NAMESPACE = uuid.UUID("6f1c4b0e-9d59-4d8e-8a53-6f0d1f1f5e42")


class Outcome(Frozen):
    """One executed step, for events and the pass summary."""

    cell: str
    action: str
    ok: bool
    message: str


class JobLauncher(Frozen):
    """What a submission needs beyond the cell: where the script is and what it receives."""

    script: str
    logs_dir: str
    time_limit: str
    username: str
    env: dict[str, str]


class UploadNotVerified(RuntimeError):
    """The store did not return what was written: never report success we have not seen."""


def row_id_for(name: str) -> str:
    """Deterministic row id: repeating a half-done step writes the same row, never a second one."""
    return str(uuid.uuid5(ROW_NAMESPACE, name))


def kill_point(step: str) -> None:
    """Fault injection for the protocol tests: die here, as a crash would, if asked to."""
    if os.environ.get("EVALCTL_KILL_AT") == step:
        os.kill(os.getpid(), signal.SIGKILL)


class Actor:
    def __init__(
        self,
        store: Store,
        scheduler: Scheduler,
        launcher: JobLauncher,
        cell_env: Callable[[Cell, Action], Mapping[str, str]],
        analyze: Callable[[RunDirFacts], Analysis],
        errors: ErrorClasses,
        now: Callable[[], datetime],
        tracker: tuple[Tracker, str] | None = None,
    ):
        """`tracker`: where results are logged and read back (the tracker and its experiment), if anywhere."""
        self.results, self.state, self.scheduler = store.results, store.state, scheduler
        self.launcher, self.cell_env, self.analyze_dir = launcher, cell_env, analyze
        self.errors, self.now, self.tracker = errors, now, tracker
        self._analyses: dict[str, Analysis] = {}  # this pass's reports, by run tag, for the upload that follows

    def act(self, plan: Plan) -> list[Outcome]:
        outcomes: list[Outcome] = []
        try:  # first: a pair freed now may be handed out in this very plan
            for lease in plan.tunnel_releases:
                self.state.release_tunnel(lease.pair, lease.holder)
                log.info("pinggy pair released", extra={"pair": lease.pair, "job": lease.holder})
        except StoreUnavailable as exc:  # the plan counted on those pairs: act on nothing this pass
            return [Outcome(cell=plan.evalrun, action="release pinggy pairs", ok=False, message=str(exc))]
        for cell_plan in plan.cells:
            outcomes += self._act_cell(cell_plan)
        return outcomes

    def _act_cell(self, cell_plan: CellPlan) -> list[Outcome]:
        label = cell_plan.cell.label
        outcomes = []
        try:
            self._bookkeeping(cell_plan)
            if cell_plan.remember is not None:  # before acting: a cancel to upload as is must never look unexplained
                self.state.remember(cell_plan.cell.key, cell_plan.remember)
        except Exception as exc:  # the store failed: this cell does nothing more this pass
            log.warning("bookkeeping failed", extra={"cell": label, "error": str(exc)})
            return [Outcome(cell=label, action="bookkeeping", ok=False, message=str(exc))]
        memory = dict(cell_plan.memory if cell_plan.remember is None else cell_plan.remember)
        for action in cell_plan.actions:
            if action.kind in (ActionKind.WAIT, ActionKind.SKIP, ActionKind.HOLD):
                continue
            try:
                message = self._do_remembering(cell_plan, action, memory)
            except Exception as exc:  # one cell's failure must not stop the others
                log.warning("action failed", extra={"cell": label, "action": action.kind.value, "error": str(exc)})
                outcomes.append(Outcome(cell=label, action=action.kind.value, ok=False, message=str(exc)))
                break  # never submit after a cancel that did not happen
            log.info("action done", extra={"cell": label, "action": action.kind.value, "detail": message})
            outcomes.append(Outcome(cell=label, action=action.kind.value, ok=True, message=message))
        return outcomes

    def _do_remembering(self, cell_plan: CellPlan, action: Action, memory: dict[str, Any]) -> str:
        """Act; what the action learnt (verified, or why not) is stored even when it fails, for `explain` and
        the next pass."""
        before = dict(memory)
        try:
            return self._do(cell_plan, action, memory)
        finally:
            if memory != before:
                self.state.remember(cell_plan.cell.key, memory)

    def _bookkeeping(self, cell_plan: CellPlan) -> None:
        for update in cell_plan.row_updates:
            if update.submission_name and update.job_id:
                self._record_job_id(update.submission_name, update.job_id, update.row_id)
            if update.row_id and update.status:
                self.results.update_row(update.row_id, owner=self.launcher.username, status=update.status,
                                        started_at=update.started_at)

    def _record_job_id(self, submission_name: str, job_id: str, row_id: str | None) -> None:
        self.state.record_job_id(submission_name, job_id)
        if row_id is not None:
            self.results.update_row(row_id, owner=self.launcher.username, slurm_job_id=job_id)

    def _do(self, cell_plan: CellPlan, action: Action, memory: dict[str, Any]) -> str:
        if action.kind == ActionKind.CANCEL:
            assert action.job_id is not None
            self.scheduler.cancel(action.job_id)
            return f"cancelled job {action.job_id}: {action.reason}"
        if action.kind in (ActionKind.SUBMIT, ActionKind.RESUME):
            return self._submit(cell_plan.cell, action)
        facts = cell_plan.run_dir
        assert facts is not None, "analyze/upload/track are only planned for a run dir"
        if action.kind == ActionKind.ANALYZE:
            self._analyses[facts.run_tag] = self.analyze_dir(facts)
            memory[ANALYZED] = facts.run_tag
            return f"post-eval report written for {facts.run_tag}"
        if action.kind == ActionKind.UPLOAD:
            message = self._upload(cell_plan.cell, action, facts, memory)
            return message if self.tracker is None else f"{message}; {self._track(cell_plan.cell, facts, memory)}"
        if action.kind == ActionKind.TRACK:
            return self._track(cell_plan.cell, facts, memory)
        raise ValueError(f"unknown action {action.kind}")

    def _submit(self, cell: Cell, action: Action) -> str:
        assert action.run_tag is not None and action.fire is not None
        name = submission_name(action.run_tag, action.fire)
        row_id = action.row_id or row_id_for(action.run_tag)
        now = self.now()
        submission = Submission(name=name, run_tag=action.run_tag, evalrun=cell.evalrun, cell_key=cell.key,
                                attempt=action.attempt or 0, fire=action.fire, row_id=row_id,
                                created_at=action.intent_at or now)  # a repair keeps the recorded intent's time
        # Intent first, then its row: a crash in between leaves an intent without a row, which the next pass
        # finishes; the reverse would leave a row that looks like a run to resume. The row is written every
        # time (an existing one is left as it is), so a repair also restores a row that was never written.
        self.state.record_submission(submission)
        kill_point("after-submission")
        self.results.create_row(self._pending_row(cell, action.run_tag, row_id, now))
        kill_point("after-intent")
        if action.tunnel is not None and not self.state.take_tunnel(
                TunnelLease(pair=action.tunnel, holder=name, evalrun=cell.evalrun, leased_at=now)):
            raise RuntimeError(f"pinggy pair {action.tunnel} was just leased to another job; next pass")
        existing = self.scheduler.find(name)
        if existing is not None and submission.may_have_launched(existing):
            self._record_job_id(name, existing.job_id, row_id)
            return f"adopted job {existing.job_id} ({name}) found by its name"
        kill_point("after-find")
        request = SubmitRequest(
            name=name, comment=cell.key, script=self.launcher.script,
            args=(cell.model, cell.dataset, cell.benchmark_name, action.run_tag),
            env={**self.launcher.env, **self.cell_env(cell, action), "EVAL_DB_JOB_ID": row_id,
                 "EVAL_RESUME": "1" if action.kind == ActionKind.RESUME else "0",
                 "EVAL_RESUME_COUNT": str(action.fire - 1)},
            logs_dir=self.launcher.logs_dir, time_limit=self.launcher.time_limit,
        )
        job_id = self.scheduler.submit(request)
        kill_point("after-submit")
        self._record_job_id(name, job_id, row_id)
        return f"submitted job {job_id} ({name})"

    def _pending_row(self, cell: Cell, run_tag: str, row_id: str, now: datetime) -> NewRow:
        return NewRow(id=row_id, job_name=run_tag, username=self.launcher.username, model_name=cell.model,
                      benchmark_name=cell.benchmark_name, job_status=RowStatus.PENDING, submitted_at=now,
                      n_rep_eval=cell.n_attempts, config=row_config(cell, run_tag))

    def _upload(self, cell: Cell, action: Action, facts: RunDirFacts, memory: dict[str, Any]) -> str:
        result = run_metrics(facts, self.errors)
        accuracy = result.score
        if accuracy is None:
            raise UploadNotVerified(f"{facts.run_tag}: no score could be computed (no completed trials)")
        row_id = action.row_id
        if row_id is None:  # an orphan dir: give it a row of ours first
            row_id = row_id_for(facts.run_tag)
            self.results.create_row(self._pending_row(cell, facts.run_tag, row_id, self.now()).model_copy(
                update={"job_status": RowStatus.STARTED, "started_at": facts.started_at}))
        written = self.results.upload_result(row_id, result.upload(ended_at=facts.finished_at or self.now()),
                                             owner=self.launcher.username)
        landed = self.results.read_row(row_id)
        if landed is None or landed.job_status != RowStatus.FINISHED or not _same_metrics(landed.metrics,
                                                                                           result.metrics):
            raise UploadNotVerified(f"row {row_id} does not show the uploaded metrics")
        memory[DB_VERIFIED] = f"row {row_id} read back with accuracy={accuracy:.4f} ({facts.run_tag})"
        if not written:
            return f"accuracy={accuracy:.4f} for {facts.run_tag} was already in row {row_id} (verified, not rewritten)"
        return f"uploaded accuracy={accuracy:.4f} for {facts.run_tag} (row {row_id}, verified)"


    def _track(self, cell: Cell, facts: RunDirFacts, memory: dict[str, Any]) -> str:
        """Log to the tracker, read the run back, compare; `memory` gets the outcome, so the planner can say it."""
        if self.tracker is None:
            raise UploadNotVerified("upload.mlflow is on but this pass has no tracker configured")
        tracker, experiment = self.tracker
        result = run_metrics(facts, self.errors)
        if result.score is None:
            raise UploadNotVerified(f"{facts.run_tag}: no score could be computed (no valid trials): not logged")
        analysis = self._analyses.get(facts.run_tag) or self.analyze_dir(facts)
        record = tracker_record(cell, facts, result, analysis, self.errors)
        memory.pop(TRACKED, None)
        memory.pop(TRACK_ERROR, None)
        try:
            tracker.log(experiment, record)
            wrong = differences(record, tracker.read_back(experiment, facts.run_tag))
        except (StoreUnavailable, ObservationError) as exc:
            wrong = [str(exc)]
        if wrong:
            reason = f"MLflow: {'; '.join(wrong[:3])}" + (f" (+{len(wrong) - 3} more)" if len(wrong) > 3 else "")
            memory[TRACK_ERROR] = reason
            raise UploadNotVerified(reason)
        memory[TRACKED] = facts.run_tag
        return f"MLflow run {facts.run_tag} in {experiment!r} verified ({len(record.metrics)} metrics)"


def row_config(cell: Cell, run_tag: str) -> dict[str, Any]:
    """The `config` jsonb the old tools and dashboards read, plus what our matching needs."""
    config: dict[str, Any] = {"agent": cell.agent, "env": cell.cluster, "timeout_multiplier": cell.timeout_multiplier,
                    "run_tag": run_tag, "harbor_config": cell.harbor_config, "dataset": cell.dataset,
                    "fingerprint": cell.fingerprint}
    overrides = cell.overrides.model_dump(exclude_none=True)
    if overrides:
        config["environment"] = overrides
    return config


def _same_metrics(stored: tuple[Metric, ...] | None, written: tuple[Metric, ...]) -> bool:
    got = {m.name: m.value for m in stored or ()}
    return bool(got) and all(got.get(m.name) == m.value for m in written)

