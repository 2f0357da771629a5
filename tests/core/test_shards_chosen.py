"""RULES §17 `ShardsChosen`: with walltime auto and no shards set, a cell whose sized request exceeds maxTimeLimit
runs as the fewest shards whose own requests fit, chosen once before its first launch and kept with the cell."""

from __future__ import annotations

from datetime import timedelta

import pytest

from controller.api.resolve import with_chosen_shards
from controller.core.actions import Submit, Wait
from controller.core.gpu_hours import AttemptCost, SizeBands, estimates
from controller.core.planner import launch_of, plan
from controller.core.planner.allocation import suspended
from controller.core.remedies import CellMemory, ShardChoice
from controller.core.vocabulary import Rule
from controller.core.walltime import WalltimePolicy, shards_needed, wall_estimate
from tests.core.builders import NOW, POLICY, RUN, cell, facts, obs

BANDS = SizeBands(bands=((0, 14),))
EIGHT_HOURS = WalltimePolicy(auto=True, cancel_margin=timedelta(minutes=15), minimum=timedelta(hours=1),
                             maximum=timedelta(hours=8))
AUTO = POLICY.model_copy(update={"walltime": EIGHT_HOURS})
LONG = cell("org/a-8B", tasks=100, may_shard=True)


def history(hours: float) -> list[AttemptCost]:
    return [AttemptCost(run_tag=f"ev_x__a{i}", model="org/x-8B", benchmark="terminal_bench_2", gpu_hours=hours,
                        wall_hours=hours, trials=100) for i in range(3)]


def test_the_fewest_shards_whose_sized_requests_fit_max_time_limit_are_chosen() -> None:
    twenty = wall_estimate([20.0], "3 attempts", with_start=True, scales=True)
    # 3 shards: 34 of 100 tasks, 6.8 h × 1.25 + 15 m cancel = 8 h 45 m > 8 h; 4 shards: 25 tasks, 6 h 30 m
    assert shards_needed(twenty, EIGHT_HOURS, 100) == 4
    assert shards_needed(wall_estimate([4.0], "3 attempts", with_start=True, scales=True), EIGHT_HOURS, 100) is None, "it fits"
    assert shards_needed(None, EIGHT_HOURS, 100) is None, "nothing to go by: the fixed walltime, one job"
    assert shards_needed(twenty, EIGHT_HOURS, 3) == 3, "at most one shard per task"
    assert shards_needed(wall_estimate([1000.0], "3 attempts", with_start=True, scales=True), EIGHT_HOURS, 1000) == 64
    cancel_fills_it = EIGHT_HOURS.model_copy(update={"cancel_margin": timedelta(hours=8, minutes=1)})
    assert shards_needed(twenty, cancel_fills_it, 100) is None, "no shard fits: sharding cannot help"
    whole = twenty.model_copy(update={"scales": False})
    assert shards_needed(whole, EIGHT_HOURS, 100) is None, "attempts of unknown size: a shard's share is not known"


def test_a_measured_server_start_is_paid_by_each_shard_not_divided_among_them() -> None:
    """Each shard starts its own server: with a 2 h start in a 10 h attempt, a half is 2 h + 4 h, not 5 h."""
    started = wall_estimate([10.0], "3 attempts", with_start=True, starts=[2.0], start_basis="measured",
                            scales=True)
    # 2 shards: (2 + 8 × 0.5) × 1.25 + 0.25 = 7.75 h ≤ 8 h; were the start halved too, 10 × 0.5 × 1.25 + .25 = 6.5
    assert shards_needed(started, EIGHT_HOURS, 100) == 2
    tight = EIGHT_HOURS.model_copy(update={"maximum": timedelta(hours=7)})
    assert shards_needed(started, tight, 100) == 3, "2 shards would ask 7 h 45 m: the start is not divided"


