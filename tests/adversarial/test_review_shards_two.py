"""Second review of shards (RULES §17, commit 12bbc40): cases the sharded path still gets wrong after the first
review's fixes. Each test fails on main.

Planner-level, over the observations `tests/core/test_shards.py` builds: a cell of 5 tasks run as 2 shards, each
shard's run dir the one the job script and Harbor leave for its subset.
"""

from __future__ import annotations

from datetime import timedelta

from controller.core.actions import Track, Upload
from controller.core.audit import audit_cells
from controller.core.observed import JobState, Metric, Observation, QuietFailure, RunDirFacts
from controller.core.planner import Policy, launch_of, plan
from controller.core.planner.rules_upload import overlong_note
from controller.core.planner.view import cell_view
from controller.core.remedies import CellMemory
from controller.core.types import Cell, EvalRunRef
from controller.core.vocabulary import CellPlan, Phase, Rule
from tests.adversarial.test_review_shards import share_dir
from tests.core.builders import NOW, POLICY, RUN, ago, cell, facts, job, obs, row, sub
from tests.core.test_shards import CELL, REWARDS, SHARDS, ended, shard_dir

SCORE = (Metric(name="accuracy", value=0.6), Metric(name="n_valid_trials", value=5.0))


def planned(cells: list[Cell], observations: list[Observation], policy: Policy = POLICY,
            owners: dict[str, EvalRunRef] | None = None) -> list[CellPlan]:
    return list(plan(RUN, cells, observations, policy, NOW, owners=owners).cells)


def uploads(cell_plan: CellPlan) -> list[Upload]:
    return [action for action in cell_plan.actions if isinstance(action, Upload)]


def with_rows(observed: Observation, *rows: object) -> Observation:
    return observed.model_copy(update={"rows": (*rows, *(observed.rows or ()))})


# ------------------------------------------------------------------ overlong


def test_a_shard_that_ran_past_its_walltime_makes_its_unions_row_overlong() -> None:
    """By default an overlong run is uploaded with is_overlong set (RULES §5), and forceUpload releases an overlong
    hold flagged is_overlong (§14). A shard is judged overlong on its own jobs, but it uploads nothing
    (`shard_done`), and the union's `overlong_note` is always None: a shard resumed across walls (its first fire
    10 h before its end, on a 4 h walltime) leaves no trace, and the union's row reads is_overlong false."""
    short = cell(tasks=5, shards=2, time_limit="04:00:00")
    first, second = short.sharded()
    resumed = shard_dir(first).model_copy(update={"started_at": ago(hours=12), "fires": 3})
    whole, *_ = planned([short, first, second], [obs(), ended(first, (resumed,)), ended(second, (shard_dir(second),))])
    assert overlong_note(cell_view(first, ended(first, (resumed,)), POLICY, NOW), resumed)  # the shard's own run
    [upload] = uploads(whole)
    assert upload.is_overlong, upload.reason


# ------------------------------------------------------------------ the row that decides the cell


def test_an_old_union_is_not_uploaded_again_over_the_cells_newer_row() -> None:
    """shards: 2 made the union a1 (row-union). A human cleared its metrics and set shards: 1; the cell ran
    unsharded as a2 and its row is Finished with a score, the newest. Set back to shards: 2 (a template's default),
    the shards are Completed by that row, so `ready_dir` re-admits their old a1 dirs; the union is numbered past the
    cell's own a2 submission (a3), `union_of_shards` (first of SETTLED_RULES, "whatever row is newest") finds no row
    of a3 and uploads it: the run a human cleared is published again, as the cell's newest row."""
    cleared = row("Finished", job_name=CELL.run_tag(1), row_id="row-union", created=ago(hours=50))
    newer = row("Finished", job_name=CELL.run_tag(2), row_id="row-a2", metrics=SCORE, created=ago(hours=20))
    tag = CELL.run_tag(2)
    parent = obs(rows=(cleared, newer), subs=(sub(CELL, 2, job_id="300", row_id=newer.id),),
                 jobs=(job(tag, JobState.COMPLETED, job_id="300", started=ago(hours=20), ended=ago(hours=12)),))
    long_ago = {"started_at": ago(hours=55), "finished_at": ago(hours=51), "last_progress_at": ago(hours=51)}
    old_shards = [with_rows(ended(shard, (shard_dir(shard).model_copy(update=long_ago),)), cleared, newer)
                  for shard in SHARDS]  # their trials ended before the union's row, long before the newer run
    whole, *shard_plans = planned([CELL, *SHARDS], [parent, *old_shards])
    assert all(launch_of(p) is None for p in shard_plans)
    assert uploads(whole) == [], [u.facts.run_tag for u in uploads(whole)]
    assert whole.phase == Phase.COMPLETED, whole.reason



