"""GPU-hours: the estimator's sources in order, what a cell spent, and spec.budget.maxGpuHours in the planner."""

from __future__ import annotations

from controller.core.actions import Hold, Submit, Upload
from controller.core.gpu_hours import (
    AttemptCost,
    EstimateSource,
    GpuEstimate,
    SizeBands,
    estimates,
    job_of,
)
from controller.core.observed import JobState
from controller.core.planner import plan
from controller.core.types import EvalRunRef
from tests.core.builders import NOW, POLICY, RUN, ago, cell, facts, job, obs, sub

BANDS = SizeBands(bands=((0, 14), (28, 42)))
SMALL, OTHER_SMALL, BIG = cell("org/a-8B"), cell("org/b-7B"), cell("org/c-32B")


def cost(model: str, hours: float, benchmark: str = "terminal_bench_2") -> AttemptCost:
    return AttemptCost(run_tag=f"ev_{model}", model=model, benchmark=benchmark, gpu_hours=hours)


def estimated(hours: float, source: EstimateSource = EstimateSource.HISTORY) -> GpuEstimate:
    return GpuEstimate(hours=hours, source=source, basis="test")


# --------------------------------------------------------------------------- the estimator


def test_history_of_the_same_benchmark_and_size_band_gives_the_median() -> None:
    history = [cost("org/x-8B", 2.0), cost("org/y-14B", 4.0), cost("org/z-1.5B", 30.0),  # 0–14B: median 4
               cost("org/w-32B", 100.0),  # another band
               cost("org/v-8B", 500.0, benchmark="swebench")]  # another benchmark

    found = estimates([SMALL, BIG], history, [], BANDS, gpus_per_job=4)

    assert (found[SMALL.key].hours, found[SMALL.key].source) == (4.0, EstimateSource.HISTORY)
    assert "3 finished attempt(s) of terminal_bench_2, 0–14B" in found[SMALL.key].basis
    assert (found[BIG.key].hours, found[BIG.key].source) == (100.0, EstimateSource.HISTORY)


def test_without_history_similar_run_dirs_give_wall_time_extrapolated_to_all_trials_times_gpus() -> None:
    # started 3 h ago, last result 2 h ago: 1 h for 5 of 10 trials → 2 h for all, × 4 GPUs
    half = facts("ev_b__a1", total=10, completed=5, finished=False, model="org/b-7B",
                 benchmark_name="terminal_bench_2")
    other_band = facts("ev_c__a1", model="org/c-32B", benchmark_name="terminal_bench_2")

    found = estimates([SMALL], [cost("org/w-32B", 100.0)], [half, other_band], BANDS, gpus_per_job=4)

    assert (found[SMALL.key].hours, found[SMALL.key].source) == (8.0, EstimateSource.RUN_DIRS)


def test_nothing_to_go_by_is_unknown_not_zero() -> None:
    unsized = cell("org/mystery-model")

    found = estimates([unsized, SMALL], [cost("org/x-8B", 2.0)], [], BANDS, gpus_per_job=4)

    assert (found[unsized.key].hours, found[unsized.key].source) == (None, EstimateSource.UNKNOWN)
    assert found[SMALL.key].hours == 2.0, "an unsized model is no evidence for a sized one's band"


def test_an_attempt_of_another_size_is_scaled_to_the_cell_s_trials_and_concurrency() -> None:
    """One attempt over 89 tasks, 8 at a time, is no estimate for three attempts per task 16 at a time: 3 × the
    trials at twice the concurrency take 1.5 × as long. Unscaled, a sized job asked for a third of what it needed
    and was cut, resumed and cut again."""
    one = AttemptCost(run_tag="ev_x__a1", model="org/x-8B", benchmark="terminal_bench_2", gpu_hours=16.0,
                      wall_hours=4.0, trials=89, concurrency=8)
    three, same = cell("org/a-8B", tasks=89, n_attempts=3, n_concurrent=16), cell("org/b-8B", tasks=89)
    unknown = cell("org/c-8B")  # the catalog does not know its task count: nothing to scale by

    found = estimates([three, same, unknown], [one], [], BANDS, gpus_per_job=4)

    assert found[three.key].hours == 24.0 and found[three.key].wall is not None
    assert found[three.key].wall.median_hours == 6.0
    assert found[three.key].basis.endswith("of terminal_bench_2, 0–14B, scaled to 267 trials at 16 at a time")
    assert (found[same.key].hours, found[unknown.key].hours) == (16.0, 16.0)
    assert "scaled" not in found[same.key].basis


