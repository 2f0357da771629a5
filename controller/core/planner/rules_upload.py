"""RULES §14 and §5: what a finished run dir may upload. The admission gate first, then the overlong hold, then
where the result goes (the results DB, MLflow, or only the post-eval report); and a Finished row's read-back.

`UPLOAD_GATES` is read top to bottom: the first gate that decides wins; past them all the run is uploaded.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from controller.core.actions import Analyze, Hold, Resume, Skip, Track, Upload, Wait
from controller.core.admission import Admission, Admitted, Refused, admit, distinct_trials, expected_trials
from controller.core.metrics import holds_the_gates_numbers
from controller.core.observed import ObservedRow, RunDirFacts
from controller.core.planner.policy import UPLOAD_NOT_VERIFIED
from controller.core.planner.rules_remedy import remediate
from controller.core.planner.view import CellView
from controller.core.planner.words import ADMISSION_RULES, flagged, metric, progress
from controller.core.remedies import Remedy, RemedyCause, RemedyKind
from controller.core.resume import RESUME_TABLE, DirClass
from controller.core.types import walltime_seconds
from controller.core.vocabulary import CellPlan, Phase, Rule


@dataclass(slots=True)
class UploadCase:
    """A run dir that is done, as the gates read it: its class (RULES §4), the rule that sent it here, the row to
    write, and what the admission gate said."""

    view: CellView
    facts: RunDirFacts
    row_id: str | None
    cls: DirClass
    rule: Rule
    admission: Admission


def refused(case: UploadCase) -> CellPlan | None:
    """A refusal calls for a resume (fires left), a refire (a dead launch), or a human (RULES §14)."""
    if not isinstance(case.admission, Refused):
        return None
    view, facts, refusal = case.view, case.facts, case.admission
    rule = ADMISSION_RULES[refusal.refusal]
    if refusal.remedy == "refire":
        remedy = Remedy(run_tag=facts.run_tag, kind=RemedyKind.REFIRE, diagnosis=f"{refusal.summary()}",
                        at=view.now, cause=RemedyCause.DEAD_LAUNCH)
        return remediate(view, facts, view.last_job(facts.run_tag), remedy)
    if refusal.remedy == "resume":
        fires = view.fires(facts)
        reason = f"{refusal.summary()} → resume, fire {fires + 1} of {view.policy.max_total_fires}"
        action = Resume(reason=reason, run_tag=facts.run_tag, attempt=view.attempt_of(facts.run_tag),
                        fire=fires + 1, row_id=case.row_id)
        return view.result(Phase.PENDING, [action], reason, rule, facts=facts, admission=refusal)
    reason = f"{refusal.summary()}: not uploading"
    return view.result(Phase.FAILED, [Hold(reason=reason)], reason, rule, facts=facts, admission=refusal)


def shard_done(case: UploadCase) -> CellPlan | None:
    """A shard uploads nothing: its cell uploads the union of its shards' run dirs (RULES §17)."""
    view = case.view
    if view.cell.shard is None:
        return None
    reason = f"shard {view.cell.shard.index + 1} of {view.cell.shard.count} done ({progress(case.facts)}): its " \
             "cell uploads once every shard's run dir is admitted"
    return view.result(Phase.EVALUATED, [Wait(reason=reason)], reason, Rule.SHARD_DONE, facts=case.facts,
                       admission=case.admission)


def overlong_hold(case: UploadCase) -> CellPlan | None:
    """upload.overlong hold: an overlong run waits for a human's forceUpload."""
    view, policy = case.view, case.view.policy
    if not policy.hold_overlong or policy.force_upload or not (overlong := overlong_note(view, case.facts)):
        return None
    reason = f"{RESUME_TABLE[case.cls].reason}; upload gate: {overlong} (is_overlong; upload.overlong: hold): not " \
             "uploading; set upload.forceUpload to upload it anyway"
    return view.result(Phase.FAILED, [Hold(reason=reason)], reason, Rule.UPLOAD_GATE, facts=case.facts,
                       admission=case.admission)