def test_under_force_eval_a_cleared_union_row_is_not_filled_again_with_the_same_union() -> None:
    """Clearing a Finished row's metrics is how a row is run again (RULES §2); under forceEval an unsharded cell
    whose own row is cleared starts a new attempt. A sharded cell's shards, under forceEval, see only their own rows
    (`cell_view` keeps a row by its submission, and the union's row has none of theirs), so they stay ShardDone over
    their old dirs; the cell rebuilds the same union a1, `union_of_shards` finds its cleared row and uploads into it:
    the number a human cleared is published again, and nothing runs."""
    force = POLICY.model_copy(update={"force_eval": True})
    cleared = row("Finished", job_name=CELL.run_tag(1), row_id="row-union", created=ago(hours=1))
    observed = [obs(rows=(cleared,)), *(with_rows(ended(shard, (shard_dir(shard),)), cleared) for shard in SHARDS)]
    whole, *shard_plans = planned([CELL, *SHARDS], observed, force)
    assert [u.row_id for u in uploads(whole)] == [], whole.reason
    assert [type(launch_of(p)).__name__ for p in shard_plans] == ["Submit", "Submit"], [p.reason for p in shard_plans]


# ------------------------------------------------------------------ launches


def test_shards_do_not_launch_while_their_cells_own_job_runs() -> None:
    """shards: 1 → 2 while the cell's own unsharded job runs (30 h in, 3 of 5 done, a result 5 min ago: the long job
    shards are for). The shards see the cell's Started row, but not its job (a shard's jobs are its own tags'), and
    the row is not theirs: someone else's, stale after staleStartedHours (24 h), so both launch: the benchmark runs
    twice at once. (When both end, the cell uploads its own run and then, the union numbered past its a1, the union
    too: two rows.)"""
    tag = CELL.run_tag(1)
    own = row("Started", job_name=tag, row_id="row-a1", created=ago(hours=30), started=ago(hours=30),
              slurm_job_id="77")
    parent = obs(rows=(own,), subs=(sub(CELL, 1, job_id="77", row_id=own.id, created=ago(hours=30)),),
                 jobs=(job(tag, JobState.RUNNING, job_id="77", started=ago(hours=30), time_left_s=18 * 3600),),
                 dirs=(facts(tag, total=5, completed=3, finished=False, last_progress=ago(minutes=5)),))
    whole, *shard_plans = planned([CELL, *SHARDS], [parent, obs(rows=(own,)), obs(rows=(own,))])
    assert whole.phase == Phase.RUNNING
    assert [launch_of(p) for p in shard_plans] == [None, None], [p.reason for p in shard_plans]


# ------------------------------------------------------------------ holds


def test_infra_errors_each_shard_allows_do_not_hold_their_union() -> None:
    """Two shards of 100 tasks, 6 infra errors each: within infraErrorThreshold (10, a count), so neither resumes,
    and both are ShardDone. Their union has 12 (6 % of 200, within maxInfraErrorFraction 0.1), but the cell runs it
    through `from_dir`, whose §4 class counts them against the same threshold: DONE_WITH_ERRORS → resume, which
    through_shards makes a hold. forceUpload does not release it (the gate admits; §4 holds), and a retry re-runs
    both shards whole into the same 12: a hold no lever clears, on a run the unsharded cell would have resumed once
    and uploaded."""
    big = cell(tasks=200, shards=2)
    first, second = big.sharded()
    observed = [obs(), ended(first, (share_dir(first, 200, infra=6),)), ended(second, (share_dir(second, 200, infra=6),))]
    whole, *shard_plans = planned([big, first, second], observed)
    assert not whole.held, whole.reason
    assert len(uploads(whole)) == 1 and not any(launch_of(p) for p in shard_plans), whole.reason  # 6 %: uploaded

