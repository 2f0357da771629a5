"""`spec.walltime: auto` (RULES §16): each job's --time from what attempts alike took, within the cluster's bounds;
the fixed walltime where nothing says, and always with `fixed`. Pure."""

from __future__ import annotations

from datetime import timedelta

import pytest

from controller.core.actions import Resume, Submit
from controller.core.gpu_hours import AttemptCost, SizeBands, estimates
from controller.core.observed import JobState, Submission
from controller.core.planner import plan
from controller.core.types import Cell, EvalRunRef
from controller.core.walltime import WalltimePolicy, clock, learned, learned_from, sized, wall_estimate
from tests.core.builders import NOW, POLICY, RUN, ago, cell, facts, job, obs, row, sub

BANDS = SizeBands(bands=((0, 14),))
AUTO = WalltimePolicy(auto=True, cancel_margin=timedelta(minutes=15), minimum=timedelta(hours=1),
                      maximum=timedelta(hours=48))
SMALL = cell("org/a-8B")


def attempt(hours: float, model: str = "org/x-8B") -> AttemptCost:
    return AttemptCost(run_tag=f"ev_{model}_{hours}", model=model, benchmark="terminal_bench_2", gpu_hours=hours)


def test_the_p90_and_median_are_read_by_nearest_rank_not_averaged_away() -> None:
    estimate = wall_estimate([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 30.0], "10 attempts")

    assert estimate is not None
    assert (estimate.median_hours, estimate.high_hours) == (5.5, 9.0)
    assert wall_estimate([], "none") is None


def test_a_sized_request_is_the_p90_times_the_margin_plus_a_cold_start_and_the_cancel_margin() -> None:
    estimate = wall_estimate([2.0, 2.5, 3.0], "3 finished attempt(s) of tb2, 0–14B")

    request = sized(estimate, 1.0, AUTO, "24:00:00")

    assert request is not None
    assert request.time_limit == "4:15:00", "p90 3 h × 1.25 + 15 min cold start + 15 min pre-walltime cancel"
    assert request.note.startswith("walltime auto: 4:15:00 = p90 3 h 00 m × 1.25 + 15 m server start (assumed) + "
                                   "15 m pre-walltime cancel; est. 2 h 30 m (median) from 3 finished attempt(s)")


def test_a_resume_of_a_few_trials_still_asks_for_its_start_and_the_cancel_margin() -> None:
    """Asked for its share alone, a resume of 1 % of a 4 h run got 2.4 min: less than its own server start, cut
    before a trial ran, and resumed again (`make bench-walltime`: a cell of 23 jobs)."""
    request = sized(wall_estimate([4.0], "1 attempt"), 0.01, AUTO.model_copy(update={"minimum": timedelta(0)}), "")

    assert request is not None and request.time_limit == "0:45:00", "3 min of trials + 15 start + 15 cancel, ↑ 15"


@pytest.mark.parametrize(("hours", "remaining", "expected", "said"), [
    (0.01, 1.0, "1:00:00", "(minTimeLimit)"),  # 31 min in all: the cluster's minimum is 1 h
    (60.0, 1.0, "48:00:00", "(maxTimeLimit: resumed after it)"),  # never past what the partition allows
    (8.0, 0.25, "3:00:00", "× 25% of trials left"),  # a resume asks for what is left: 8 h × 0.25 × 1.25 + 30 min
])
def test_a_request_stays_within_the_clusters_bounds_and_a_resume_asks_for_what_is_left(
        hours: float, remaining: float, expected: str, said: str) -> None:
    request = sized(wall_estimate([hours], "1 attempt"), remaining, AUTO, "24:00:00")

    assert request is not None
    assert request.time_limit == expected
    assert said in request.note


def test_fixed_asks_for_nothing_else_and_auto_without_evidence_asks_for_the_fixed_walltime_and_says_so() -> None:
    estimate = wall_estimate([3.0], "1 attempt")

    assert sized(estimate, 1.0, AUTO.model_copy(update={"auto": False}), "24:00:00") is None
    unknown = sized(None, 1.0, AUTO, "24:00:00")
    assert unknown is not None and unknown.time_limit == "24:00:00"
    assert "no finished attempt alike yet" in unknown.note


