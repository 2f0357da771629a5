"""Fourth review of shards (RULES §17, commit 5c4770a): cases the sharded path gets wrong after the third review's
fixes. Each test fails on main.

Planner-level, over the observations `tests/core/test_shards.py` builds: a cell of 5 tasks run as 2 shards, each
shard's run dir the one the job script and Harbor leave for its subset.
"""

from __future__ import annotations

from controller.core.observed import JobState, Metric, Observation, RunDirFacts
from controller.core.planner import launch_of, plan
from controller.core.retry import RetryRequest
from controller.core.types import Cell
from controller.core.vocabulary import Rule
from tests.core.builders import NOW, POLICY, RUN, ago, cell, facts, job, obs, row, sub
from tests.core.test_shards import CELL, REWARDS, SHARDS, ended, shard_dir

SCORE = (Metric(name="accuracy", value=0.6), Metric(name="n_valid_trials", value=5.0))
UNSHARDED = cell(tasks=5)
FORCE = POLICY.model_copy(update={"force_eval": True})


def whole_run(tag: str) -> RunDirFacts:
    """The unsharded run dir of every task, with the fixture's rewards."""
    return facts(tag, total=5, completed=5, last_progress=ago(hours=2)).model_copy(update={
        "tasks": {name: (1, 1, reward) for name, reward in REWARDS.items()}, "reward_sum": sum(REWARDS.values())})


# ------------------------------------------------------------------ the former run, uploaded: forceEval


def test_under_force_eval_shards_do_not_run_the_benchmark_again_after_the_cells_own_run_is_uploaded() -> None:
    """forceEval: the cell's own run from before it was sharded (its former identity, RULES §17) completed and was
    uploaded into its own row, Finished with a score: the cell is Completed. "A run that completes is uploaded into
    its own row, which settles the shards", but under forceEval a shard sees only its own rows (`cell_view`), and
    `following` holds its launch only while the cell's job runs or it plans an Upload: the next pass both shards
    submit and run the whole benchmark a second time, whose union is then uploaded as a second row."""
    tag = UNSHARDED.run_tag(1)
    done = row("Finished", job_name=tag, row_id="row-a1", metrics=SCORE, created=ago(hours=30),
               started=ago(hours=30), slurm_job_id="77")
    parent = obs(rows=(done,), subs=(sub(UNSHARDED, 1, job_id="77", row_id=done.id, created=ago(hours=30)),),
                 jobs=(job(tag, JobState.COMPLETED, job_id="77", started=ago(hours=30), ended=ago(hours=1)),),
                 dirs=(whole_run(tag),))
    _, *shard_plans = plan(RUN, [CELL, *SHARDS], [parent, obs(rows=(done,)), obs(rows=(done,))], FORCE, NOW).cells
    assert [launch_of(p) for p in shard_plans] == [None, None], [p.reason for p in shard_plans]


# ------------------------------------------------------------------ the former run's hold, a retry, running shards


def test_a_retry_of_a_cell_held_by_its_unsharded_run_does_not_launch_shards_beside_their_live_jobs() -> None:
    """The cell ran unsharded before shards: 2; that job 77 failed before any trial ran. Its former identity makes
    the hold the sharded cell's (`JobFailedAtStart`, Failed, "`evalctl retry`"), while its shards run fine:
    `through_shards` replaces only a launch, so the cell shows the stale hold. A human pulls the lever it names:
    `levers.retried` records a request for each shard, each shard's own plan keeps it (not held: its job runs), and
    `following` releases it against the cell's hold: each shard submits a2 beside its live a1 job."""
    tag = UNSHARDED.run_tag(1)
    own = row("Started", job_name=tag, row_id="row-a1", created=ago(hours=30), started=ago(hours=30),
              slurm_job_id="77")
    failed = job(tag, JobState.FAILED, job_id="77", started=ago(hours=30), ended=ago(hours=29))
    parent = obs(rows=(own,), subs=(sub(UNSHARDED, 1, job_id="77", row_id=own.id, created=ago(hours=30)),),
                 jobs=(failed,))

    def running(index: int, shard: Cell) -> Observation:
        shard_tag = shard.run_tag(1)
        progress = facts(shard_tag, total=shard.tasks, completed=1, finished=False, last_progress=ago(minutes=2))
        return obs(rows=(own, row("Started", job_name=shard_tag, row_id=f"row-{shard_tag}", created=ago(hours=2),
                                  started=ago(hours=2))),
                   subs=(sub(shard, row_id=f"row-{shard_tag}", created=ago(hours=2), job_id=f"9{index}"),),
                   jobs=(job(shard_tag, JobState.RUNNING, job_id=f"9{index}", started=ago(hours=1),
                             time_left_s=36_000),), dirs=(progress,))

    observed = [parent, *(running(index, shard) for index, shard in enumerate(SHARDS))]
    whole, *_ = plan(RUN, [CELL, *SHARDS], observed, POLICY, NOW).cells
    assert whole.held
    requests = [RetryRequest(id=f"r{n}", cell_key=s.key, evalrun=RUN, requested_by="alice",
                             requested_at=ago(minutes=5)) for n, s in enumerate(SHARDS)]
    again = plan(RUN, [CELL, *SHARDS], [parent, *(o.model_copy(update={"retries": (r,)}) for o, r in
                                                 zip(observed[1:], requests, strict=True))], POLICY, NOW).cells
    assert [launch_of(p) for p in again[1:]] == [None, None], [p.reason for p in again[1:]]