# ------------------------------------------------------------------ a change of K


THREE = cell(tasks=5, shards=3)  # the same benchmark, now as 3 shards (found with K out of the key; K is in it now)
THREE_SHARDS = THREE.sharded()
K2_UNION = row("Finished", job_name=CELL.run_tag(1), row_id="row-union-k2", metrics=SCORE, created=ago(hours=50))


def three_shards_done(*, reward_of_first: float | None = None) -> list[Observation]:
    """The 3 shards ended, each with its admitted a1 dir and its own Started row; the cell's rows include the union
    row the 2 shards made before. `reward_of_first`: the first task's reward in shard 1, if not the fixture's."""
    done = []
    for shard in THREE_SHARDS:
        run = shard_dir(shard)
        if reward_of_first is not None and "task-0" in run.tasks:
            tasks = {**run.tasks, "task-0": (1, 1, reward_of_first)}
            run = run.model_copy(update={"tasks": tasks, "reward_sum": sum(t[2] for t in tasks.values())})
        done.append(with_rows(ended(shard, (run,)), K2_UNION))
    return done


def test_a_union_after_shards_two_to_three_is_not_settled_by_the_old_unions_row() -> None:
    """forceEval, and shards changed 2 → 3. The 3 shard cells are new (their keys carry `of3`) and, under forceEval,
    see only their own rows: they launch as a1. Their union is numbered from their attempts alone, `1 + Σ(a-1)` = a1:
    the tag of the union the 2 shards made. forceEval keeps a row whose job_name is a union's tag, so
    `union_of_shards` finds the 2 shards' Finished row under it and says Completed with its score: the 3 shards'
    run is never uploaded, and the cell shows the old run's number as this one's. (Either the shards must not run,
    or their union needs a row of its own.)"""
    assert THREE.key != CELL.key and THREE.run_tag(1) != K2_UNION.job_name  # another K: another cell (the fix)
    force = POLICY.model_copy(update={"force_eval": True})
    first = planned([THREE, *THREE_SHARDS], [obs(rows=(K2_UNION,))] * 4, force)
    launched = [p for p in first[1:] if launch_of(p) is not None]
    whole, *_ = planned([THREE, *THREE_SHARDS], [obs(rows=(K2_UNION,)), *three_shards_done()], force)
    assert len(launched) == 3 and [u.row_id for u in uploads(whole)] == [None], (
        f"{len(launched)} shards launched; then the cell: {whole.phase.value}, {whole.reason}")


def test_db_audit_does_not_judge_the_old_unions_row_by_the_new_shards() -> None:
    """After the run above, `db audit` of the EvalRun (now 3 shards) builds the union of the 3 shards' newest dirs,
    tagged a1 (`audit.with_unions`, numbered as the planner numbers it), and judges the 2 shards' row, whose
    job_name is a1, by it: a correct row is reported ScoreDiffers (`--apply` marks it refused) because a later run
    of the benchmark scored otherwise; and a wrong one would pass if the later run happened to agree."""
    report = audit_cells([THREE, *THREE_SHARDS], [obs(rows=(K2_UNION,)), *three_shards_done(reward_of_first=0.0)],
                         POLICY.admission, timedelta(seconds=5))
    judged = [(a.verdict, a.reason) for a in report.audited if a.row_id == K2_UNION.id]
    assert judged == [], judged  # another K's union: not judged by these shards at all


# ------------------------------------------------------------------ the union's numbers


