"""Review of shards (RULES §17, branch `shards`): cases the sharded path gets wrong. Each test fails on the branch.

Planner-level, over the observations `tests/core/test_shards.py` builds: a cell of 5 tasks run as 2 shards, each
shard's run dir the one the job script and Harbor leave for its subset.
"""

from __future__ import annotations

from datetime import timedelta

from controller.core.actions import Resume, Submit, Upload
from controller.core.audit import audit_cells
from controller.core.levers import retried
from controller.core.observed import JobState, Metric, Observation, Recorded, RunDirFacts
from controller.core.planner import Policy, launch_of, plan
from controller.core.remedies import CellMemory, OutputReading
from controller.core.retry import RetryRequest
from controller.core.types import Cell, EvalRunRef
from controller.core.vocabulary import CellPlan, Phase
from tests.core.builders import NOW, POLICY, RUN, ago, cell, facts, job, obs, row, sub
from tests.core.test_shards import CELL, SHARDS, ended, shard_dir, with_infra


def planned(cells: list[Cell], observations: list[Observation], policy: Policy = POLICY,
            owners: dict[str, EvalRunRef] | None = None) -> list[CellPlan]:
    return list(plan(RUN, cells, observations, policy, NOW, owners=owners).cells)


def uploads(cell_plan: CellPlan) -> list[Upload]:
    return [action for action in cell_plan.actions if isinstance(action, Upload)]


def done_shards() -> list[Observation]:
    """Both shards ended, each with its admitted run dir and its own Started row."""
    return [ended(shard, (shard_dir(shard),)) for shard in SHARDS]


def with_rows(observed: Observation, *rows: object) -> Observation:
    return observed.model_copy(update={"rows": (*rows, *(observed.rows or ()))})


# ------------------------------------------------------------------ forceEval


def test_force_eval_uploads_the_union_of_its_shards() -> None:
    """forceEval keeps only the rows and run dirs of the EvalRun's own submissions (view.cell_view). The sharded
    cell has no submission of its own, so its union (appended by planner/shards.with_shards) is filtered out and its
    rules decide a fresh start, which through_shards turns into a hold: a forceEval of a sharded cell re-runs every
    shard and never uploads, held with "their union: no existing job"."""
    force = POLICY.model_copy(update={"force_eval": True})
    whole, *_ = planned([CELL, *SHARDS], [obs(), *done_shards()], force)
    assert len(uploads(whole)) == 1, whole.reason


# ------------------------------------------------------------------ the row that decides the cell


def test_a_stale_row_of_another_user_does_not_keep_the_union_from_its_upload() -> None:
    """Another user's crashed run left a Started row for the benchmark (no `shard` in its config, so the cell and
    both shards match it). Once it is stale the shards start and finish; but the cell's newest row is still that
    row, its rules decide "stale started → submit", and through_shards makes that a hold. An unsharded cell would
    have written a newer row of its own with its launch; the sharded cell writes none before its upload, so it
    is held for good."""
    stale = row("Started", user="bob", job_name="bobs-run", row_id="row-bob", created=ago(hours=40),
                started=ago(hours=40))
    whole, *_ = planned([CELL, *SHARDS], [obs(rows=(stale,)), *(with_rows(o, stale) for o in done_shards())])
    assert len(uploads(whole)) == 1, whole.reason


