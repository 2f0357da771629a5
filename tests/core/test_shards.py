"""RULES §17: a cell run as shards. Each shard launches, resumes and refires as a cell of its own and uploads
nothing; the cell launches nothing and uploads the union of its shards' admitted run dirs, as one row."""

from __future__ import annotations

from controller.core.actions import Hold, Submit, Upload
from controller.core.admission import Admitted
from controller.core.identity import identity_differences
from controller.core.job_env import JobSecrets, JobSettings, job_environment
from controller.core.observed import JobState, Metric, Observation, Recorded, RunDirFacts
from controller.core.planner import launch_of, plan
from controller.core.planner.rules_upload import admit_dir
from controller.core.planner.view import cell_view
from controller.core.types import Cell
from controller.core.vocabulary import CellPlan, Phase, Rule
from tests.core.builders import NOW, POLICY, RUN, ago, cell, facts, job, obs, row, sub

CELL = cell(tasks=5, shards=2)
SHARDS = CELL.sharded()
SETTINGS = JobSettings(username="alice", jobs_dir="/jobs", gpu_memory_util=0.9, infra_error_threshold=3)
REWARDS = {f"task-{i}": reward for i, reward in enumerate((1.0, 0.0, 1.0, 1.0, 0.0))}


def shard_dir(shard: Cell, attempt: int = 1, *, claimed: str | None = None, answered: bool = True) -> RunDirFacts:
    """What the job script and Harbor leave for shard i/K: every K-th task from the i-th, its meta.env SHARD and
    config.json task names, each trial scored with the fixture's reward."""
    assert shard.shard is not None
    names = sorted(REWARDS)[shard.shard.index::shard.shard.count]
    base = facts(shard.run_tag(attempt), total=len(names), completed=len(names))
    said = claimed or f"shard {shard.shard}"
    return base.model_copy(update={
        "tasks": {name: (1, 1, REWARDS[name]) for name in names}, "reward_sum": sum(REWARDS[n] for n in names),
        "n_answered": len(names) if answered else 0,
        "recorded": (Recorded(what="tasks", value=said, source="meta.env"),
                     Recorded(what="tasks", value=f"task_names ({len(names)})", source="config.json"),
                     Recorded(what="model", value=shard.model, source="config.json"))})


def ended(shard: Cell, dirs: tuple[RunDirFacts, ...], attempt: int = 1) -> Observation:
    """The shard's job ended two hours ago; its own row Started (a shard's row never gets a score)."""
    tag = shard.run_tag(attempt)
    return obs(rows=(row("Started", job_name=tag, row_id=f"row-{tag}"),), subs=(sub(shard, attempt, row_id=f"row-{tag}"),),
               jobs=(job(tag, JobState.COMPLETED, started=ago(hours=4), ended=ago(hours=2)),), dirs=dirs)


def running(shard: Cell) -> Observation:
    tag = shard.run_tag(1)
    progress = facts(tag, total=2, completed=1, finished=False, last_progress=ago(minutes=2))
    return obs(rows=(row("Started", job_name=tag, row_id=f"row-{tag}"),), subs=(sub(shard, row_id=f"row-{tag}"),),
               jobs=(job(tag, JobState.RUNNING, started=ago(hours=1), time_left_s=36_000),), dirs=(progress,))


def planned(*observations: Observation) -> dict[str, CellPlan]:
    result = plan(RUN, [CELL, *SHARDS], list(observations), POLICY, NOW)
    return {p.cell.label: p for p in result.cells}


def test_a_sharded_cell_launches_nothing_itself_and_each_shard_launches_once() -> None:
    plans = planned(obs(), obs(), obs())
    assert launch_of(plans[CELL.label]) is None
    assert plans[CELL.label].rule == Rule.SHARDS
    assert "runs as 2 shards (2 pending)" in plans[CELL.label].reason
    launches = [launch_of(plans[shard.label]) for shard in SHARDS]
    assert [type(action) for action in launches] == [Submit, Submit]
    assert {action.run_tag for action in launches if action} == {shard.run_tag(1) for shard in SHARDS}


