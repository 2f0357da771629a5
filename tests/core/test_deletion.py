"""deletionPolicy Cancel is a plan: cancels for the live jobs of the cells this EvalRun owns, nothing else."""

from __future__ import annotations

from controller.core.actions import Cancel
from controller.core.observed import JobState
from controller.core.planner import plan_deletion
from controller.core.types import EvalRunRef
from controller.core.vocabulary import Phase, Rule
from tests.core.builders import RUN, ago, cell, job, obs, sub

RUNNING, QUEUED, DONE, OTHERS = (cell(model=f"org/{name}-8B") for name in ("running", "queued", "done", "others"))


def jobs_of(c, *states: JobState):
    return tuple(job(f"{c.run_tag(1)}-r{i}" if i else c.run_tag(1), state, job_id=str(100 + i))
                 for i, state in enumerate(states))


def test_every_live_job_of_an_owned_cell_is_cancelled_and_nothing_else():
    cells = [RUNNING, QUEUED, DONE, OTHERS]
    observations = [
        obs(subs=(sub(RUNNING),), jobs=jobs_of(RUNNING, JobState.COMPLETED, JobState.RUNNING)),
        obs(subs=(sub(QUEUED),), jobs=jobs_of(QUEUED, JobState.QUEUED)),
        obs(subs=(sub(DONE),), jobs=jobs_of(DONE, JobState.COMPLETED)),
        obs(subs=(sub(OTHERS),), jobs=jobs_of(OTHERS, JobState.RUNNING)),
    ]

    the_plan = plan_deletion(RUN, cells, observations, owners={OTHERS.key: EvalRunRef(name="gitops")})

    assert [(c.cell.model, c.phase) for c in the_plan.cells] == [(RUNNING.model, Phase.RUNNING),
                                                                 (QUEUED.model, Phase.SUBMITTED)]
    assert [a.job_id for c in the_plan.cells for a in c.actions if isinstance(a, Cancel)] == ["101", "100"]
    assert {c.rule for c in the_plan.cells} == {Rule.DELETION_CANCEL}
    assert not the_plan.tunnel_releases and not the_plan.suspended


def test_an_unread_queue_plans_no_cancel_of_its_own():
    """The caller raises instead (ObservationError): a finalizer must not let go of jobs it could not see."""
    the_plan = plan_deletion(RUN, [RUNNING], [obs(subs=(sub(RUNNING, created=ago(hours=1)),)).model_copy(
        update={"jobs": None})], owners={})

    assert the_plan.cells == ()