def test_a_rerun_after_the_unions_metrics_were_cleared_is_uploaded() -> None:
    """Clearing a Finished row's metrics is how a row is run again (RULES §2). The shards see the cleared union
    row, start attempt 2 and finish; their new union (tag a3) is never uploaded: the cell's newest row is the
    cleared one, which decides a fresh start, made a hold ("their union: finished but metrics cleared")."""
    cleared = row("Finished", job_name=CELL.run_tag(1), row_id="row-union", created=ago(hours=30))

    def again(shard: Cell) -> Observation:
        tag = shard.run_tag(2)
        return obs(rows=(cleared, row("Started", job_name=tag, row_id=f"row-{tag}", created=ago(hours=5))),
                   subs=(sub(shard, 1, row_id=f"row-{shard.run_tag(1)}"), sub(shard, 2, job_id="200", row_id=f"row-{tag}")),
                   jobs=(job(tag, JobState.COMPLETED, job_id="200", started=ago(hours=4), ended=ago(hours=2)),),
                   dirs=(shard_dir(shard), shard_dir(shard, attempt=2)))

    whole, *_ = planned([CELL, *SHARDS], [obs(rows=(cleared,)), *(again(shard) for shard in SHARDS)])
    assert [upload.facts.run_tag for upload in uploads(whole)] == [CELL.run_tag(3)], whole.reason


# ------------------------------------------------------------------ levers


def test_a_retry_of_the_held_sharded_cell_runs_its_shards_again() -> None:
    """The union is held (infra share over the benchmark; the shards, each within its relaxed share, are done and not
    held). A retry of the cell records a request for each of its shards (`levers.retried`: what `evalctl retry` and
    the annotation record), and the next pass runs each shard again as a new attempt; the cell launches nothing.
    (Before, the request was the cell's: its attempt was a launch of the cell, held again, and nothing ran.)"""
    infra = with_infra(shard_dir(SHARDS[1]), "task-1")
    observed = [obs(), ended(SHARDS[0], (shard_dir(SHARDS[0]),)), ended(SHARDS[1], (infra,))]
    whole, *shard_plans = planned([CELL, *SHARDS], observed)
    assert whole.held
    asked = retried(whole, [whole, *shard_plans])
    assert asked == list(SHARDS)
    requests = [RetryRequest(id=f"r{n}", cell_key=c.key, evalrun=RUN, requested_by="alice",
                             requested_at=ago(minutes=5)) for n, c in enumerate(asked)]
    again = planned([CELL, *SHARDS], [observed[0], *(o.model_copy(update={"retries": (r,)})
                                                      for o, r in zip(observed[1:], requests, strict=True))])
    assert launch_of(again[0]) is None
    assert [(type(launch_of(p)), launch_of(p).run_tag) for p in again[1:]] == [  # type: ignore[union-attr]
        (Submit, shard.run_tag(2)) for shard in SHARDS]


# ------------------------------------------------------------------ the union's own gate


def test_shards_that_answered_by_their_jobs_vllm_requests_make_an_uploaded_union() -> None:
    """A harness that reports no tokens is judged by the vLLM requests its job logged (RULES §14). Each shard's
    gate reads its own job's requests and admits its dir; the union has no job, so its gate reads none and
    refuses it as a dead launch (NoModelTraffic → refire), which through_shards holds: such a cell never uploads,
    whatever its shards did. Now each shard's gate judges its own job's traffic, and the union is uploaded."""
    quiet = cell(tasks=5, shards=2, reports_tokens=False)
    shards = quiet.sharded()
    heard = CellMemory(output=OutputReading(job_id="100", read_at=ago(hours=3), requests=40))

    def answered_by_requests(shard: Cell) -> Observation:
        silent = shard_dir(shard).model_copy(update={"n_usage_reported": 0, "n_answered": 0})
        return ended(shard, (silent,)).model_copy(update={"memory": heard})

    first = planned([quiet, *shards], [obs(), *(answered_by_requests(s) for s in shards)])
    assert all(p.phase == Phase.EVALUATED for p in first[1:]), [p.reason for p in first]
    assert len(uploads(first[0])) == 1, first[0].reason


