"""Jobs in the queue (RULES §5 monitoring), the submission-protocol repairs, the caps and Unknown."""

from __future__ import annotations

from datetime import timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from controller.core.actions import ActionKind
from controller.core.observed import JobState, Observation, RowStatus
from controller.core.planner import plan, plan_cell
from controller.core.types import EvalRunRef
from controller.core.vocabulary import Phase, Rule
from tests.core.builders import NOW, POLICY, RUN, ago, cell, facts, job, obs, row, sub

C = cell()
TAG = C.run_tag(1)


def kinds(decided) -> list[str]:
    return [a.kind.value for a in decided.actions]


def test_queued_young_waits():
    decided = plan_cell(C, obs(rows=(row("Pending", job_name=TAG, submitted=ago(hours=1)),), subs=(sub(C),),
                               jobs=(job(TAG, JobState.QUEUED),)), POLICY, NOW)
    assert decided.phase == Phase.SUBMITTED and kinds(decided) == ["wait"]


def test_stale_pending_cancels_then_submits_a_new_attempt_with_a_new_name():
    decided = plan_cell(C, obs(rows=(row("Pending", job_name=TAG, submitted=ago(hours=7)),),
                               subs=(sub(C, created=ago(hours=7)),), jobs=(job(TAG, JobState.QUEUED),)), POLICY, NOW)
    assert kinds(decided) == ["cancel", "submit"]
    assert decided.actions[0].job_id == "100"
    assert decided.actions[1].run_tag == C.run_tag(2), "a NEW attempt: fresh row, fresh submitted_at"


def test_running_job_moves_our_pending_row_to_started():
    decided = plan_cell(C, obs(rows=(row("Pending", job_name=TAG, submitted=ago(minutes=3)),), subs=(sub(C),),
                               jobs=(job(TAG, JobState.RUNNING, started=ago(minutes=1)),)), POLICY, NOW)
    [update] = decided.row_updates
    assert (update.row_id, update.status, update.started_at) == ("row-1", RowStatus.STARTED, ago(minutes=1))


def test_pre_walltime_cancel():
    decided = plan_cell(C, obs(rows=(row("Started", job_name=TAG),), subs=(sub(C),),
                               jobs=(job(TAG, JobState.RUNNING, time_left_s=14 * 60),)), POLICY, NOW)
    assert kinds(decided) == ["cancel"] and "walltime" in decided.actions[0].reason


def test_walltime_left_above_the_margin_keeps_running():
    decided = plan_cell(C, obs(rows=(row("Started", job_name=TAG),), subs=(sub(C),),
                               jobs=(job(TAG, JobState.RUNNING, time_left_s=16 * 60),)), POLICY, NOW)
    assert kinds(decided) == ["wait"]


def test_zombie_is_cancelled():
    dir_ = facts(TAG, completed=10, finished=False, last_progress=ago(minutes=11))
    decided = plan_cell(C, obs(subs=(sub(C),), rows=(row("Started", job_name=TAG),),
                               jobs=(job(TAG, JobState.RUNNING, started=ago(hours=2)),), dirs=(dir_,)), POLICY, NOW)
    assert kinds(decided) == ["cancel"] and "zombie" in decided.actions[0].reason


def test_stuck_near_complete_is_cancelled():
    dir_ = facts(TAG, total=300, completed=292, scored=292, finished=False, last_progress=ago(minutes=61))
    decided = plan_cell(C, obs(subs=(sub(C),), rows=(row("Started", job_name=TAG),),
                               jobs=(job(TAG, JobState.RUNNING, started=ago(hours=5)),), dirs=(dir_,)), POLICY, NOW)
    assert kinds(decided) == ["cancel"] and "near complete" in decided.actions[0].reason