def test_shards_are_cells_of_their_own_over_disjoint_task_shares() -> None:
    assert [str(shard.shard) for shard in SHARDS] == ["0/2", "1/2"]
    assert [shard.tasks for shard in SHARDS] == [3, 2]  # 5 tasks: every 2nd from the 0th, from the 1st
    assert len({CELL.key, *(shard.key for shard in SHARDS)}) == 3
    assert len({CELL.tag_stem, *(shard.tag_stem for shard in SHARDS)}) == 3
    assert all(shard.shard and shard.shard.parent == CELL.key for shard in SHARDS)
    env = job_environment(SHARDS[1], Submit(reason="", run_tag=SHARDS[1].run_tag(1), attempt=1), "row",
                          SETTINGS, JobSecrets())
    assert env["EVAL_SHARD"] == "1/2"
    unsharded = job_environment(CELL, Submit(reason="", run_tag=CELL.run_tag(1), attempt=1), "row", SETTINGS,
                                JobSecrets())
    assert "EVAL_SHARD" not in unsharded


def test_a_shard_dir_is_the_shards_run_and_no_other_cells() -> None:
    own = shard_dir(SHARDS[0])
    assert identity_differences(SHARDS[0], own) == []
    assert identity_differences(SHARDS[0], shard_dir(SHARDS[0], claimed="shard 1/2"))  # the other shard's
    assert identity_differences(CELL, own)  # part of the dataset: never the cell's own run


def test_a_done_shard_waits_for_the_others_and_the_cell_says_how_far_they_are() -> None:
    plans = planned(obs(), ended(SHARDS[0], (shard_dir(SHARDS[0]),)), running(SHARDS[1]))
    done = plans[SHARDS[0].label]
    assert done.rule == Rule.SHARD_DONE and done.phase == Phase.EVALUATED
    assert not any(isinstance(action, Upload) for action in done.actions)
    whole = plans[CELL.label]
    assert whole.phase == Phase.RUNNING and "1 done, 1 running" in whole.reason
    assert not any(isinstance(action, Upload) for action in whole.actions)


def test_once_every_shard_is_admitted_the_cell_uploads_their_union_as_one_row() -> None:
    plans = planned(obs(), *(ended(shard, (shard_dir(shard),)) for shard in SHARDS))
    [upload] = [action for action in plans[CELL.label].actions if isinstance(action, Upload)]
    union = upload.facts
    assert union.run_tag == CELL.run_tag(1) and upload.row_id is None  # a row of the cell's own, made at upload
    assert union.tasks == {name: (1, 1, reward) for name, reward in REWARDS.items()}
    assert union.shards == tuple(f"/jobs/{shard.run_tag(1)}" for shard in SHARDS)
    assert (union.n_completed, union.n_scored, union.n_total) == (5, 5, 5)
    # the same trials run unsharded: one dir of the cell with the fixture's rewards
    whole = facts(CELL.run_tag(1), total=5, completed=5).model_copy(update={
        "tasks": {name: (1, 1, reward) for name, reward in REWARDS.items()}, "reward_sum": sum(REWARDS.values())})
    unsharded = admit_dir(cell_view(CELL, obs(dirs=(whole,)), POLICY, NOW), whole, can_resume=False)
    assert isinstance(unsharded, Admitted) and upload.admitted.score == unsharded.score == 0.6
    assert all(plans[shard.label].rule == Rule.SHARD_DONE for shard in SHARDS)


def test_the_unions_row_settles_every_shard_and_the_cell() -> None:
    union_row = row("Finished", job_name=CELL.run_tag(1), row_id="row-union",
                    metrics=(Metric(name="accuracy", value=0.6),), created=ago(minutes=5))
    observed = [obs(rows=(union_row,))]
    for shard in SHARDS:
        own = ended(shard, (shard_dir(shard),))
        observed.append(own.model_copy(update={"rows": (*(own.rows or ()), union_row)}))
    plans = planned(*observed)
    assert {plans[label].phase for label in plans} == {Phase.COMPLETED}
    assert all(launch_of(p) is None for p in plans.values())


