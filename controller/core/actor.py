"""act(): execute a Plan step by step through the adapters, and say what happened.

Submissions follow the create-pending protocol (RULES §12):
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
from collections.abc import Callable
from datetime import datetime
from typing import Any, assert_never

from pydantic import Field

from controller.core.actions import Analyze, Cancel, Launch, Mutation, Quarantine, Resume, Step, Submit, Track, Upload
from controller.core.admission import Admitted, admission_record
from controller.core.job_env import JobSecrets, JobSettings, job_environment
from controller.core.metrics import RunMetrics, run_metrics, same_metrics
from controller.core.observed import RowStatus, RunDirFacts, Submission, TunnelLease
from controller.core.ports import ObservationError, Scheduler, StoreUnavailable, SubmitRequest, Tracker
from controller.core.records import NewRow
from controller.core.store import Store
from controller.core.tracking import Analysis, differences, tracker_record
from controller.core.trial_errors import ErrorClasses
from controller.core.types import Cell, Frozen
from controller.core.vocabulary import CellPlan, Outcome, Plan

log = logging.getLogger("evalctl.act")
ROW_NAMESPACE = uuid.UUID("6f1c4b0e-9d59-4d8e-8a53-6f0d1f1f5e42")


class JobLauncher(Frozen):
    """What a submission needs beyond the cell: the cluster it goes to, where the script is and what every job
    receives."""

    cluster: str = Field(description="the ClusterRef (as text) its jobs are submitted to, recorded on each submission")
    script: str
    logs_dir: str
    settings: JobSettings

    @property
    def username(self) -> str:
        return self.settings.username


class UploadNotVerified(RuntimeError):
    """The store did not return what was written: never report success we have not seen."""


def row_id_for(name: str) -> str:
    """Deterministic row id: repeating a half-done step writes the same row, never a second one."""
    return str(uuid.uuid5(ROW_NAMESPACE, name))


def kill_point(step: str) -> None:
    """Fault injection for the protocol tests: die here, as a crash would, if asked to."""
    if os.environ.get("EVALCTL_KILL_AT") == step:
        os.kill(os.getpid(), signal.SIGKILL)


class _CellWork:
    """One cell's actions in one pass: its memory as it stands, and what they computed once for the others."""

    def __init__(self, cell_plan: CellPlan, errors: ErrorClasses):
        self.cell = cell_plan.cell
        self.memory = cell_plan.memory if cell_plan.remember is None else cell_plan.remember
        self.analyses: dict[str, Analysis] = {}  # the report of this pass, for the tracker, by run tag
        self._errors = errors
        self._metrics: dict[str, RunMetrics] = {}

    def metrics(self, facts: RunDirFacts, admitted: Admitted) -> RunMetrics:
        """What the report, the upload and the tracker all say: the admission gate's numbers, once per run dir."""
        if facts.run_tag not in self._metrics:
            self._metrics[facts.run_tag] = run_metrics(admitted, facts, self._errors)
        return self._metrics[facts.run_tag]

    def learnt(self, **update: Any) -> None:
        self.memory = self.memory.model_copy(update=update)