def test_a_union_is_not_uploaded_while_one_of_its_shards_is_resumed() -> None:
    """planner/shards.shard_dir admits a shard's dir again with can_resume=False; the shard's own plan admits it
    with its fires left. Under upload.partial: upload, a shard 1 of 2 trials short is resumed by its own plan, but
    shard_dir admits it (partial) and the cell uploads the union 4 of 5 flagged partial in the same pass. The resume
    then finds the union's Finished row newest and completes nothing: the partial number stays, where the unsharded
    cell would have resumed first."""
    partial = POLICY.model_copy(update={"admission": POLICY.admission.model_copy(update={"partial_upload": True})})
    full = shard_dir(SHARDS[1])
    [kept] = sorted(full.tasks)[:1]
    short = full.model_copy(update={"tasks": {kept: full.tasks[kept]}, "n_completed": 1, "n_scored": 1,
                                    "n_graded": 1, "n_answered": 1, "n_usage_reported": 1, "n_trial_dirs": 1,
                                    "reward_sum": full.tasks[kept][2]})
    whole, _, second = planned([CELL, *SHARDS], [obs(), ended(SHARDS[0], (shard_dir(SHARDS[0]),)),
                                                 ended(SHARDS[1], (short,))], partial)
    assert isinstance(launch_of(second), Resume)
    assert uploads(whole) == [], uploads(whole)[0].reason


def share_dir(shard: Cell, total: int, infra: int = 0) -> RunDirFacts:
    """Shard i/K of `total` tasks (`t000`…), every trial graded 1.0 but its first `infra` ones, infra errors."""
    assert shard.shard is not None
    names = [f"t{i:03d}" for i in range(total)][shard.shard.index::shard.shard.count]
    tasks = {name: (1, 0, 0.0) if n < infra else (1, 1, 1.0) for n, name in enumerate(names)}
    scored = len(names) - infra
    return facts(shard.run_tag(1), total=len(names), completed=len(names)).model_copy(update={
        "tasks": tasks, "n_scored": scored, "n_graded": scored, "n_infra_errors": infra, "reward_sum": float(scored),
        "recorded": (Recorded(what="tasks", value=f"shard {shard.shard}", source="meta.env"),
                     Recorded(what="tasks", value=f"task_names ({len(names)})", source="config.json"))})


def test_a_union_is_not_uploaded_while_a_shard_resumes_for_its_infra_errors() -> None:
    """Default policy: a shard of 100 tasks with 11 infra errors (more than infraErrorThreshold 10) is DONE_WITH_ERRORS
    and its own plan resumes it; shard_dir admits it anyway (the shard's infra share is relaxed to 1.0) and the union
    (11 of 200 infra, within 0.1) is uploaded in the same pass: the resume's trials never count."""
    big = cell(tasks=200, shards=2)
    first, second = big.sharded()
    whole, _, resumed = planned([big, first, second], [obs(), ended(first, (share_dir(first, 200),)),
                                                       ended(second, (share_dir(second, 200, infra=11),))])
    assert isinstance(launch_of(resumed), Resume)
    assert uploads(whole) == [], uploads(whole)[0].reason


def test_the_union_is_not_flagged_overlong_for_the_time_between_its_shards() -> None:
    """Overlong (default: longer than one job's walltime) is measured on the union from the first shard's start to
    the last shard's end. Shards that queued one after the other, each 2 h of a 4 h walltime, make a union "ran 8 h"
    and its row is written is_overlong true (with upload.overlong: hold, the cell is held for forceUpload): the row
    says the wall cut a run short that no wall cut."""
    short = cell(tasks=5, shards=2, time_limit="04:00:00")
    first, second = short.sharded()
    early = shard_dir(first).model_copy(update={"started_at": ago(hours=10), "finished_at": ago(hours=8),
                                                "last_progress_at": ago(hours=8)})
    whole, *_ = planned([short, first, second], [obs(), ended(first, (early,)), ended(second, (shard_dir(second),))])
    [upload] = uploads(whole)
    assert not upload.is_overlong, upload.reason


# ------------------------------------------------------------------ shards on an existing EvalRun