def test_a_shards_quiet_failure_is_moved_to_infra_once_in_its_union() -> None:
    """`plan_cell` moves each quiet failure (a graded trial whose agent answered nothing) out of the scored trials
    (`count_instant_failures`). The shard's plan did so for its dir, and `ready_dir` hands that counted dir to the
    union, its quiet failures still listed; the cell's `plan_cell` then moves them again. Here a resume re-ran
    task-3 (two graded 1.0 results, one with no model output): counted once, the task is still measured by the other
    result (unsharded: 0.6, nothing unmeasured); counted twice it has no scored result left, 1 of 5 tasks is
    unmeasured (20 %, above the default 10 %), and the union is held for an infra share it does not have; under a
    share that allows it, the union is published at 0.5 (task-3 left out), not the run's 0.6."""
    silent = QuietFailure(exception_type=None, kind=None, agent_seconds=300.0, reward=1.0, task="task-3")

    def rerun(run: RunDirFacts) -> RunDirFacts:
        return run.model_copy(update={
            "tasks": {**run.tasks, "task-3": (2, 2, 2.0)}, "reward_sum": run.reward_sum + 1.0,
            "n_completed": run.n_completed + 1, "n_trial_dirs": run.n_trial_dirs + 1, "n_scored": run.n_scored + 1,
            "n_graded": run.n_graded + 1, "n_usage_reported": run.n_usage_reported + 1, "quiet_failures": (silent,)})

    whole_dir = rerun(facts(CELL.run_tag(1), total=5, completed=5).model_copy(update={
        "tasks": {name: (1, 1, reward) for name, reward in REWARDS.items()}, "reward_sum": sum(REWARDS.values())}))
    [unsharded] = [a for a in plan(RUN, [CELL], [obs(dirs=(whole_dir,))], POLICY, NOW).cells[0].actions
                   if isinstance(a, Upload)]
    assert unsharded.admitted.score == 0.6 and unsharded.admitted.evidence.unmeasured == 0
    observed = [obs(), ended(SHARDS[0], (shard_dir(SHARDS[0]),)), ended(SHARDS[1], (rerun(shard_dir(SHARDS[1])),))]
    lenient = POLICY.model_copy(update={"admission": POLICY.admission.model_copy(update={"max_infra_fraction": 0.25})})
    published = [(u.admitted.score, u.admitted.evidence.unmeasured) for u in uploads(planned([CELL, *SHARDS],
                                                                                             observed, lenient)[0])]
    whole, first, second = planned([CELL, *SHARDS], observed)
    assert first.rule == second.rule == Rule.SHARD_DONE
    assert [(u.admitted.score, u.admitted.evidence.unmeasured) for u in uploads(whole)] == [(0.6, 0)], whole.reason
    assert published == [(0.6, 0)]


def test_with_upload_db_off_a_union_after_shards_two_to_three_is_logged_to_mlflow() -> None:
    """upload.db off, MLflow on: the 2 shards' union a1 was logged and read back (the cell's memory says
    tracked_run_tag a1). Changed to 3 shards, the new shard cells see no row and no memory of theirs and launch;
    their union is numbered a1 again, and `without_db` reads "MLflow run a1 read back as logged": Completed with
    the new union's score shown, no Track, no post-eval report, while MLflow holds the 2 shards' run. (Either the
    shards must not run, or their union must be logged.)"""
    no_db = POLICY.model_copy(update={"may_upload": False, "track": True})
    logged = obs().model_copy(update={"memory": CellMemory(tracked_run_tag=CELL.run_tag(1),
                                                           analyzed_run_tag=CELL.run_tag(1))})
    first = planned([THREE, *THREE_SHARDS], [logged, obs(), obs(), obs()], no_db)
    launched = [p for p in first[1:] if launch_of(p) is not None]
    whole, *_ = planned([THREE, *THREE_SHARDS], [logged, *(ended(s, (shard_dir(s),)) for s in THREE_SHARDS)], no_db)
    tracked = [a for a in whole.actions if isinstance(a, Track)]
    assert len(launched) == 3 and len(tracked) == 1, f"{len(launched)} shards launched; then: {whole.reason}"