def without_db(case: UploadCase) -> CellPlan | None:
    """upload.db off: done once the report is written, or, with MLflow on, once its run reads back. That is
    where its result went, so a Completed cell shows the score of its finished run dir."""
    view, facts, rule, admitted = case.view, case.facts, case.rule, case.admission
    if view.policy.may_upload or not isinstance(admitted, Admitted):
        return None
    tag = facts.run_tag
    if view.policy.track and view.memory.tracked_run_tag == tag:
        reason = f"MLflow run {tag} read back as logged; upload.db is off"
        return view.result(Phase.COMPLETED, [Skip(reason=reason)], reason, rule, facts=facts,
                           admission=admitted, score=admitted.score, n_scored=admitted.n_scored)
    if view.policy.track:
        reason = not_verified(view)
        track = Track(facts=facts, reason=f"{reason}: log and read back (upload.db is off)", admitted=admitted,
                      gpu_hours=view.attempt_hours(facts.run_tag))
        return view.result(Phase.EVALUATED, [analyze(facts, admitted), track], reason, Rule.VERIFY_UPLOAD,
                           facts=facts, admission=admitted)
    if view.memory.analyzed_run_tag == tag:
        reason = f"post-eval report written for {tag}; upload.db and upload.mlflow are off"
        return view.result(Phase.COMPLETED, [Skip(reason=reason)], reason, rule, facts=facts,
                           admission=admitted, score=admitted.score, n_scored=admitted.n_scored)
    return view.result(Phase.EVALUATED, [analyze(facts, admitted)],
                       "trials done; upload.db is off: post-eval report only", rule, facts=facts, admission=admitted)


UPLOAD_GATES: tuple[Callable[[UploadCase], CellPlan | None], ...] = (
    refused,        # the admission gate said no        → resume, refire or hold (RULES §14)
    overlong_hold,  # overlong, upload.overlong: hold   → hold for forceUpload
    shard_done,     # a shard's run dir, admitted       → wait for the cell's union (RULES §17)
    without_db,     # upload.db off                     → report only, or MLflow alone
)


def upload(view: CellView, facts: RunDirFacts, row_id: str | None, cls: DirClass, rule: Rule) -> CellPlan:
    """Through the admission gate (RULES §14), then the overlong hold; only an admitted number is uploaded."""
    can_resume = (cls not in (DirClass.REJECTED, DirClass.AT_RESUME_LIMIT) and not facts.no_resume
                  and not facts.shards  # a union of shards: only its shards run (RULES §17)
                  and view.memory.upload_as_is != facts.run_tag and view.fires(facts) < view.policy.max_total_fires)
    case = UploadCase(view=view, facts=facts, row_id=row_id, cls=cls, rule=rule,
                      admission=admit_dir(view, facts, can_resume))
    for gate in UPLOAD_GATES:
        decided = gate(case)
        if decided is not None:
            return decided
    admitted = case.admission
    assert isinstance(admitted, Admitted)
    verdict = RESUME_TABLE[cls]
    action = upload_action(view, facts, row_id, f"{verdict.reason} ({progress(facts)}): upload metrics", admitted)
    reason = f"{verdict.reason}: analyze and upload; {admitted.summary()}{flagged(overlong_note(view, facts))}"
    return view.result(Phase.EVALUATED, [analyze(facts, admitted), action], reason, rule, facts=facts,
                       admission=admitted)