def test_the_server_start_is_measured_from_a_first_jobs_start_to_its_dirs_first_trial() -> None:
    """Run dirs say how long trials take but not the server's start: the jobs that made them do (per size band)."""
    dirs = [facts(f"ev_d{i}__a1", total=10, completed=10, model=f"org/d{i}-8B", benchmark_name="terminal_bench_2")
            .model_copy(update={"started_at": ago(hours=3), "finished_at": ago(hours=1)}) for i in range(3)]
    jobs = [job(d.run_tag, JobState.COMPLETED, started=ago(hours=3, minutes=minutes), ended=ago(hours=1))
            for d, minutes in zip(dirs, (10, 12, 40), strict=True)]

    wall = estimates([SMALL], [], dirs, BANDS, gpus_per_job=0, jobs=jobs)[SMALL.key].wall

    assert wall is not None and wall.start_hours == pytest.approx(0.2), "the median of 10, 12 and 40 min"
    request = sized(wall, 1.0, AUTO, "24:00:00")
    assert request is not None and request.time_limit == "3:00:00", "2 h × 1.25 + 12 min start + 15 min cancel"
    assert "12 m server start (measured, median of 3 job(s) of 0–14B)" in request.note


def test_clock_writes_hours_past_a_day_as_hours() -> None:
    assert clock(30 * 3600 + 15 * 60) == "30:15:00"


def test_the_wall_estimate_comes_from_history_over_gpus_per_job_else_from_run_dirs() -> None:
    with_gpus = estimates([SMALL], [attempt(8.0), attempt(12.0)], [], BANDS, gpus_per_job=4)[SMALL.key]
    assert with_gpus.wall is not None and (with_gpus.wall.median_hours, with_gpus.wall.high_hours) == (2.5, 3.0)

    # started 3 h ago, last result 2 h ago: 1 h for 5 of 10 trials → 2 h for all; no GPUs: history says no wall time
    half = facts("ev_b__a1", total=10, completed=5, finished=False, model="org/b-7B", benchmark_name="terminal_bench_2")
    no_gpus = estimates([SMALL], [attempt(8.0)], [half], BANDS, gpus_per_job=0)[SMALL.key]
    assert no_gpus.wall is not None and no_gpus.wall.median_hours == pytest.approx(2.0)
    assert "1 run dir(s) of terminal_bench_2, 0–14B" in no_gpus.wall.basis


def test_the_planner_sizes_a_first_launch_and_a_resume_and_says_how() -> None:
    auto = POLICY.model_copy(update={"walltime": AUTO})
    guesses = estimates([SMALL], [attempt(4.0), attempt(4.0)], [], BANDS, gpus_per_job=1)

    fresh = plan(RUN, [SMALL], [obs()], auto, NOW, estimates=guesses).cells[0]
    (submit,) = [a for a in fresh.actions if isinstance(a, Submit)]
    assert submit.time_limit == "5:15:00", "4 h × 1.25 + 15 min cancel: an attempt's hours hold its server start"
    assert "walltime auto: 5:15:00" in fresh.reason and "(its server start is in the estimate)" in fresh.reason

    cut = facts(SMALL.run_tag(1), total=10, completed=6, finished=False, last_progress=ago(hours=2))
    interrupted = obs(rows=(row("Started", job_name=SMALL.run_tag(1), started=ago(hours=6)),), subs=(sub(SMALL),),
                      dirs=(cut,))
    resumed = plan(RUN, [SMALL], [interrupted], auto, NOW, estimates=guesses).cells[0]
    (resume,) = [a for a in resumed.actions if isinstance(a, Resume)]
    assert resume.time_limit == "2:30:00", "4 of 10 trials left: 4 h × 0.4 × 1.25 + its server start again + cancel"

    fixed = plan(RUN, [SMALL], [obs()], POLICY, NOW, estimates=guesses).cells[0]
    (as_before,) = [a for a in fixed.actions if isinstance(a, Submit)]
    assert as_before.time_limit is None and "walltime" not in fixed.reason