def test_a_measured_server_start_is_not_scaled_with_the_trials() -> None:
    """Every job pays its server start once, whatever its size: 0.5 h of the 4.5 h attempt stays 0.5 h."""
    one = AttemptCost(run_tag="ev_x__a1", model="org/x-8B", benchmark="terminal_bench_2", gpu_hours=18.0,
                      wall_hours=4.5, trials=89, concurrency=8)
    measured = facts("ev_y__a1", model="org/y-8B", benchmark_name="terminal_bench_2")  # its first trial 3 h ago
    first_job = job("ev_y__a1", JobState.COMPLETED, started=ago(hours=3.5))
    three = cell("org/a-8B", tasks=89, n_attempts=3)

    found = estimates([three], [one], [measured], BANDS, gpus_per_job=4, jobs=[first_job])

    wall = found[three.key].wall
    assert wall is not None and wall.start_hours == 0.5 and wall.median_hours == 12.5  # 0.5 + 4.0 × 3
    assert found[three.key].hours == 50.0  # 0.5 h × 4 GPUs + 16 × 3


def test_a_size_outside_every_band_compares_only_with_that_size() -> None:
    assert BANDS.band_of("org/m-70B") == "70B" != BANDS.band_of("org/n-72B")
    assert BANDS.band_of("Qwen3-30B-A3B") == "28–42B", "the largest size token wins, as in the size policy"


# --------------------------------------------------------------------------- actual hours


def test_an_ended_jobs_gpu_hours_are_recorded_and_summed_per_cell_and_carried_to_the_upload() -> None:
    first, resumed = sub(SMALL, 1, 1, job_id="100"), sub(SMALL, 1, 2, job_id="101")
    recorded = first.model_copy(update={"gpu_hours": 3.0})
    ended = job(resumed.name, JobState.COMPLETED, job_id="101", started=ago(hours=3), ended=ago(hours=2))
    ended = ended.model_copy(update={"gpu_hours": 1.5})

    cell_plan = plan(RUN, [SMALL], [obs(subs=(recorded, resumed), jobs=(ended,),
                                        dirs=(facts(SMALL.run_tag(1), fires=2),))], POLICY, NOW).cells[0]

    assert cell_plan.gpu_hours == 4.5
    recordings = [(u.submission_name, u.gpu_hours) for u in cell_plan.row_updates if u.gpu_hours is not None]
    assert recordings == [(resumed.name, 1.5)], "only what is not recorded yet; the recorded one stays"
    (upload,) = [a for a in cell_plan.actions if isinstance(a, Upload)]
    assert upload.gpu_hours == 4.5


def test_a_running_job_is_not_recorded_yet() -> None:
    running = job(SMALL.run_tag(1), JobState.RUNNING, started=ago(hours=1)).model_copy(update={"gpu_hours": 4.0})

    cell_plan = plan(RUN, [SMALL], [obs(subs=(sub(SMALL),), jobs=(running,))], POLICY, NOW).cells[0]

    assert cell_plan.gpu_hours == 4.0, "what it has used so far is spent"
    assert not [u for u in cell_plan.row_updates if u.gpu_hours is not None]


# --------------------------------------------------------------------------- spec.budget.maxGpuHours


def test_a_launch_past_the_budget_is_held_with_the_numbers() -> None:
    spent = sub(SMALL).model_copy(update={"gpu_hours": 380.0})
    done = obs(subs=(spent,), jobs=(), dirs=(facts(SMALL.run_tag(1)),))
    policy = POLICY.model_copy(update={"max_gpu_hours": 400.0})

    the_plan = plan(RUN, [SMALL, OTHER_SMALL], [done, obs()], policy, NOW,
                    estimates={OTHER_SMALL.key: estimated(32.0)})

    held = the_plan.cells[1]
    assert not [a for a in held.actions if isinstance(a, Submit)], "never launched past the budget"
    (hold,) = [a for a in held.actions if isinstance(a, Hold)]
    assert hold.reason.startswith("budget: 412 of 400 GPU-h (spent 380, est. 32 for this launch")
    assert (the_plan.gpu_budget.spent, the_plan.gpu_budget.held) == (380.0, 1)