def finished(view: CellView, row: ObservedRow, rule: Rule) -> CellPlan:
    """A Finished row with metrics (RULES §2): done, unless our upload to it did not read back, its MLflow run has
    not read back, or its run was cut short."""
    score = metric(row, "accuracy")
    valid = metric(row, "n_valid_trials")
    n_scored = int(valid) if valid is not None else None
    facts = view.dirs.get(row.job_name or "") if view.dirs else None
    if view.memory.db_unverified is not None and view.memory.db_unverified == row.job_name and view.ours(row):
        return unverified(view, row, facts)
    admission = admit_dir(view, facts, can_resume=False) if needs_tracking(view, row, facts) and facts else None
    if isinstance(admission, Admitted) and facts is not None and holds_the_gates_numbers(row.metrics, admission):
        reason = not_verified(view)
        track = Track(facts=facts, reason=f"{reason}: log and read back", admitted=admission,
                      gpu_hours=view.attempt_hours(facts.run_tag))
        return view.result(Phase.EVALUATED, [analyze(facts, admission), track], reason,
                           Rule.VERIFY_UPLOAD, facts=facts, admission=admission, score=score, n_scored=n_scored)
    expected = expected_trials(view.cell, facts)[0] if facts is not None else None
    if facts is not None and expected and distinct_trials(facts, view.cell.n_attempts) < expected:
        cls = view.classify(facts, job=None)
        if cls in (DirClass.AT_RESUME_LIMIT, DirClass.REJECTED):
            reason = f"uploaded as is: {RESUME_TABLE[cls].reason} ({progress(facts)}); its row is the score of part " \
                     "of the benchmark and nothing more runs here: `evalctl retry` runs the whole of it again as a " \
                     "new attempt"
            return view.result(Phase.FAILED, [Hold(reason=reason)], reason, RESUME_TABLE[cls].rule,
                               facts=facts, score=score, n_scored=n_scored)
    if admission is not None:  # the row's own numbers shown: the gate's today are another run's count
        reason = f"job finished; not logged to MLflow: {untracked(admission, score, n_scored)}"
        return view.result(Phase.COMPLETED, [Skip(reason=reason)], reason, rule, facts=facts, score=score,
                           n_scored=n_scored)
    reason = f"job finished{flag_note(view, row, facts)}"
    return view.result(Phase.COMPLETED, [Skip(reason=reason)], reason, rule, facts=facts, score=score,
                       n_scored=n_scored)


MAX_UNVERIFIED_UPLOADS = 2  # a second upload that reads back as wrong is no passing glitch: a store, or a writer


def unverified(view: CellView, row: ObservedRow, facts: RunDirFacts | None) -> CellPlan:
    """Our upload to this Finished row did not read back as written (another writer, a store that rounds): its
    metrics are not the gate's, so not a score to show. Upload again; after a second miss, hold (Failed: a human's,
    and released by a retry, a new attempt with a row of its own) without writing the row again: what changes it is
    in the store, not in the run (SCORES.md)."""
    memory = view.memory
    reason = f"{UPLOAD_NOT_VERIFIED}: row {row.id} does not show the metrics uploaded for {row.job_name}"
    if memory.db_unverified_uploads >= MAX_UNVERIFIED_UPLOADS:
        why = f"{reason} after {memory.db_unverified_uploads} uploads; not writing it again: fix what changes the " \
              "row (its other writer, a column that rounds), then `evalctl retry` runs the cell again as a new " \
              "attempt with a row of its own"
        return view.result(Phase.FAILED, [Hold(reason=why)], why, Rule.VERIFY_UPLOAD, facts=facts)
    admission = admit_dir(view, facts, can_resume=False) if facts is not None and not facts.unreadable else None
    if facts is None or not isinstance(admission, Admitted):
        why = "its run dir is not there to upload again: restore it, or `evalctl retry` runs the cell again as a " \
              "new attempt" if admission is None else f"its run dir is now {admission.summary()}"
        return view.result(Phase.FAILED, [Hold(reason=f"{reason}; {why}")], f"{reason}; {why}",
                           Rule.VERIFY_UPLOAD, facts=facts, admission=admission)
    action = upload_action(view, facts, row.id, f"{reason}: upload again and read back", admission)
    return view.result(Phase.EVALUATED, [analyze(facts, admission), action], reason, Rule.VERIFY_UPLOAD,
                       facts=facts, admission=admission)