def test_a_dead_shard_is_refired_alone_and_the_cell_waits() -> None:
    dead = shard_dir(SHARDS[1], answered=False)
    plans = planned(obs(), ended(SHARDS[0], (shard_dir(SHARDS[0]),)), ended(SHARDS[1], (dead,)))
    refire = launch_of(plans[SHARDS[1].label])
    assert isinstance(refire, Submit) and refire.run_tag == SHARDS[1].run_tag(2)
    assert plans[SHARDS[0].label].rule == Rule.SHARD_DONE and launch_of(plans[SHARDS[0].label]) is None
    assert not any(isinstance(action, Upload) for action in plans[CELL.label].actions)


def test_a_retried_shards_newest_run_replaces_its_earlier_one_in_the_union() -> None:
    second = shard_dir(SHARDS[1], attempt=2)
    again = ended(SHARDS[1], (shard_dir(SHARDS[1]), second), attempt=2)
    plans = planned(obs(), ended(SHARDS[0], (shard_dir(SHARDS[0]),)), again)
    [upload] = [action for action in plans[CELL.label].actions if isinstance(action, Upload)]
    assert upload.facts.run_tag == CELL.run_tag(2)  # another union: another row
    assert f"/jobs/{SHARDS[1].run_tag(2)}" in upload.facts.shards


def test_shards_that_share_a_task_make_no_union_and_a_human_looks() -> None:
    tasks = {"task-1": (1, 1, 0.0), "task-0": (1, 1, 1.0)}  # as many as its share, one of them shard 0's
    overlapping = shard_dir(SHARDS[1]).model_copy(update={"tasks": tasks})
    plans = planned(obs(), ended(SHARDS[0], (shard_dir(SHARDS[0]),)), ended(SHARDS[1], (overlapping,)))
    whole = plans[CELL.label]
    assert whole.phase == Phase.FAILED and any(isinstance(action, Hold) for action in whole.actions)
    assert "share tasks (task-0)" in whole.reason


def with_infra(run: RunDirFacts, task: str) -> RunDirFacts:
    """One of the shard's trials an infra error (no reward): no measurement of the model."""
    tasks = {**run.tasks, task: (1, 0, 0.0)}
    return run.model_copy(update={"tasks": tasks, "n_infra_errors": 1, "n_scored": run.n_scored - 1,
                                  "n_graded": run.n_graded - 1, "reward_sum": sum(t[2] for t in tasks.values())})


def test_the_infra_share_is_the_unions_to_judge_not_a_shards() -> None:
    """One infra error in a shard of 2 tasks is half of it; of the benchmark's 5, a fifth: more than the policy's
    0.1 allows, so the union is held with the gate's levers (never resumed: only shards run), while the shard itself
    is done."""
    infra = with_infra(shard_dir(SHARDS[1]), "task-1")
    plans = planned(obs(), ended(SHARDS[0], (shard_dir(SHARDS[0]),)), ended(SHARDS[1], (infra,)))
    assert plans[SHARDS[1].label].rule == Rule.SHARD_DONE
    whole = plans[CELL.label]
    assert whole.phase == Phase.FAILED and any(isinstance(action, Hold) for action in whole.actions)
    assert whole.rule == Rule.ADMISSION_INFRA_SHARE and "1 of 5 trials are infra" in whole.reason
    assert launch_of(whole) is None
    lenient = POLICY.model_copy(update={"admission": POLICY.admission.model_copy(update={"max_infra_fraction": 0.25})})
    result = plan(RUN, [CELL, *SHARDS], [obs(), ended(SHARDS[0], (shard_dir(SHARDS[0]),)),
                                          ended(SHARDS[1], (infra,))], lenient, NOW)
    [upload] = [a for p in result.cells if p.cell == CELL for a in p.actions if isinstance(a, Upload)]
    assert upload.admitted.score == 0.75  # 3 of the 4 measured trials; the infra one left out, as unsharded


def test_the_unions_upload_carries_its_shards_gpu_hours() -> None:
    observed = []
    for hours, shard in zip((2.0, 3.5), SHARDS, strict=True):
        own = ended(shard, (shard_dir(shard),))
        observed.append(own.model_copy(update={"submissions": tuple(
            s.model_copy(update={"gpu_hours": hours}) for s in own.submissions or ())}))
    plans = planned(obs(), *observed)
    [upload] = [action for action in plans[CELL.label].actions if isinstance(action, Upload)]
    assert upload.gpu_hours == 5.5
