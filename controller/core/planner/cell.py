"""plan_cell(): one cell's decision. `OBSERVATION_RULES` first (what was not seen decides nothing), then its view is
built once and either the in-flight rules (a job is queued or running) or the settled rules decide.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from controller.core.actions import Hold
from controller.core.health import count_instant_failures
from controller.core.observed import Observation
from controller.core.planner.policy import Policy
from controller.core.planner.rules_in_flight import in_flight
from controller.core.planner.rules_resume import INTERRUPTED, repair
from controller.core.planner.rules_retry import released
from controller.core.planner.rules_settled import settled
from controller.core.planner.view import adoptions, cell_view, in_order, next_attempt, spent
from controller.core.planner.words import failed_job, failure, last_job_note
from controller.core.remedies import Quarantined
from controller.core.retry import pending_request
from controller.core.types import Cell, run_tag_of
from controller.core.vocabulary import CellPlan, Phase, Rule


@dataclass(slots=True)
class Seen:
    cell: Cell
    obs: Observation
    policy: Policy


def job_failed_dir_unseen(s: Seen) -> CellPlan | None:
    """RULES §13: its newest job FAILED / ran out of memory and the run dir cannot be seen → hold for a human.
    A hold changes nothing: a job that failed needs a human whether or not its run dir can be seen. The reason is
    the job's failure; a missing jobs dir is said as seen, not guessed at (the failed job is the likelier cause)."""
    obs = s.obs
    failed = failed_job(obs.jobs) if obs.run_dirs is None else None
    if failed is None or obs.rows is None or obs.submissions is None:
        return None
    unseen = obs.jobs_dir_missing or obs.unknown_reason
    reason = f"job {failed.job_id} {failure(failed, s.policy)} (run dir not observed: {unseen})"
    return CellPlan(cell=s.cell, phase=Phase.FAILED, actions=(Hold(reason=reason),), reason=reason,
                    rule=Rule.JOB_FAILED_DIR_UNSEEN, memory=obs.memory, gpu_hours=spent(s.cell, obs))


def interrupted_after_failure(s: Seen) -> CellPlan | None:
    """RULES §12: a new attempt after a failed job (a refire, a retry) whose intent never reached sbatch, the run
    dirs unseen (a job script that never ran made no jobs dir): finish that same submission. It needs no run dir;
    holding it would strand the intent, and the request that made it is spent."""
    obs = s.obs
    failed = failed_job(obs.jobs) if obs.run_dirs is None else None
    if failed is None or not obs.submissions or obs.rows is None:
        return None
    last = in_order(obs.submissions)[-1]
    launched = last.job_id is not None or any(last.may_have_launched(j) for j in obs.jobs or () if j.name == last.name)
    if launched or last.run_tag == run_tag_of(failed.name):
        return None
    return CellPlan(cell=s.cell, phase=Phase.PENDING, actions=(repair(last, last.row_id),), reason=INTERRUPTED,
                    rule=Rule.SUBMISSION_REPAIR, memory=obs.memory, gpu_hours=spent(s.cell, obs))


def not_observed(s: Seen) -> CellPlan | None:
    """RULES §12: a source could not be read → Unknown, no action. Only the run dirs unseen: a job found by its name
    is still recorded (bookkeeping of what was read)."""
    obs = s.obs
    if obs.rows is not None and obs.submissions is not None and obs.jobs is not None and obs.run_dirs is not None:
        return None
    found = () if obs.rows is None or obs.submissions is None or obs.jobs is None else adoptions(
        in_order(obs.submissions), obs.jobs, [job for job in obs.jobs if job.state.active])
    return CellPlan(
        cell=s.cell, phase=Phase.UNKNOWN, actions=(),
        reason=f"not observed: {obs.unknown_reason or 'a source could not be read'}{last_job_note(obs.jobs)}",
        rule=Rule.OBSERVATION_FAILED, row_updates=found, memory=obs.memory,
        gpu_hours=spent(s.cell, obs))  # the budget still counts what its jobs spent


def dir_unreadable(s: Seen) -> CellPlan | None:
    """A run dir of the cell cannot be read and no job of it is live → Unknown, no action (with a live job, the
    walltime and queue rules need no trial data)."""
    obs = s.obs
    assert obs.jobs is not None and obs.run_dirs is not None
    dirs = obs.run_dirs
    if s.policy.force_eval:  # only the dirs of its own submissions are the cell's
        own_tags = {sub.run_tag for sub in obs.submissions or () if s.cell.evalrun.known_as(sub.evalrun)}
        dirs = tuple(d for d in dirs if d.run_tag in own_tags)
    if not dirs or not any(d.unreadable for d in dirs) or any(job.state.active for job in obs.jobs):
        return None
    broken = next((d for d in {d.run_tag: d for d in dirs}.values() if d.unreadable), None)
    if broken is None:  # read again under its tag: the last reading of a tag is the one that counts
        return None
    return CellPlan(cell=s.cell, phase=Phase.UNKNOWN, actions=(),
                    reason=f"not observed: run dir {broken.run_tag} cannot be read: {broken.unreadable}",
                    rule=Rule.RUN_DIR_UNREADABLE, run_dir=broken, memory=obs.memory, gpu_hours=spent(s.cell, obs))


OBSERVATION_RULES: tuple[Callable[[Seen], CellPlan | None], ...] = (
    interrupted_after_failure,  # an intent after a failed job, run dirs unseen → finish that submission
    job_failed_dir_unseen,      # a failed job, its run dir unseen             → hold for a human
    not_observed,               # a source could not be read                   → Unknown
    dir_unreadable,             # a run dir unreadable, no live job            → Unknown
)


def plan_cell(cell: Cell, obs: Observation, policy: Policy, now: datetime,
              leased: Mapping[str, str] | None = None, quarantined: Sequence[Quarantined] = ()) -> CellPlan:
    """`leased`: submission name → the pinggy pair leased to its job."""
    # instant failures are infra whatever Harbor called them (only a quiet failure can be one)
    if obs.run_dirs and cell.calls_model and any(d.quiet_failures for d in obs.run_dirs):
        counted = tuple(count_instant_failures(d, policy.health.instant_fail) for d in obs.run_dirs)
        if any(new is not old for new, old in zip(counted, obs.run_dirs, strict=True)):
            obs = obs.model_copy(update={"run_dirs": counted})
    if not_all_seen(obs):  # else none of OBSERVATION_RULES applies
        seen = Seen(cell, obs, policy)
        for rule in OBSERVATION_RULES:
            decided = rule(seen)
            if decided is not None:
                return released(decided, pending_request(obs.retries), lambda: unseen_dirs_attempt(cell, obs)) \
                    if obs.retries else decided
    view = cell_view(cell, obs, policy, now, leased, quarantined)
    decided = in_flight(view, view.live) if view.live else settled(view)
    return released(decided, view.retry, view.next_attempt) if view.retry is not None else decided


def not_all_seen(obs: Observation) -> bool:
    """A source could not be read, or a run dir: what every one of `OBSERVATION_RULES` asks first, asked once."""
    if obs.rows is None or obs.submissions is None or obs.jobs is None or obs.run_dirs is None:
        return True
    for facts in obs.run_dirs:
        if facts.unreadable:
            return True
    return False


def unseen_dirs_attempt(cell: Cell, obs: Observation) -> int:
    """The next attempt of a cell whose run dirs were not read (a failed job, its jobs dir missing or unreadable):
    its submissions name every attempt of ours, since an intent is recorded before its job runs (RULES §12)."""
    return next_attempt(cell, obs.submissions or (), (), obs.rows or ())