def test_a_preset_that_asks_for_walltime_auto_is_sized_whatever_the_evalruns_walltime() -> None:
    """The EvalRun keeps `walltime: fixed` (the default); the preset's `auto` sizes its own cells, and a placement
    probe (which asks where a cell may go, not for how long) sizes nothing."""
    preset_auto = cell("org/a-8B", walltime_auto=True)
    fixed = POLICY.model_copy(update={"walltime": AUTO.model_copy(update={"auto": False})})
    guesses = estimates([preset_auto, SMALL], [attempt(4.0)], [], BANDS, gpus_per_job=1)

    decided = plan(RUN, [preset_auto, SMALL], [obs(), obs()], fixed, NOW, estimates=guesses).cells
    limits = [next(a.time_limit for a in c.actions if isinstance(a, Submit)) for c in decided]
    assert limits == ["5:15:00", None], [c.reason for c in decided]

    probe = fixed.model_copy(update={"walltime": fixed.walltime.model_copy(update={"presets": False})})
    [probed] = plan(RUN, [preset_auto], [obs()], probe, NOW, estimates=guesses).cells
    assert [a.time_limit for a in probed.actions if isinstance(a, Submit)] == [None]


def test_a_live_job_shows_the_walltime_it_asked_for() -> None:
    asked = job(SMALL.run_tag(1), JobState.RUNNING, started=ago(minutes=5)).model_copy(update={"time_limit_s": 13_500})
    running = plan(RUN, [SMALL], [obs(subs=(sub(SMALL),), jobs=(asked,))], POLICY, NOW).cells[0]

    assert "--time 3:45:00" in running.reason


# --------------------------------------------------------------------------- learning from the sized jobs


def test_the_margin_follows_what_sized_jobs_ran_within_bounds_after_five_and_not_before() -> None:
    assert learned([(2.0, 3.0)] * 4).margin == 1.25, "four jobs are not enough to move it"
    long = learned([(2.0, 2.0), (2.0, 2.2), (2.0, 2.4), (2.0, 2.6), (2.0, 2.8)])
    assert (long.jobs, long.median_ratio, long.high_ratio) == (5, 1.2, 1.4)
    assert long.margin == pytest.approx(1.75), "1.25 × the p90 ratio: jobs ran longer, the next ones ask for more"
    assert learned([(4.0, 1.0)] * 5).margin == 1.1, "shorter than estimated: less, never below the floor"
    assert learned([(1.0, 9.0)] * 5).margin == 2.0, "never four times the estimate"
    assert "5 sized job(s) ran 1.20× their estimate (p90 1.40×); margin 1.75 (learnt)" in long.summary()


def test_a_sized_launch_records_its_estimate_and_every_ended_job_how_long_it_ran() -> None:
    auto = POLICY.model_copy(update={"walltime": AUTO})
    guesses = estimates([SMALL], [attempt(4.0)], [], BANDS, gpus_per_job=1)
    (submit,) = [a for a in plan(RUN, [SMALL], [obs()], auto, NOW, estimates=guesses).cells[0].actions
                 if isinstance(a, Submit)]
    assert submit.estimated_hours == 4.0, "the p90 of whole attempts, their server starts in it"

    ended = job(sub(SMALL).name, JobState.COMPLETED, started=ago(hours=5), ended=ago(hours=2))
    recorded = plan(RUN, [SMALL], [obs(subs=(sub(SMALL),), jobs=(ended,), dirs=(facts(SMALL.run_tag(1)),))], POLICY,
                    NOW).cells[0].row_updates
    assert [(u.submission_name, u.elapsed_hours) for u in recorded if u.elapsed_hours is not None] == [
        (sub(SMALL).name, 3.0)], "sized or not: an attempt's wall time is history"


