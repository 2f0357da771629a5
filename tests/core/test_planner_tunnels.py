"""Pinggy pairs: one per running installed-agent job, shared out by the planner, released when the job ends."""

from __future__ import annotations

from controller.core.actions import Action, ActionKind
from controller.core.observed import JobState, TunnelLease
from controller.core.planner import plan
from controller.core.types import submission_name
from controller.core.vocabulary import CellPlan
from tests.core.builders import NOW, RUN, SCORED, ago, cell, job, obs, row, spec_policy, sub

POOL = spec_policy(tunnel_pairs=("pair-a", "pair-b"))
AGENTS = [cell(model=f"org/m{i}", agent="openhands", needs_pinggy=True) for i in range(3)]


def launch(cell_plan: CellPlan) -> Action | None:
    return next((a for a in cell_plan.actions if a.kind in (ActionKind.SUBMIT, ActionKind.RESUME)), None)


def lease(pair: str, holder: str) -> TunnelLease:
    return TunnelLease(pair=pair, holder=holder, evalrun="run1", leased_at=ago(hours=1))


def test_three_installed_agent_cells_and_two_pairs_two_launch_one_waits_for_a_pair():
    cells = plan(RUN, AGENTS, [obs() for _ in AGENTS], POOL, NOW).cells
    tunnels = [launch(c).tunnel for c in cells if launch(c) is not None]
    assert tunnels == ["pair-a", "pair-b"]
    [waiting] = [c for c in cells if launch(c) is None]
    assert [a.kind for a in waiting.actions] == [ActionKind.WAIT]
    assert "free pinggy pair (2 of 2 in use" in waiting.actions[0].reason


def test_a_pair_leased_to_a_live_job_is_not_handed_out_again():
    running = AGENTS[0]
    name = submission_name(running.run_tag(1), 1)
    observations = [obs(rows=(row("Started", job_name=running.run_tag(1)),), subs=(sub(running),),
                        jobs=(job(name, JobState.RUNNING, started=ago(minutes=5)),)), obs(), obs()]
    the_plan = plan(RUN, AGENTS, observations, POOL, NOW, tunnel_leases=[lease("pair-a", name)],
                    live_job_names=frozenset({name}))
    assert the_plan.tunnel_releases == ()
    assert launch(the_plan.cells[1]).tunnel == "pair-b"
    assert launch(the_plan.cells[2]) is None


def test_the_pair_of_an_ended_job_is_released_and_reused_in_the_same_pass():
    done = AGENTS[0]
    name = submission_name(done.run_tag(1), 1)
    observations = [obs(rows=(row("Finished", job_name=done.run_tag(1), metrics=SCORED),), subs=(sub(done),),
                        jobs=(job(name, JobState.COMPLETED, ended=ago(minutes=1)),)), obs(), obs()]
    other = TunnelLease(pair="pair-b", holder="ev_other_run_job", evalrun="run2", leased_at=ago(hours=1))
    the_plan = plan(RUN, AGENTS, observations, POOL, NOW, tunnel_leases=[lease("pair-a", name), other],
                    live_job_names=frozenset())
    assert the_plan.tunnel_releases == (lease("pair-a", name),), "another EvalRun's lease is its own business"
    assert [launch(c).tunnel if launch(c) else None for c in the_plan.cells[1:]] == ["pair-a", None]


def test_a_lease_no_cell_knows_any_more_is_released_once_its_job_is_over():
    """The spec changed (another fingerprint, a removed model): nothing else would ever free the pair."""
    orphan = lease("pair-a", "ev_removed_model__tiny__0123abcd__a1")
    the_plan = plan(RUN, AGENTS[:1], [obs()], POOL, NOW, tunnel_leases=[orphan], live_job_names=frozenset())
    assert the_plan.tunnel_releases == (orphan,)
    still_running = plan(RUN, AGENTS[:1], [obs()], POOL, NOW, tunnel_leases=[orphan],
                         live_job_names=frozenset({orphan.holder}))
    assert still_running.tunnel_releases == ()
    assert launch(still_running.cells[0]).tunnel == "pair-b"


def test_nothing_is_released_when_the_queue_could_not_be_read():
    orphan = lease("pair-a", "ev_removed_model__tiny__0123abcd__a1")
    assert plan(RUN, AGENTS[:1], [obs()], POOL, NOW, tunnel_leases=[orphan]).tunnel_releases == ()


def test_an_interrupted_submission_keeps_its_pair_and_its_repair_reuses_it():
    """Intent recorded and pair leased, then the reconciler died before sbatch: the repair uses the same pair."""
    first = AGENTS[0]
    name = submission_name(first.run_tag(1), 1)
    observations = [obs(rows=(row("Pending", job_name=first.run_tag(1), submitted=ago(minutes=2)),),
                        subs=(sub(first, job_id=None),)), obs(), obs()]
    the_plan = plan(RUN, AGENTS, observations, POOL, NOW, tunnel_leases=[lease("pair-b", name)],
                    live_job_names=frozenset())
    assert the_plan.tunnel_releases == ()
    assert [launch(c).tunnel if launch(c) else None for c in the_plan.cells] == ["pair-b", "pair-a", None]


def test_a_pair_removed_from_the_pool_is_not_reused_by_its_repair():
    first = AGENTS[0]
    name = submission_name(first.run_tag(1), 1)
    observations = [obs(rows=(row("Pending", job_name=first.run_tag(1), submitted=ago(minutes=2)),),
                        subs=(sub(first, job_id=None),))]
    [decided] = plan(RUN, AGENTS[:1], observations, POOL, NOW, tunnel_leases=[lease("pair-gone", name)],
                     live_job_names=frozenset()).cells
    assert launch(decided).tunnel == "pair-a"


def test_cells_without_an_installed_agent_never_take_a_pair():
    plain = [cell(model="org/plain")]
    [decided] = plan(RUN, plain, [obs()], POOL.model_copy(update={"tunnel_pairs": ()}), NOW).cells
    assert launch(decided).tunnel is None


def test_an_installed_agent_cell_with_an_empty_pool_is_held_with_the_fix():
    [decided] = plan(RUN, AGENTS[:1], [obs()], spec_policy(), NOW).cells
    assert [a.kind for a in decided.actions] == [ActionKind.HOLD]
    assert "spec.pinggy.pairs" in decided.actions[0].reason


def test_waiting_for_a_pair_does_not_use_up_the_submission_budget():
    cells = [*AGENTS, cell(model="org/plain")]
    decided = plan(RUN, cells, [obs() for _ in cells], POOL.model_copy(update={"max_submissions_per_pass": 3}),
                   NOW).cells
    assert [launch(c) is not None for c in decided] == [True, True, False, True]


def test_suspend_releases_nothing():
    done = AGENTS[0]
    name = submission_name(done.run_tag(1), 1)
    observations = [obs(subs=(sub(done),), jobs=(job(name, JobState.COMPLETED, ended=ago(minutes=1)),))]
    the_plan = plan(RUN, AGENTS[:1], observations, POOL.model_copy(update={"suspend": True}), NOW,
                    tunnel_leases=[lease("pair-a", name)], live_job_names=frozenset())
    assert the_plan.tunnel_releases == ()