# ------------------------------------------------------------------ ShardsAgain, one shard's launch deferred


def test_under_force_eval_a_cleared_union_reruns_every_shard_even_when_one_launch_waits_a_pass() -> None:
    """forceEval: the union's row was cleared (RULES §2), so each shard gets a Submit (ShardsAgain, read from the
    cell's rows, which a shard under forceEval does not see). The per-pass launch budget (1 here) lets shard 1
    through and defers shard 2. The signal was the union's, so next pass, shard 1 running a2, there was none; shard
    2 was ShardDone on its a1 for good, and once shard 1's a2 ended the cell uploaded a union of shard 1's a2 and
    shard 2's a1: half of the run a human cleared published again. (A crash between the two intents did the same.)
    Now a shard's run older than the cleared row is in no union, and that shard runs again."""
    cleared = row("Finished", job_name=CELL.run_tag(1), row_id="row-union", created=ago(hours=1))
    first = [obs(rows=(cleared,)), *(ended(shard, (shard_dir(shard),)) for shard in SHARDS)]
    whole, *shard_plans = plan(RUN, [CELL, *SHARDS], first, FORCE, NOW, budget=1).cells
    assert launch_of(whole) is None and shard_plans[0].rule == Rule.SHARDS_AGAIN, shard_plans[0].reason
    assert [type(launch_of(p)).__name__ for p in shard_plans] == ["Submit", "NoneType"]
    tag = SHARDS[0].run_tag(2)
    relaunched = first[1].model_copy(update={
        "rows": (*(first[1].rows or ()), row("Started", job_name=tag, row_id=f"row-{tag}", created=ago(minutes=30),
                                       started=ago(minutes=20))),
        "subs": (*(first[1].submissions or ()), sub(SHARDS[0], 2, job_id="200", row_id=f"row-{tag}",
                                              created=ago(minutes=30))),
        "jobs": (*(first[1].jobs or ()), job(tag, JobState.RUNNING, job_id="200", started=ago(minutes=20),
                                       time_left_s=36_000))})
    second = [first[0], relaunched, first[2]]
    _, *shard_plans = plan(RUN, [CELL, *SHARDS], second, FORCE, NOW).cells
    assert type(launch_of(shard_plans[1])).__name__ == "Submit", shard_plans[1].reason


# ------------------------------------------------------------------ the former run, done: upload.db off


def test_with_upload_db_off_shards_do_not_run_the_benchmark_again_beside_the_cells_own_completed_run() -> None:
    """upload.db off: the cell's own run from before it was sharded ended complete (5 of 5); the cell's plan is its
    post-eval report (Analyze, then Completed by `analyzed_run_tag`), not an Upload, so `own_run` is None and the
    shards, seeing the unsharded row Started 30 h ago as someone else's stale row, both submit: the benchmark runs
    a second time after the cell is done with it. (With the row fresh they submit once the cell is Completed and
    the row goes stale: a shard never sees that the cell is done.)"""
    no_db = POLICY.model_copy(update={"may_upload": False})
    tag = UNSHARDED.run_tag(1)
    own = row("Started", job_name=tag, row_id="row-a1", created=ago(hours=30), started=ago(hours=30),
              slurm_job_id="77")
    parent = obs(rows=(own,), subs=(sub(UNSHARDED, 1, job_id="77", row_id=own.id, created=ago(hours=30)),),
                 jobs=(job(tag, JobState.COMPLETED, job_id="77", started=ago(hours=30), ended=ago(hours=1)),),
                 dirs=(whole_run(tag),))
    _, *shard_plans = plan(RUN, [CELL, *SHARDS], [parent, obs(rows=(own,)), obs(rows=(own,))], no_db, NOW).cells
    assert [launch_of(p) for p in shard_plans] == [None, None], [p.reason for p in shard_plans]