def test_re_runs_of_a_few_tasks_do_not_make_a_stuck_job_near_complete():
    """292 scored results, but 60 of them re-runs of 30 tasks (a resume, late sandboxes): 262 of 300 tasks measured,
    short of the 90 %. Cancelling would end a job with a tenth of the benchmark left to run."""
    base = facts(TAG, total=300, completed=292, scored=292, finished=False, last_progress=ago(minutes=61))
    tasks = {f"task-{i:03d}": (3, 3, 3.0) if i < 30 else (1, 1, 1.0) for i in range(262)}
    dir_ = base.model_copy(update={"tasks": tasks})
    decided = plan_cell(C, obs(subs=(sub(C),), rows=(row("Started", job_name=TAG),),
                               jobs=(job(TAG, JobState.RUNNING, started=ago(hours=5)),), dirs=(dir_,)), POLICY, NOW)
    assert decided.phase == Phase.RUNNING and "cancel" not in kinds(decided), decided.reason


def test_stuck_far_from_complete_is_only_reported():
    dir_ = facts(TAG, total=300, completed=100, finished=False, last_progress=ago(minutes=91))
    decided = plan_cell(C, obs(subs=(sub(C),), rows=(row("Started", job_name=TAG),),
                               jobs=(job(TAG, JobState.RUNNING, started=ago(hours=5)),), dirs=(dir_,)), POLICY, NOW)
    assert decided.phase == Phase.STALLED and kinds(decided) == ["wait"]


def test_duplicate_live_jobs_keep_the_oldest():
    jobs = (job(TAG, JobState.RUNNING, job_id="101"), job(TAG, JobState.QUEUED, job_id="102"))
    decided = plan_cell(C, obs(rows=(row("Started", job_name=TAG),), subs=(sub(C),), jobs=jobs), POLICY, NOW)
    assert [(a.kind.value, a.job_id) for a in decided.actions if a.kind.value == "cancel"] == [("cancel", "102")]


# ---------------------------------------------------------------------- the create-pending protocol


def test_intent_without_job_finishes_the_same_submission():
    """Crash after step 1: the next pass submits under the SAME name (the actor checks the queue first)."""
    decided = plan_cell(C, obs(rows=(row("Pending", job_name=TAG, submitted=ago(minutes=1)),),
                               subs=(sub(C, job_id=None),)), POLICY, NOW)
    [action] = decided.actions
    assert (action.kind.value, action.run_tag, action.fire, action.row_id) == ("submit", TAG, 1, "row-1")


def test_job_found_by_name_is_adopted_and_recorded():
    """Crash after sbatch, before step 3: the job is found by its name and its id recorded."""
    decided = plan_cell(C, obs(rows=(row("Pending", job_name=TAG, submitted=ago(minutes=1)),),
                               subs=(sub(C, job_id=None),), jobs=(job(TAG, JobState.QUEUED, job_id="555"),)),
                        POLICY, NOW)
    assert kinds(decided) == ["wait"]
    assert [(u.submission_name, u.job_id) for u in decided.row_updates] == [(TAG, "555")]


def test_an_ended_job_older_than_the_intent_is_not_adopted_the_submission_is_finished():
    """Same name, but the job ended before this intent existed (a deleted store): it did not run for us."""
    old = job(TAG, JobState.COMPLETED, job_id="17", ended=ago(hours=5)).model_copy(update={"submitted_at": ago(days=3)})
    decided = plan_cell(C, obs(rows=(row("Pending", job_name=TAG, submitted=ago(minutes=1)),),
                               subs=(sub(C, job_id=None, created=ago(minutes=1)),), jobs=(old,)), POLICY, NOW)
    assert decided.row_updates == ()
    assert kinds(decided) == ["submit"] and "finish the submission" in decided.actions[0].reason
    assert decided.actions[0].intent_at == ago(minutes=1), "the actor judges adoption against the recorded intent"


def test_an_ended_job_submitted_after_the_intent_is_adopted():
    """Crash after sbatch, and the job already ended: it is ours, recorded, and its dir decides."""
    ended = job(TAG, JobState.FAILED, job_id="18", ended=ago(seconds=10)).model_copy(
        update={"submitted_at": ago(seconds=50)})
    decided = plan_cell(C, obs(rows=(row("Pending", job_name=TAG, submitted=ago(minutes=1)),),
                               subs=(sub(C, job_id=None, created=ago(minutes=1)),), jobs=(ended,)), POLICY, NOW)
    assert [(u.submission_name, u.job_id) for u in decided.row_updates] == [(TAG, "18")]
    assert "submit" not in kinds(decided)