def untracked(admission: Admission, score: float | None, n_scored: int | None) -> str:
    """Why a finished run is not logged to MLflow: its dir is refused now, or gives another number than its row
    holds (a late trial, an older tool's upload). One run, one number: the row is history, never rewritten."""
    if not isinstance(admission, Admitted):
        return f"its run dir is {admission.summary()}"
    return f"its run dir now gives {admission.score:.4f} (n={admission.n_scored}) where its row holds {score} " \
           f"(n={n_scored}); the row is not rewritten"


def flag_note(view: CellView, row: ObservedRow, facts: RunDirFacts | None) -> str:
    """What a finished row's is_overlong says, and whether our run's dir disagrees. Shown, never rewritten:
    a Finished row is history (perhaps the old listener's, under our name), not ours to re-upload."""
    if row.is_overlong:
        return "; its row is flagged is_overlong"
    overlong = overlong_note(view, facts) if facts is not None and view.ours(row) else None
    return "" if overlong is None else f"; {overlong}, but its row is not flagged is_overlong"


def needs_tracking(view: CellView, row: ObservedRow, facts: RunDirFacts | None) -> bool:
    """Our finished run whose MLflow run has not been read back yet. Other users' rows are theirs to log."""
    return (view.policy.track and view.ours(row) and facts is not None
            and not facts.unreadable and view.memory.tracked_run_tag != facts.run_tag)


def not_verified(view: CellView) -> str:
    return f"{UPLOAD_NOT_VERIFIED}: {view.memory.track_error or 'not logged to MLflow yet'}"


def admit_dir(view: CellView, facts: RunDirFacts, can_resume: bool) -> Admission:
    """A shard's infra share is not its own to judge: the union's, over the whole benchmark, is (RULES §17)."""
    reading = view.memory.output
    jobs = {job.job_id for job in view.jobs_of_dir(facts.run_tag)}
    requests = reading.requests if reading is not None and reading.job_id in jobs else None
    policy = view.policy.admission
    if view.cell.shard is not None:
        policy = policy.model_copy(update={"max_infra_fraction": 1.0})
    return admit(view.cell, facts, policy, requests=requests, can_resume=can_resume,
                 model_names=view.model_names, benchmark_names=view.benchmark_names)


def analyze(facts: RunDirFacts, admitted: Admitted) -> Analyze:
    return Analyze(facts=facts, admitted=admitted, reason=f"post-eval report for {facts.run_tag}")


def upload_action(view: CellView, facts: RunDirFacts, row_id: str | None, reason: str, admitted: Admitted) -> Upload:
    """Every upload of a run carries the same flag, so a re-upload (to verify MLflow) never clears it."""
    overlong = overlong_note(view, facts)
    return Upload(facts=facts, row_id=row_id, is_overlong=overlong is not None, admitted=admitted,
                  reason=reason + flagged(overlong), gpu_hours=view.attempt_hours(facts.run_tag))


def overlong_note(view: CellView, facts: RunDirFacts) -> str | None:
    """How a run took longer than upload.overlongHours, from its started_at (the first fire's: Harbor keeps it
    on a resume) to its end, else from its jobs' accounting (first start to last end); None if not. A union of
    shards: None, its shards' gates judged each (RULES §17); its span is the time between them."""
    if facts.shards:
        return None
    jobs = view.jobs_of_dir(facts.run_tag)
    limit = view.policy.overlong
    start = facts.started_at or min((j.started_at for j in jobs if j.started_at), default=None)
    end = facts.finished_at or facts.last_progress_at or max((j.ended_at for j in jobs if j.ended_at), default=None)
    if limit == "walltime":
        limit = timedelta(seconds=walltime_seconds(view.cell.time_limit))
    if start is None or end is None or end - start <= limit:
        return None
    what = "one job's walltime" if view.policy.overlong == "walltime" else "overlongHours"
    source = "" if facts.started_at else " (by the scheduler's accounting: the run dir has no started_at)"
    return f"ran {(end - start).total_seconds() / 3600:.3g} h, longer than {what} " \
           f"{limit.total_seconds() / 3600:g}{source}"