def test_a_first_launch_over_max_time_limit_is_the_choice_of_its_shards_remembered_with_the_cell() -> None:
    guesses = estimates([LONG], history(20.0), [], BANDS, gpus_per_job=1)
    [decided] = plan(RUN, [LONG], [obs()], AUTO, NOW, estimates=guesses).cells

    assert decided.rule == Rule.SHARDS_CHOSEN and launch_of(decided) is None
    assert any(isinstance(a, Wait) for a in decided.actions)
    assert decided.remember is not None and decided.remember.shards is not None
    assert decided.remember.shards.count == 4 and decided.remember.shards.at == NOW
    assert "runs as 4 shards of at most 25 tasks" in decided.reason and "maxTimeLimit 8:00:00" in decided.reason
    held = suspended(decided)
    assert held.remember is None, "a suspended EvalRun chooses nothing"
    assert [a.reason for a in held.actions] == [f"suspended; would choose: {decided.reason}"]


def test_what_may_not_shard_launches_as_one_job_cut_at_max_time_limit() -> None:
    guesses = estimates([LONG, cell("org/a-8B", tasks=100)], history(20.0), [], BANDS, gpus_per_job=1)
    pinned = cell("org/a-8B", tasks=100)  # shards set (1), several clusters, or tasks not counted: may_shard False
    fixed = POLICY.model_copy(update={"walltime": EIGHT_HOURS.model_copy(update={"auto": False})})
    for who, policy, asked in ((pinned, AUTO, "8:00:00"), (LONG, fixed, None)):
        [decided] = plan(RUN, [who], [obs()], policy, NOW, estimates=guesses).cells
        (submit,) = [a for a in decided.actions if isinstance(a, Submit)]
        assert decided.remember is None or decided.remember.shards is None
        assert submit.time_limit == asked, "auto: cut at maxTimeLimit and resumed after it; fixed: the cell's"


def test_a_cell_with_a_run_dir_is_never_resharded_and_a_chosen_cell_planned_unsharded_waits() -> None:
    guesses = estimates([LONG], history(20.0), [], BANDS, gpus_per_job=1)
    cut = facts(LONG.run_tag(1), total=100, completed=40, finished=False)
    [resumed] = plan(RUN, [LONG], [obs(dirs=(cut,))], AUTO, NOW, estimates=guesses).cells
    assert resumed.rule != Rule.SHARDS_CHOSEN, "its run dir goes on as one job: a choice would abandon it"

    chosen = CellMemory(shards=ShardChoice(count=4, reason="r", at=NOW))
    [waiting] = plan(RUN, [LONG], [obs().model_copy(update={"memory": chosen})], AUTO, NOW, estimates=guesses).cells
    assert launch_of(waiting) is None, "never unsharded beside the shards its choice runs"


def test_a_chosen_count_turns_the_cell_into_its_shards_and_the_old_key_into_its_former_identity() -> None:
    other = cell("org/b-8B", tasks=100)
    cells = with_chosen_shards([LONG, other], {LONG.key: 4, other.key: 4})

    sharded, *shards, unchanged = cells
    assert sharded.shards == 4 and sharded.former_key == LONG.key and sharded.key != LONG.key
    assert [s.shard.index for s in shards if s.shard is not None] == [0, 1, 2, 3]
    assert [s.tasks for s in shards] == [25, 25, 25, 25] and not any(s.may_shard for s in shards)
    assert unchanged == other, "a cell that may not shard ignores a recorded count"
    assert with_chosen_shards([LONG], {}) == (LONG,)


@pytest.mark.parametrize("count", [1, 0])
def test_a_recorded_count_below_two_changes_nothing(count: int) -> None:
    assert with_chosen_shards([LONG], {LONG.key: count}) == (LONG,)


def test_the_sharded_cell_says_its_estimate_chose_its_shards() -> None:
    """The choice is kept in the unsharded key's memory, the sharded cell's former one: its plan says why."""
    sharded, *shards = with_chosen_shards([LONG], {LONG.key: 2})
    remembered = CellMemory(shards=ShardChoice(count=2, reason="p90 20 h exceeds maxTimeLimit 8:00:00", at=NOW))
    result = plan(RUN, [sharded, *shards], [obs().model_copy(update={"memory": remembered}), obs(), obs()], AUTO, NOW)
    planned = {p.cell.key: p for p in result.cells}[sharded.key]

    assert planned.rule == Rule.SHARDS and launch_of(planned) is None
    assert "runs as 2 shards (2 pending); chosen by its estimate: p90 20 h exceeds" in planned.reason, planned.reason