def test_a_union_after_shards_one_to_two_gets_a_row_of_its_own() -> None:
    """The cell ran unsharded first: attempt 1 stuck at 3 of 5 at its resume limit, held, its row Started. The
    user sets shards: 2 (the parent keeps its key: shards are not in the fingerprint). The union is numbered from the
    shards' attempts alone, so its tag is the cell's a1 again: it shadows the real a1 dir in the cell's view and is
    uploaded into the unsharded attempt's row (its slurm job, its GPU-hours, its config without `shards`), and the
    parent's memory of that attempt (remedies, upload_as_is, analyzed/tracked run tag) now applies to the union."""
    tag = CELL.run_tag(1)
    old_row = row("Started", job_name=tag, row_id="row-unsharded-a1", created=ago(hours=30), started=ago(hours=30),
                  slurm_job_id="77")
    old_dir = facts(tag, total=5, completed=3, fires=2).model_copy(update={
        "tasks": {f"task-{i}": (1, 1, 1.0) for i in range(3)}, "reward_sum": 3.0})
    parent = obs(rows=(old_row,), subs=(sub(CELL, 1, 1, job_id="77", row_id=old_row.id),
                                        sub(CELL, 1, 2, job_id="78", row_id=old_row.id)),
                 jobs=(job(tag, JobState.COMPLETED, job_id="77", started=ago(hours=30), ended=ago(hours=26)),
                       job(f"{tag}-r1", JobState.COMPLETED, job_id="78", started=ago(hours=26), ended=ago(hours=22))),
                 dirs=(old_dir,))
    whole, *_ = planned([CELL, *SHARDS], [parent, *(with_rows(o, old_row) for o in done_shards())])
    [upload] = uploads(whole)
    assert upload.row_id != old_row.id and upload.facts.run_tag != tag


def test_shards_of_a_cell_another_evalrun_owns_launch_nothing() -> None:
    """Two EvalRuns name the same cell, one unsharded (it owns the key) and one with shards: 2. The parent key is
    the same (shards are not in the fingerprint), the shard keys are only the second's, so the second claims them
    and its shards submit: the benchmark runs twice, and the second's union can never be uploaded (its cell is
    owned elsewhere)."""
    owner = EvalRunRef(name="unsharded")
    plans = planned([CELL, *SHARDS], [obs(), obs(), obs()], owners={CELL.key: owner})
    assert [launch_of(p) for p in plans[1:]] == [None, None], [p.reason for p in plans]


# ------------------------------------------------------------------ completion and audit


def test_with_upload_db_off_the_shards_complete_with_their_cell() -> None:
    """upload.db off: the cell is Completed once the union's report is written; its shards never see a row of the
    union, stay Evaluated (ShardDone) for good, and the EvalRun is never Ready (AllCellsCompleted)."""
    no_db = POLICY.model_copy(update={"may_upload": False, "track": False})
    reported = obs().model_copy(update={"memory": CellMemory(analyzed_run_tag=CELL.run_tag(1))})
    plans = planned([CELL, *SHARDS], [reported, *done_shards()], no_db)
    assert [p.phase for p in plans] == [Phase.COMPLETED] * 3, [p.reason for p in plans]


def test_db_audit_judges_the_unions_row() -> None:
    """`evalctl db audit` judges every Finished row by the run dir its job_name names among the cell's observed
    run dirs. The union's row names the cell's tag, a dir that exists nowhere (the union is made only inside the
    planner), so every uploaded sharded score is "not auditable": the gate's second look never sees it."""
    union_metrics = (Metric(name="accuracy", value=0.6), Metric(name="n_valid_trials", value=5.0))
    union_row = row("Finished", job_name=CELL.run_tag(1), row_id="row-union", metrics=union_metrics,
                    created=ago(minutes=5))
    observed = [obs(rows=(union_row,)), *(with_rows(o, union_row) for o in done_shards())]
    report = audit_cells([CELL, *SHARDS], observed, POLICY.admission, timedelta(seconds=5))
    assert [a.row_id for a in report.audited] == ["row-union"], report.not_auditable
