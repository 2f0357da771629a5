"""Third review of shards (RULES §17, commit 58119c9): cases the sharded path gets wrong after the second review's
fixes. Each test fails on main.

Planner-level, over the observations `tests/core/test_shards.py` builds: a cell of 5 tasks run as 2 shards, each
shard's run dir the one the job script and Harbor leave for its subset.
"""

from __future__ import annotations

from controller.core.actions import Upload
from controller.core.observed import JobState, Metric, Observation, ObservedRow
from controller.core.planner import launch_of, plan
from controller.core.remedies import CellMemory
from controller.core.types import Cell, EvalRunRef
from controller.core.vocabulary import CellPlan, Phase
from tests.core.builders import NOW, POLICY, ago, cell, facts, job, obs, row, sub
from tests.core.test_shards import CELL, SHARDS, shard_dir

SCORE = (Metric(name="accuracy", value=0.6), Metric(name="n_valid_trials", value=5.0))


# ------------------------------------------------------------------ forceEval: another EvalRun's union


def test_under_force_eval_another_evalruns_union_row_does_not_complete_this_evalruns_shards() -> None:
    """forceEval: "only what this EvalRun's own submissions made" decides (RULES §2): an unsharded cell of run2 never
    sees run1's row of the same cell. A shard now keeps every row whose tag carries its cell's stem (view.py), and
    the stem is the cell key's, which names no EvalRun: run2's shards see run1's union row, Finished with a score,
    and are Completed by it (`done`). They never launch; run2's cell, whose rows and dirs are its own only, has no
    union to upload and waits on its "completed" shards for ever: forceEval never runs the benchmark."""
    other = EvalRunRef(name="run2")
    mine = cell(tasks=5, shards=2, evalrun=other)
    assert mine.key == CELL.key  # the same cell in another EvalRun of the namespace: its tags are run1's
    theirs = row("Finished", job_name=CELL.run_tag(1), row_id="row-union-run1", metrics=SCORE, created=ago(hours=5))
    force = POLICY.model_copy(update={"force_eval": True})
    result = plan(other, [mine, *mine.sharded()], [obs(rows=(theirs,))] * 3, force, NOW)
    whole, *shard_plans = result.cells
    assert [type(launch_of(p)).__name__ for p in shard_plans] == ["Submit", "Submit"], (
        [p.reason for p in shard_plans], whole.reason)


# ------------------------------------------------------------------ launches


def test_shards_do_not_launch_while_the_unsharded_run_of_their_cell_runs() -> None:
    """shards: 1 → 2 while the cell's own unsharded job runs (30 h in, 3 of 5 done, a result 5 min ago). K is in the
    sharded cell's key, so the job is named by the unsharded key's stem; found with `former_key` None for a sharded
    cell, it was no cell's of the EvalRun, and the shards, seeing the unsharded row Started 30 h ago under no tag
    of theirs (someone else's, stale), both launched while the benchmark still ran. The sharded cell's former
    identity is now its unsharded key: the job is its own, watched, and its shards wait for it."""
    unsharded = cell(tasks=5)
    assert CELL.former_key == unsharded.key
    tag = unsharded.run_tag(1)
    running = job(tag, JobState.RUNNING, job_id="77", started=ago(hours=30), time_left_s=18 * 3600)
    own = row("Started", job_name=tag, row_id="row-a1", created=ago(hours=30), started=ago(hours=30),
              slurm_job_id="77")
    # what the join gives the sharded cell now: its former key's submission, so that submission's job and run dir
    parent = obs(rows=(own,), subs=(sub(unsharded, 1, job_id="77", row_id=own.id, created=ago(hours=30)),),
                 jobs=(running,), dirs=(facts(tag, total=5, completed=3, finished=False, last_progress=ago(minutes=5)),))
    observed = [parent, obs(rows=(own,)), obs(rows=(own,))]
    whole, *shard_plans = plan(CELL.evalrun, [CELL, *SHARDS], observed, POLICY, NOW).cells
    assert whole.phase == Phase.RUNNING, whole.reason
    assert [launch_of(p) for p in shard_plans] == [None, None], [p.reason for p in shard_plans]


# ------------------------------------------------------------------ the newer Finished row: our own old union


def test_a_retry_of_a_held_union_publishes_the_shards_new_run() -> None:
    """The union's row a1 read back wrong twice: the cell is held, "`evalctl retry` runs the cell again as a new
    attempt with a row of its own" (`unverified`). The retry reaches both shards (`levers.retried`), which run again
    as a2 (their own a2 rows are newer than a1's row, so they are theirs to finish) and are ShardDone. Their union is
    a3, which has no row yet: the union writes none before its upload, so the newest row of the cell is still a1's,
    Finished with (the wrong) metrics. `union_of_shards` now yields to any newer Finished row with metrics, even the
    cell's own earlier union: `done` decides on a1, which is still unverified, and holds again. The retry re-ran the
    whole benchmark and published nothing; every further retry does the same (an unsharded cell's new attempt has
    its own row from submission and uploads)."""
    old = row("Finished", job_name=CELL.run_tag(1), row_id="row-union", metrics=SCORE, created=ago(hours=10))
    unverified = CellMemory(db_unverified=CELL.run_tag(1), db_unverified_uploads=2)
    parent = obs(rows=(old,)).model_copy(update={"memory": unverified})
    held, *_ = plan(CELL.evalrun, [CELL, *SHARDS], [parent, *(again(shard, old, attempts=1) for shard in SHARDS)],
                    POLICY, NOW).cells
    assert held.held and "evalctl retry" in held.reason  # the lever the cell names
    whole, *shard_plans = plan(CELL.evalrun, [CELL, *SHARDS], [parent, *(again(shard, old) for shard in SHARDS)],
                               POLICY, NOW).cells
    assert all(launch_of(p) is None for p in shard_plans), [p.reason for p in shard_plans]
    assert [(u.facts.run_tag, u.row_id) for u in uploads(whole)] == [(CELL.run_tag(3), None)], (
        whole.phase, whole.reason)


def again(shard: Cell, union_row: ObservedRow, *, attempts: int = 2) -> Observation:
    """The shard's attempts 1..`attempts`, each with its own Started row and an admitted dir, the last ended two
    hours ago (a2: run again after the union's row `union_row` was written); its cell's union row among its rows."""
    numbers = range(1, attempts + 1)
    rows = tuple(row("Started", job_name=shard.run_tag(a), row_id=f"row-{shard.run_tag(a)}",
                     created=ago(hours=20 if a == 1 else 4)) for a in numbers)
    subs = tuple(sub(shard, a, job_id=str(100 + a), row_id=f"row-{shard.run_tag(a)}",
                     created=ago(hours=20 if a == 1 else 4)) for a in numbers)
    jobs = tuple(job(shard.run_tag(a), JobState.COMPLETED, job_id=str(100 + a),
                     started=ago(hours=20 if a == 1 else 4), ended=ago(hours=12 if a == 1 else 2)) for a in numbers)
    return obs(rows=(union_row, *rows), subs=subs, jobs=jobs,
               dirs=tuple(shard_dir(shard, a) for a in numbers))


def uploads(cell_plan: CellPlan) -> list[Upload]:
    return [a for a in cell_plan.actions if isinstance(a, Upload)]