def test_a_request_cut_at_max_time_limit_records_no_estimate_to_learn_from() -> None:
    request = sized(wall_estimate([60.0], "1 attempt"), 1.0, AUTO, "24:00:00")

    assert request is not None and request.time_limit == "48:00:00" and request.estimated_hours is None


def test_a_resume_asks_for_the_trials_that_ended_in_infra_errors_too() -> None:
    """`harbor jobs resume` runs them again (RULES §3): every trial completed, 4 of 10 infra errors, is 40 % left."""
    auto = POLICY.model_copy(update={"walltime": AUTO})
    guesses = estimates([SMALL], [attempt(4.0)], [], BANDS, gpus_per_job=1)
    errored = facts(SMALL.run_tag(1), total=10, completed=10, infra=4)
    interrupted = obs(rows=(row("Started", job_name=SMALL.run_tag(1), started=ago(hours=6)),), subs=(sub(SMALL),),
                      dirs=(errored,))

    resumed = plan(RUN, [SMALL], [interrupted], auto, NOW, estimates=guesses).cells[0]

    (resume,) = [a for a in resumed.actions if isinstance(a, Resume)]
    assert resume.time_limit == "2:30:00", "4 h × 0.4 × 1.25 + its server start again + cancel"


def own(c: Cell, **changes: object) -> Submission:
    return sub(c).model_copy(update={"finished_at": ago(hours=1), **changes})


def test_the_margin_is_learnt_from_the_last_job_of_each_finished_attempt_of_this_evalrun_only() -> None:
    ran_long = [own(cell(f"org/d{i}-8B"), estimated_hours=2.0, elapsed_hours=2.8) for i in range(5)]
    cut_before = [own(cell("org/d0-8B"), estimated_hours=2.0, elapsed_hours=0.1)]  # fire 1, cut: fire 2 is the last
    last = [s.model_copy(update={"fire": 2, "name": f"{s.name}-r1"}) for s in ran_long[:1]]
    unfinished = [sub(cell("org/u-8B")).model_copy(update={"estimated_hours": 2.0, "elapsed_hours": 0.1})]
    elsewhere = [own(cell(f"org/e{i}-8B"), estimated_hours=2.0, elapsed_hours=0.1,
                     evalrun=EvalRunRef(name="another")) for i in range(5)]

    learnt = learned_from([*cut_before, *last, *ran_long[1:], *unfinished, *elsewhere], RUN)

    assert (learnt.jobs, learnt.high_ratio) == (5, pytest.approx(1.4))
    assert learnt.margin == pytest.approx(1.75)


def test_the_plan_sizes_with_the_learnt_margin_and_says_how_its_jobs_fared() -> None:
    learnt = learned([(2.0, 2.8)] * 5)
    auto = POLICY.model_copy(update={"walltime": AUTO.model_copy(update={"learnt": learnt})})
    guesses = estimates([SMALL], [attempt(4.0)], [], BANDS, gpus_per_job=1)

    the_plan = plan(RUN, [SMALL], [obs()], auto, NOW, estimates=guesses)

    assert the_plan.walltime == learnt
    (submit,) = [a for a in the_plan.cells[-1].actions if isinstance(a, Submit)]
    assert submit.time_limit == "7:15:00", "4 h × 1.75 + 15 min cancel"
    assert plan(RUN, [SMALL], [obs()], POLICY, NOW).walltime is None, "fixed: nothing to learn or show"


def test_history_gives_wall_time_from_elapsed_hours_and_never_from_zero_gpu_hours() -> None:
    """A site whose accounting counts no GPUs records 0 GPU-h: 0 h of wall time would ask every job for the minimum."""
    counted = estimates([SMALL], [attempt(0.0).model_copy(update={"wall_hours": 3.0})], [], BANDS, gpus_per_job=4)
    assert counted[SMALL.key].wall is not None and counted[SMALL.key].wall.high_hours == 3.0

    uncounted = estimates([SMALL], [attempt(0.0), attempt(0.0)], [], BANDS, gpus_per_job=4)
    assert uncounted[SMALL.key].wall is None, "nothing to go by: the fixed walltime, said so"