def test_launches_share_the_budget_in_cell_order_and_count_what_live_cells_still_need() -> None:
    cells = [SMALL, OTHER_SMALL, BIG, cell("org/d-8B")]
    running = job(SMALL.run_tag(1), JobState.RUNNING, started=ago(hours=1)).model_copy(update={"gpu_hours": 10.0})
    policy = POLICY.model_copy(update={"max_gpu_hours": 100.0})
    guesses = {c.key: estimated(40.0) for c in cells}

    the_plan = plan(RUN, cells, [obs(subs=(sub(SMALL),), jobs=(running,)), obs(), obs(), obs()], policy, NOW,
                    estimates=guesses)

    # 10 spent + 30 still to come for the running cell + 40 for the first launch = 80; a second launch would be 120
    launched = [c.cell.model for c in the_plan.cells if any(isinstance(a, Submit) for a in c.actions)]
    held = [c.cell.model for c in the_plan.cells if any(isinstance(a, Hold) for a in c.actions)]
    assert launched == ["org/b-7B"]
    assert held == ["org/c-32B", "org/d-8B"]
    assert the_plan.gpu_budget.committed == 80.0


def unknown(group: str = "terminal_bench_2, 0–14B") -> GpuEstimate:
    return GpuEstimate(hours=None, source=EstimateSource.UNKNOWN, basis="test", group=group)


def test_another_evalruns_live_job_of_a_shared_cell_is_not_this_evalruns_to_budget() -> None:
    """Two EvalRuns of one namespace share a cell (same key); the other one's job runs it. What it still needs is
    the other EvalRun's budget: counted here, it held this EvalRun's own launches."""
    theirs = sub(SMALL).model_copy(update={"evalrun": EvalRunRef(name="other")})
    running = job(SMALL.run_tag(1), JobState.RUNNING, started=ago(hours=1))
    policy = POLICY.model_copy(update={"max_gpu_hours": 50.0})
    guesses = {c.key: estimated(40.0) for c in (SMALL, OTHER_SMALL)}

    the_plan = plan(RUN, [SMALL, OTHER_SMALL], [obs(subs=(theirs,), jobs=(running,)), obs()], policy, NOW,
                    estimates=guesses)

    assert the_plan.gpu_budget.committed == 40.0, "only this EvalRun's own launch"
    assert any(isinstance(a, Submit) for a in the_plan.cells[1].actions), the_plan.cells[1].reason


def test_an_unknown_estimate_launches_one_probe_per_group_and_its_group_waits_for_the_number() -> None:
    """8 cells of a benchmark with no history under a budget far below one job: one probe, not 8 launches."""
    cells = [cell(f"org/m{i}-8B") for i in range(8)]
    policy = POLICY.model_copy(update={"max_gpu_hours": 0.05, "gpus_per_job": 1})

    the_plan = plan(RUN, cells, [obs() for _ in cells], policy, NOW, estimates={c.key: unknown() for c in cells})

    launched = [c for c in the_plan.cells if any(isinstance(a, Submit) for a in c.actions)]
    held = [a for c in the_plan.cells for a in c.actions if isinstance(a, Hold)]
    assert len(launched) == 1 and "GPU-hour probe for terminal_bench_2, 0–14B" in launched[0].reason
    assert len(held) == 7 and all("a probe job of it is measuring the cost" in h.reason for h in held)
    assert the_plan.gpu_budget.committed == 24.0, "counted as its walltime × GPUs, not 0"