def test_our_row_whose_job_vanished_is_dead_now():
    """Neither queue nor accounting knows our job: act now, not after staleStartedHours."""
    decided = plan_cell(C, obs(rows=(row("Started", job_name=TAG, started=ago(minutes=30)),), subs=(sub(C),)),
                        POLICY, NOW)
    assert kinds(decided) == ["resume"]


# ---------------------------------------------------------------------- caps and Unknown


def test_submission_budget_caps_launches_per_pass():
    cells = [cell(model=f"org/m{i}") for i in range(10)]
    the_plan = plan(RUN, cells, [obs() for _ in cells], POLICY.model_copy(update={"max_submissions_per_pass": 3}),
                    NOW)
    launched = [c for c in the_plan.cells if "submit" in kinds(c)]
    assert len(launched) == 3
    assert all(kinds(c) == ["wait"] and "budget used up" in c.actions[0].reason for c in the_plan.cells if c not in launched)



@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(["untouched", "seen", "pinggy", "owned"]), min_size=1, max_size=12),
       st.integers(0, 4), st.booleans())
def test_cells_with_nothing_observed_are_planned_as_the_rules_plan_them(kinds_of_cells, budget, suspend):
    """plan() decides untouched cells once for all past the budget; the result is what each cell's rules say."""
    cells = [cell(model=f"org/m{i}", needs_pinggy=kind == "pinggy")
             for i, kind in enumerate(kinds_of_cells)]
    untouched = obs()
    seen_alike = untouched.model_copy(update={"outputs": None})  # the same facts, not the untouched fast path
    observed = [seen_alike if kind == "seen" else untouched for kind in kinds_of_cells]
    owners = {c.key: EvalRunRef(name="other") for c, kind in zip(cells, kinds_of_cells, strict=True) if kind == "owned"}
    policy = POLICY.model_copy(update={"suspend": suspend, "tunnel_pairs": ("p1",)})
    fast = plan(RUN, cells, observed, policy, NOW, budget=budget, owners=owners)
    by_rules = plan(RUN, cells, [seen_alike] * len(cells), policy, NOW, budget=budget, owners=owners)
    assert fast == by_rules
    assert [c.cell for c in fast.cells] == cells

def test_suspend_turns_every_mutation_into_a_hold():
    the_plan = plan(RUN, [C], [obs()], POLICY.model_copy(update={"suspend": True}), NOW)
    [decided] = the_plan.cells
    assert kinds(decided) == ["hold"] and "would submit" in decided.actions[0].reason


def test_each_unreadable_source_makes_the_cell_unknown():
    for missing in ("rows", "submissions", "jobs", "run_dirs"):
        values = dict(rows=(), submissions=(), jobs=(), run_dirs=())
        values[missing] = None
        decided = plan_cell(C, Observation(**values, unknown_reason="queue unreachable"), POLICY, NOW)
        assert decided.phase == Phase.UNKNOWN and decided.actions == (), missing


def test_a_run_dir_that_cannot_be_read_with_no_live_job_makes_the_cell_unknown():
    """Every source read, one run dir not: what it holds decides nothing (resume, upload or a fresh start)."""
    whole = facts(TAG, completed=10, total=10)
    broken = whole.model_copy(update={"unreadable": f"/jobs/{TAG}/t__1/result.json: not JSON"})
    seen = obs(rows=(row("Started", job_name=TAG),), subs=(sub(C),), jobs=(job(TAG, JobState.COMPLETED),))
    decided = plan_cell(C, seen.model_copy(update={"run_dirs": (broken,)}), POLICY, NOW)
    assert (decided.phase, decided.rule, decided.actions) == (Phase.UNKNOWN, Rule.RUN_DIR_UNREADABLE, ())
    assert "not JSON" in decided.reason
    readable = plan_cell(C, seen.model_copy(update={"run_dirs": (whole,)}), POLICY, NOW)
    assert readable.phase != Phase.UNKNOWN and readable.actions != (), "the same dir read whole is acted on"


# ---------------------------------------------------------------------- properties

statuses = st.sampled_from([None, "Pending", "Started", "Finished", "Failed"])
job_states = st.sampled_from(list(JobState))