class Actor:
    def __init__(
        self,
        store: Store,
        scheduler: Scheduler,
        launcher: JobLauncher,
        job_secrets: Callable[[Launch], JobSecrets],
        analyze: Callable[[RunDirFacts, RunMetrics], Analysis],
        errors: ErrorClasses,
        now: Callable[[], datetime],
        tracker: tuple[Tracker, str] | None = None,
    ):
        """`job_secrets`: read at submit time; `tracker`: where results are logged and read back (the tracker
        and its experiment), if anywhere."""
        self.results, self.state, self.scheduler = store.results, store.state, scheduler
        self.launcher, self.job_secrets, self.analyze_dir = launcher, job_secrets, analyze
        self.errors, self.now, self.tracker = errors, now, tracker

    def act(self, plan: Plan) -> list[Outcome]:
        outcomes: list[Outcome] = []
        try:  # first: a pair freed now may be handed out in this very plan
            for lease in plan.tunnel_releases:
                self.state.release_tunnel(lease.pair, lease.holder)
                log.info("pinggy pair released", extra={"pair": lease.pair, "job": lease.holder})
        except StoreUnavailable as exc:  # the plan counted on those pairs: act on nothing this pass
            return [Outcome(cell=str(plan.evalrun), action=Step.RELEASE_TUNNELS, ok=False, message=str(exc))]
        for cell_plan in plan.cells:
            outcomes += self._act_cell(cell_plan)
        return outcomes

    def _act_cell(self, cell_plan: CellPlan) -> list[Outcome]:
        label, key = cell_plan.cell.label, cell_plan.cell.key
        outcomes = []
        try:
            self._bookkeeping(cell_plan)
            if cell_plan.remember is not None:  # before acting: a cancel to upload as is must never look unexplained
                self.state.remember(cell_plan.cell.key, cell_plan.remember)
                kill_point("after-remember")
        except Exception as exc:  # the store failed: this cell does nothing more this pass
            log.warning("bookkeeping failed", extra={"cell": label, "error": str(exc)})
            return [Outcome(cell=label, key=key, action=Step.BOOKKEEPING, ok=False, message=str(exc))]
        work = _CellWork(cell_plan, self.errors)
        for action in cell_plan.actions:
            if not isinstance(action, Mutation):  # wait, skip, hold: nothing to do
                continue
            try:
                message = self._do_remembering(action, work)
            except Exception as exc:  # one cell's failure must not stop the others
                log.warning("action failed", extra={"cell": label, "action": action.step.value, "error": str(exc)})
                outcomes.append(Outcome(cell=label, key=key, action=action.step, ok=False, message=str(exc)))
                break  # never submit after a cancel that did not happen
            log.info("action done", extra={"cell": label, "action": action.step.value, "detail": message})
            outcomes.append(Outcome(cell=label, key=key, action=action.step, ok=True, message=message))
        return outcomes

    def _do_remembering(self, action: Mutation, work: _CellWork) -> str:
        """Act; what the action learnt (verified, or why not) is stored even when it fails, for `explain` and
        the next pass."""
        before = work.memory
        try:
            return self._do(action, work)
        finally:
            if work.memory != before:
                self.state.remember(work.cell.key, work.memory)

    def _do(self, action: Mutation, work: _CellWork) -> str:
        match action:
            case Cancel(job_id=job_id):
                self.scheduler.cancel(job_id)
                kill_point("after-cancel")
                return f"cancelled job {job_id}: {action.reason}"
            case Submit() | Resume():
                return self._launch(work.cell, action)
            case Analyze(facts=facts, admitted=admitted):
                work.analyses[facts.run_tag] = self.analyze_dir(facts, work.metrics(facts, admitted))
                work.learnt(analyzed_run_tag=facts.run_tag)
                for run_tag in (facts.run_tag, *facts.shard_run_tags()):  # a union: its shards' attempts
                    self.state.finish_attempt(run_tag)  # its GPU-hours are history from now on
                return f"post-eval report written for {facts.run_tag}"
            case Upload(facts=facts, row_id=row_id, is_overlong=is_overlong, gpu_hours=gpu_hours, admitted=admitted):
                message = self._upload(work, facts, admitted, row_id, is_overlong, gpu_hours)
                return message if self.tracker is None else \
                    f"{message}; {self._track(work, facts, admitted, gpu_hours)}"
            case Track(facts=facts, gpu_hours=gpu_hours, admitted=admitted):
                return self._track(work, facts, admitted, gpu_hours)
            case Quarantine(subject=subject, scope=scope, name=name, ttl_s=ttl_s, owner=owner):
                if not self.state.quarantine(subject, scope, name, action.reason, ttl_s, owner):
                    return f"{subject.value} {name} not quarantined again: a human released it ({action.reason})"
                return f"{subject.value} {name} quarantined for {ttl_s / 3600:g} h: {action.reason}"
            case _:
                assert_never(action)

    def _bookkeeping(self, cell_plan: CellPlan) -> None:
        for update in cell_plan.row_updates:
            if update.submission_name and (update.gpu_hours is not None or update.elapsed_hours is not None):
                self.state.record_job_end(update.submission_name, update.gpu_hours, update.elapsed_hours)
            if update.submission_name and update.job_id:
                self._record_job_id(update.submission_name, update.job_id, update.row_id)
            if update.row_id and update.status:
                self.results.update_row(update.row_id, owner=self.launcher.username, status=update.status,
                                        started_at=update.started_at)

    def _record_job_id(self, submission_name: str, job_id: str, row_id: str | None) -> None:
        self.state.record_job_id(submission_name, job_id)
        if row_id is not None:
            self.results.update_row(row_id, owner=self.launcher.username, slurm_job_id=job_id)

    def _launch(self, cell: Cell, launch: Launch) -> str:
        name = launch.submission_name
        row_id = launch.row_id or row_id_for(launch.run_tag)
        now = self.now()
        submission = Submission(name=name, run_tag=launch.run_tag, evalrun=cell.evalrun, cell_key=cell.key,
                                attempt=launch.attempt, fire=launch.fire, row_id=row_id,
                                created_at=launch.intent_at or now,  # a repair keeps the recorded intent's time
                                model=cell.model, benchmark=cell.benchmark_name, cluster=self.launcher.cluster,
                                estimated_hours=launch.estimated_hours, trials=cell.trials,
                                concurrency=cell.n_concurrent)
        # Intent first, then its row: a crash in between leaves an intent without a row, which the next pass
        # finishes; the reverse would leave a row that looks like a run to resume. The row is written every
        # time (an existing one is left as it is), so a repair also restores a row that was never written.
        self.state.record_submission(submission)
        kill_point("after-submission")
        self.results.create_row(self._pending_row(cell, launch.run_tag, row_id, now))
        kill_point("after-intent")
        self._own_row(row_id, launch.run_tag)
        if launch.tunnel is not None and not self.state.take_tunnel(
                TunnelLease(pair=launch.tunnel, holder=name, evalrun=cell.evalrun, leased_at=now)):
            raise RuntimeError(f"pinggy pair {launch.tunnel} was just leased to another job; next pass")
        existing = self.scheduler.find(name)
        if existing is not None and submission.may_have_launched(existing):
            self._record_job_id(name, existing.job_id, row_id)
            return f"adopted job {existing.job_id} ({name}) found by its name"
        kill_point("after-find")
        request = SubmitRequest(
            name=name, comment=cell.key, script=self.launcher.script,
            args=(cell.model, cell.dataset, cell.benchmark_name, launch.run_tag),
            env=job_environment(cell, launch, row_id, self.launcher.settings, self.job_secrets(launch)),
            logs_dir=self.launcher.logs_dir, time_limit=launch.time_limit or cell.time_limit,
            exclude_nodes=launch.exclude_nodes,
        )
        job_id = self.scheduler.submit(request)
        kill_point("after-submit")
        self._record_job_id(name, job_id, row_id)
        return f"submitted job {job_id} ({name})"

    def _own_row(self, row_id: str, run_tag: str) -> None:
        """The intent's row is ours (create_row leaves an existing row as it is): a job never runs on, nor reports
        into, another user's row of the same id (run tags name no user)."""
        row = self.results.read_row(row_id)
        if row is None or row.username != self.launcher.username:
            held = "is missing" if row is None else f"belongs to {row.username}"
            raise RuntimeError(f"row {row_id} of {run_tag} {held} (another user runs this cell against the same "
                               "results DB?): not submitting")

    def _pending_row(self, cell: Cell, run_tag: str, row_id: str, now: datetime) -> NewRow:
        return NewRow(id=row_id, job_name=run_tag, username=self.launcher.username, model_name=cell.model,
                      benchmark_name=cell.benchmark_name, job_status=RowStatus.PENDING, submitted_at=now,
                      n_rep_eval=cell.n_attempts, config=row_config(cell, run_tag))

    def _upload(self, work: _CellWork, facts: RunDirFacts, admitted: Admitted, row_id: str | None, is_overlong: bool,
                gpu_hours: float | None) -> str:
        result = work.metrics(facts, admitted)
        accuracy = result.score
        assert accuracy is not None  # admitted: the gate refuses a run with nothing scored
        if row_id is None:  # an orphan dir: give it a row of ours first
            row_id = row_id_for(facts.run_tag)
            self.results.create_row(self._pending_row(work.cell, facts.run_tag, row_id, self.now()).model_copy(
                update={"job_status": RowStatus.STARTED, "started_at": facts.started_at}))
        upload = result.upload(ended_at=facts.finished_at or self.now(), is_overlong=is_overlong,
                               env=work.cell.cluster)
        if gpu_hours is not None:
            upload = upload.model_copy(update={"stats": {**upload.stats, "gpu_hours": gpu_hours}})
        written = self.results.upload_result(row_id, upload, owner=self.launcher.username)
        landed = self.results.read_row(row_id)
        if landed is None or landed.job_status != RowStatus.FINISHED or not same_metrics(landed.metrics,
                                                                                          result.metrics):
            # remembered: the row may read Finished, but not with our numbers (rules_upload.unverified)
            again = work.memory.db_unverified == facts.run_tag
            work.learnt(db_unverified=facts.run_tag,
                        db_unverified_uploads=work.memory.db_unverified_uploads + 1 if again else 1)
            raise UploadNotVerified(f"row {row_id} does not show the uploaded metrics")
        work.learnt(db_unverified=None, db_unverified_uploads=0)
        if bool(landed.is_overlong) != is_overlong:  # the numbers landed; a Finished row's flag is only shown
            raise UploadNotVerified(f"row {row_id} reads is_overlong={landed.is_overlong}, not {is_overlong}")
        what = f"accuracy={accuracy:.4f}" + (" is_overlong=true" if is_overlong else "") + (
            " provisional=true" if result.stats.provisional else "") + (" partial=true" if result.stats.partial else "")
        work.learnt(db_verified=f"row {row_id} read back with {what} ({facts.run_tag})",
                    admitted=admission_record(facts.run_tag, admitted))
        if not written:
            return f"{what} for {facts.run_tag} was already in row {row_id} (verified, not rewritten)"
        return f"uploaded {what} for {facts.run_tag} (row {row_id}, verified)"

    def _track(self, work: _CellWork, facts: RunDirFacts, admitted: Admitted, gpu_hours: float | None) -> str:
        """Log to the tracker, read the run back, compare; the memory gets the outcome, so the planner can say it."""
        if self.tracker is None:
            raise UploadNotVerified("upload.mlflow is on but this pass has no tracker configured")
        tracker, experiment = self.tracker
        result = work.metrics(facts, admitted)
        analysis = work.analyses.get(facts.run_tag) or self.analyze_dir(facts, result)
        owner = self.launcher.username
        record = tracker_record(work.cell, facts, owner, result, analysis, self.errors, gpu_hours)
        work.learnt(tracked_run_tag=None, track_error=None)
        try:
            tracker.log(experiment, record)
            wrong = differences(record, tracker.read_back(experiment, facts.run_tag, owner))
        except (StoreUnavailable, ObservationError) as exc:
            wrong = [str(exc)]
        if wrong:
            reason = f"MLflow: {'; '.join(wrong[:3])}" + (f" (+{len(wrong) - 3} more)" if len(wrong) > 3 else "")
            work.learnt(track_error=reason)
            raise UploadNotVerified(reason)
        work.learnt(tracked_run_tag=facts.run_tag, admitted=admission_record(facts.run_tag, admitted))
        return f"MLflow run {facts.run_tag} in {experiment!r} verified ({len(record.metrics)} metrics)"


def row_config(cell: Cell, run_tag: str) -> dict[str, Any]:
    """The `config` jsonb the old tools and dashboards read, plus what our matching needs."""
    config: dict[str, Any] = {"agent": cell.agent, "env": cell.cluster, "timeout_multiplier": cell.timeout_multiplier,
                              "run_tag": run_tag, "harbor_config": cell.harbor_config, "dataset": cell.dataset,
                              "fingerprint": cell.fingerprint, "n_attempts": cell.n_attempts}
    overrides = cell.overrides.model_dump(exclude_none=True)
    if overrides:
        config["environment"] = overrides
    if cell.shard is not None:  # a shard's own row: never a score, matched by its shard alone (RULES §17)
        config["shard"] = str(cell.shard)
    elif cell.shards > 1:
        config["shards"] = cell.shards
    return config