def test_a_live_probe_keeps_its_group_waiting_and_counts_its_walltime_less_what_it_used() -> None:
    probe, other = cell("org/a-8B"), cell("org/b-8B")
    running = job(probe.run_tag(1), JobState.RUNNING, started=ago(hours=1)).model_copy(update={"gpu_hours": 1.0})
    policy = POLICY.model_copy(update={"max_gpu_hours": 100.0, "gpus_per_job": 1})

    the_plan = plan(RUN, [probe, other], [obs(subs=(sub(probe),), jobs=(running,)), obs()], policy, NOW,
                    estimates={probe.key: unknown(), other.key: unknown()})

    (hold,) = [a for a in the_plan.cells[1].actions if isinstance(a, Hold)]
    assert "a probe job of it is measuring the cost" in hold.reason
    assert the_plan.gpu_budget.committed == 1.0 + 23.0


def test_another_group_probes_only_while_budget_is_left() -> None:
    tb2, swe = cell("org/a-8B"), cell("org/a-8B", benchmark_name="swebench")
    policy = POLICY.model_copy(update={"max_gpu_hours": 10.0, "gpus_per_job": 1})
    spent = sub(SMALL).model_copy(update={"gpu_hours": 10.0})
    done = obs(subs=(spent,), dirs=(facts(SMALL.run_tag(1)),))

    the_plan = plan(RUN, [SMALL, tb2, swe], [done, obs(), obs()], policy, NOW,
                    estimates={tb2.key: unknown(), swe.key: unknown("swebench, 0–14B")})

    holds = [a.reason for c in the_plan.cells[1:] for a in c.actions if isinstance(a, Hold)]
    assert len(holds) == 2 and all("budget: 10 of 10 GPU-h (spent 10, no estimate for this launch" in h
                                   for h in holds)


def test_spent_passes_the_budget_by_at_most_one_job() -> None:
    """Probe, then launches by the measured estimate: what is committed never passes the budget by more than the
    probe itself."""
    probe, rest = cell("org/a-8B"), [cell(f"org/r{i}-8B") for i in range(5)]
    measured = sub(probe).model_copy(update={"gpu_hours": 0.045})
    policy = POLICY.model_copy(update={"max_gpu_hours": 0.05, "gpus_per_job": 1})

    the_plan = plan(RUN, [probe, *rest], [obs(subs=(measured,), dirs=(facts(probe.run_tag(1)),)),
                                          *(obs() for _ in rest)], policy, NOW,
                    estimates={c.key: estimated(0.045) for c in rest})

    assert not [c for c in the_plan.cells if any(isinstance(a, Submit) for a in c.actions)]
    assert the_plan.gpu_budget.committed <= 0.05


def test_a_resume_costs_the_share_of_trials_left() -> None:
    half = facts(SMALL.run_tag(1), total=10, completed=5, finished=False, last_progress=ago(hours=3))
    cancelled = job(SMALL.run_tag(1), JobState.TIMEOUT, started=ago(hours=4), ended=ago(hours=3))
    policy = POLICY.model_copy(update={"max_gpu_hours": 25.0})

    the_plan = plan(RUN, [SMALL], [obs(subs=(sub(SMALL),), jobs=(cancelled,), dirs=(half,))], policy, NOW,
                    estimates={SMALL.key: estimated(40.0)})

    assert [a.kind.value for a in the_plan.cells[0].actions] == ["resume"], "half of 40 fits in 25"
    assert the_plan.gpu_budget.committed == 20.0


def test_no_budget_holds_nothing_whatever_the_estimate() -> None:
    the_plan = plan(RUN, [SMALL], [obs()], POLICY, NOW, estimates={SMALL.key: estimated(1e6)})

    assert any(isinstance(a, Submit) for a in the_plan.cells[0].actions)


def test_a_job_of_another_name_with_the_same_id_is_not_the_submissions_job() -> None:
    """Job ids are per cluster: after a spill, fire 1 (job 7 on a, never started) and fire 2 (job 7 on b) share an
    id; b's job is fire 2's alone, or its hours would be counted twice."""
    first, second = sub(SMALL, 1, 1, job_id="7"), sub(SMALL, 1, 2, job_id="7")
    on_b = job(second.name, JobState.COMPLETED, job_id="7", started=ago(hours=3), ended=ago(hours=1))

    assert job_of(first, [on_b]) is None and job_of(second, [on_b]) == on_b