@st.composite
def observations(draw) -> Observation:
    rows = tuple(
        row(draw(statuses), user=draw(st.sampled_from(["alice", "bob"])), row_id=f"r{i}",
            job_name=draw(st.sampled_from([TAG, C.run_tag(2), "legacy"])),
            created=ago(hours=draw(st.integers(0, 100))), submitted=ago(hours=draw(st.integers(0, 30))),
            started=draw(st.none() | st.just(ago(hours=draw(st.integers(0, 30))))))
        for i in range(draw(st.integers(0, 3)))
    )
    subs = tuple(sub(C, attempt=a, fire=f, job_id=draw(st.none() | st.just(str(100 + a * 10 + f))), row_id="r0")
                 for a in range(1, draw(st.integers(1, 2)) + 1) for f in range(1, draw(st.integers(0, 2)) + 1))
    jobs = tuple(job(s.name, draw(job_states), job_id=str(200 + i)) for i, s in enumerate(subs) if draw(st.booleans()))
    dirs = tuple(facts(t, completed=draw(st.integers(0, 12)), finished=draw(st.booleans()),
                       infra=draw(st.integers(0, 12)), fires=draw(st.integers(0, 3)))
                 for t in {s.run_tag for s in subs} if draw(st.booleans()))
    unknown = draw(st.sampled_from([None, "rows", "jobs", "run_dirs", "submissions"]))
    values = dict(rows=rows, submissions=subs, jobs=jobs, run_dirs=dirs)
    if unknown:
        values[unknown] = None
    return Observation(**values)


@settings(max_examples=400, deadline=None)
@given(observations(), st.integers(0, 48))
def test_never_two_launches_and_never_an_action_on_unknown(observation, hours_later):
    decided = plan_cell(C, observation, POLICY, NOW + timedelta(hours=hours_later))
    launches = [a for a in decided.actions if a.kind.value in ("submit", "resume")]
    assert len(launches) <= 1
    if decided.phase == Phase.UNKNOWN:
        seen = {j.job_id for j in observation.jobs or ()}
        assert decided.actions == ()
        assert all(u.status is None and u.job_id in seen for u in decided.row_updates), \
            "on Unknown only the id of a job that was seen may be recorded"
    live = [j for j in observation.jobs or () if j.state.active]
    if live:
        assert not launches or any(a.kind.value == "cancel" and a.job_id == live[0].job_id for a in decided.actions), \
            "a launch while a job of the cell is live must be preceded by cancelling it"


def test_over_budget_stale_pending_keeps_its_job_instead_of_cancelling_it():
    """The cancel of a stale-pending job only makes sense with the resubmission it precedes."""
    stale = obs(rows=(row("Pending", job_name=TAG, submitted=ago(hours=7)),), subs=(sub(C, created=ago(hours=7)),),
                jobs=(job(TAG, JobState.QUEUED),))
    [decided] = plan(RUN, [C], [stale], POLICY, NOW, budget=0).cells
    assert kinds(decided) == ["wait"] and "budget used up" in decided.actions[0].reason


def test_an_unreadable_dir_of_a_running_job_still_gets_the_walltime_cancel_but_no_trial_rules():
    broken = facts(TAG, completed=10, total=10, last_progress=ago(hours=5)).model_copy(
        update={"unreadable": f"/jobs/{TAG}/t__1/result.json: not JSON"})
    running = job(TAG, JobState.RUNNING, started=ago(hours=6), time_left_s=600)
    decided = plan_cell(C, obs(rows=(row("Started", job_name=TAG),), subs=(sub(C),), jobs=(running,), dirs=(broken,)),
                        POLICY, NOW)
    assert [a.kind for a in decided.actions] == [ActionKind.CANCEL] and "walltime" in decided.actions[0].reason
    quiet = running.model_copy(update={"time_left_s": 36000})
    decided = plan_cell(C, obs(rows=(row("Started", job_name=TAG),), subs=(sub(C),), jobs=(quiet,), dirs=(broken,)),
                        POLICY, NOW)
    assert decided.phase == Phase.RUNNING and [a.kind for a in decided.actions] == [ActionKind.WAIT], \
        "every trial 'done' and quiet for hours would be a zombie cancel, but the counts cannot be trusted"
    assert "cannot be read" in decided.reason
