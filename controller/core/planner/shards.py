"""RULES §17: a cell run as K shards. Each shard is a cell of its own (its jobs, run dirs, claims, resumes and
remedies, under the same rules as any cell), whose gate admits its run dir as the shard it is and uploads nothing
(`rules_upload.shard_done`). The cell itself launches nothing: once the newest run dir of every shard is admitted,
their union, one run dir of the cell, goes through the cell's own gate and is uploaded as one row.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from controller.core.actions import Hold, Skip, Submit, Track, Upload, Wait
from controller.core.admission import Admitted
from controller.core.gpu_hours import cell_hours
from controller.core.observed import Observation, RowStatus, RunDirFacts
from controller.core.planner.cell import plan_cell
from controller.core.planner.fleet import launch_of
from controller.core.planner.policy import Policy
from controller.core.planner.rules_retry import released
from controller.core.planner.rules_upload import admit_dir, overlong_note
from controller.core.planner.view import cell_view, next_attempt
from controller.core.remedies import Quarantined
from controller.core.shards import newest_dir, union_of
from controller.core.types import Cell, stem_of
from controller.core.vocabulary import CellPlan, Phase, Rule


@dataclass(frozen=True, slots=True)
class Union:
    """The cell's run dir made of its shards' (None: not every shard is done with one), or why they make none; the
    GPU-hours of the shards' attempts it is made of (None: not known); whether a shard ran overlong (RULES §5)."""

    facts: RunDirFacts | None
    problem: str = ""
    gpu_hours: float | None = None
    overlong: bool = False


def ready_dir(shard: Cell, obs: Observation, shard_plan: CellPlan | Cell, policy: Policy,
              now: datetime) -> tuple[RunDirFacts, bool] | None:
    """The shard's run dir for the union, as read (the cell counts its quiet failures once, as for any dir), once
    the shard is done with it: its plan this pass is `ShardDone` (its own gate admitted that dir; a shard its rules
    resume or refire is not done), or `Completed` by its cell's row (then its newest dir, admitted again by its
    gate); and whether it ran overlong, judged on the shard's own jobs."""
    if not isinstance(shard_plan, CellPlan) or obs.rows is None or obs.submissions is None or obs.jobs is None \
            or obs.run_dirs is None:
        return None
    view = cell_view(shard, obs, policy, now)
    if shard_plan.rule == Rule.SHARD_DONE and shard_plan.run_dir is not None:
        found = view.dirs.get(shard_plan.run_dir.run_tag)
    elif shard_plan.phase == Phase.COMPLETED and not view.live:
        newest = newest_dir(shard, tuple(view.dirs.values()))
        admitted = newest is not None and not newest.unreadable and isinstance(
            admit_dir(view, newest, can_resume=False), Admitted)
        found = newest if admitted else None
    else:
        return None
    return None if found is None else (found, overlong_note(view, found) is not None)


def union(cell: Cell, own: Observation, shards: Sequence[tuple[Cell, Observation, CellPlan | Cell]], policy: Policy,
          now: datetime, cleared: datetime | None) -> Union:
    """The union of every shard's ready run dir (`core.shards.union_of`), with their attempts' GPU-hours; none
    while a shard's is older than the cell's cleared union row (that shard runs again)."""
    parts = [(shard, ready_dir(shard, obs, shard_plan, policy, now), obs) for shard, obs, shard_plan in shards]
    ready = [(shard, found[0], found[1], obs) for shard, found, obs in parts if found is not None
             and not (cleared is not None and ran_before(shard, obs, cleared))]
    if len(ready) < cell.shards:
        return Union(None)
    made = union_of(cell, [(shard, facts) for shard, facts, _, _ in ready], own.submissions or ())
    if isinstance(made, str):
        return Union(None, made)
    hours = [cell_hours(obs.submissions or (), obs.jobs or (), run_tag=facts.run_tag) for _, facts, _, obs in ready]
    return Union(made, gpu_hours=None if None in hours else sum(h for h in hours if h is not None),
                 overlong=any(overlong for _, _, overlong, _ in ready))


def with_shards(cells: Sequence[Cell], observations: Sequence[Observation], decided: list[CellPlan | Cell],
                policy: Policy, now: datetime, leased: Mapping[str, str],
                quarantined: Sequence[Quarantined]) -> list[CellPlan | Cell]:
    """Each sharded cell planned once its shards are (`plan` leaves it undecided until then): over its own
    observation and their union; then its shards follow it (`following`)."""
    if not any(cell.shards > 1 for cell in cells):
        return decided
    shards: dict[str, list[int]] = {}
    for index, cell in enumerate(cells):
        if cell.shard is not None:
            shards.setdefault(cell.shard.parent, []).append(index)
    planned = list(decided)
    for index, (cell, obs) in enumerate(zip(cells, observations, strict=True)):
        if cell.shards == 1:
            continue
        mine = shards.get(cell.key, [])
        cleared = cleared_union_at(cell, obs)
        joined = union(cell, obs, [(cells[i], observations[i], decided[i]) for i in mine], policy, now, cleared)
        seen = obs if joined.facts is None or obs.run_dirs is None else obs.model_copy(
            update={"run_dirs": (*obs.run_dirs, joined.facts)})
        shard_plans = [plan for i in mine if isinstance(plan := decided[i], CellPlan)]
        pending = len(mine) - len(shard_plans)  # nothing observed yet: launched by the allocation
        cell_plan = with_union(plan_cell(cell, seen, policy, now, leased, quarantined), joined)
        refused = f"their union: {cell_plan.reason}" if joined.facts is not None and launch_of(cell_plan) else ""
        whole = planned[index] = through_shards(cell_plan, shard_plans, pending, joined.problem or refused)
        busy = next((f"its cell's own job {job.job_id} runs" for job in obs.jobs or () if job.state.active),
                    "its cell uploads its own run" if whole.run_dir is not None and not whole.run_dir.shards
                    and whole.phase == Phase.EVALUATED else None)
        for i in mine:
            planned[i] = following(planned[i], whole, cells[i], observations[i], busy, cleared)
    return planned


def cleared_union_at(cell: Cell, obs: Observation) -> datetime | None:
    """When the newest of the cell's union rows was cleared (a Finished row of its tags without metrics: a run
    again, RULES §2), read from every row (under forceEval a shard sees only its own): a shard's run from before
    then is no part of a union, and it runs again."""
    return max((row.created_at for row in obs.rows or () if stem_of(row.job_name or "") == cell.tag_stem
                and row.job_status == RowStatus.FINISHED and not row.has_metrics and row.created_at is not None),
               default=None)


def following(shard_plan: CellPlan | Cell, cell_plan: CellPlan, shard: Cell, obs: Observation, busy: str | None,
              cleared: datetime | None) -> CellPlan | Cell:
    """A shard follows its cell: it launches nothing while a run of the cell's own (from before it ran as shards)
    is live or uploaded, and is Completed with the cell (whose row, under upload.db off or forceEval, it may not
    see) instead of launching or waiting; it starts a new attempt when its done run is older than the cell's cleared
    union row (`cleared_union_at`); with a retry pending, asked of its held cell (`levers.retried`), and no job of
    its own live, it runs again: one new attempt (RULES §13)."""
    launches = not isinstance(shard_plan, CellPlan) or launch_of(shard_plan) is not None
    done = isinstance(shard_plan, CellPlan) and shard_plan.rule == Rule.SHARD_DONE
    if cell_plan.phase == Phase.COMPLETED and (launches or done):
        reason = f"its cell is Completed: {cell_plan.reason}"
        return CellPlan(cell=shard, phase=Phase.COMPLETED, actions=(Skip(reason=reason),), reason=reason,
                        rule=Rule.SHARDS, memory=obs.memory)
    if busy is not None and launches:
        reason = f"{busy}: the shards wait for it"
        return CellPlan(cell=shard, phase=Phase.PENDING, actions=(Wait(reason=reason),), reason=reason,
                        rule=Rule.SHARDS, memory=obs.memory)
    if not isinstance(shard_plan, CellPlan):
        return shard_plan
    live = any(job.state.active for job in obs.jobs or ())
    if cleared is not None and not launches and not live and ran_before(shard, obs, cleared):
        attempt = attempt_after(shard, obs)
        reason = f"its cell's union row was cleared at {cleared:%Y-%m-%d %H:%M}: a run again → attempt {attempt}"
        return shard_plan.model_copy(update={
            "phase": Phase.PENDING, "reason": reason, "rule": Rule.SHARDS_AGAIN,
            "actions": (Submit(run_tag=shard.run_tag(attempt), attempt=attempt, reason=reason),)})
    if not cell_plan.held or shard_plan.held or shard_plan.retry is None or live:
        return shard_plan
    held = shard_plan.model_copy(update={"phase": Phase.FAILED, "reason": f"its cell is held: {cell_plan.reason}",
                                         "actions": (Hold(reason=cell_plan.reason),)})
    return released(held, shard_plan.retry, lambda: attempt_after(shard, obs))


def attempt_after(shard: Cell, obs: Observation) -> int:
    """The shard's next attempt, past every one its submissions, run dirs and rows name."""
    return next_attempt(shard, obs.submissions or (), [facts.run_tag for facts in obs.run_dirs or ()], obs.rows or ())


def ran_before(shard: Cell, obs: Observation, cleared: datetime) -> bool:
    """The shard's newest run ended (its last trial) before its cell's union row was cleared; one with no trial time
    cannot show it ran after."""
    newest = newest_dir(shard, obs.run_dirs or ())
    return newest is not None and (newest.last_progress_at is None or newest.last_progress_at <= cleared)


def with_union(cell_plan: CellPlan, joined: Union) -> CellPlan:
    """The union's upload and MLflow run carry its shards' GPU-hours (the cell has no jobs of its own to sum), and
    its row is flagged overlong when a shard ran overlong (the union's own span is the time between them)."""
    changes: dict[str, object] = {"gpu_hours": joined.gpu_hours} if joined.gpu_hours is not None else {}
    if not changes and not joined.overlong:
        return cell_plan
    actions = tuple(action.model_copy(update=changes | ({"is_overlong": True} if joined.overlong else {}))
                    if type(action) is Upload else action.model_copy(update=changes) if type(action) is Track
                    else action for action in cell_plan.actions)
    return cell_plan.model_copy(update={"actions": actions})


def through_shards(cell_plan: CellPlan, shard_plans: Sequence[CellPlan], pending: int, problem: str) -> CellPlan:
    """The sharded cell's own launch is its shards' to make: it waits, and says how far they are."""
    if launch_of(cell_plan) is None and not problem:
        return cell_plan
    phases = Counter(plan.phase for plan in shard_plans if plan.rule != Rule.SHARD_DONE)
    done = len(shard_plans) - sum(phases.values())
    said = [f"{done} done"] * bool(done) + [f"{count} {phase.value.lower()}" for phase, count in sorted(phases.items())]
    said += [f"{pending} pending"] * bool(pending)
    chosen = cell_plan.memory.shards  # the unsharded key's memory is the cell's former one
    why = f"; chosen by its estimate: {chosen.reason}" if chosen is not None and chosen.count == cell_plan.cell.shards else ""
    reason = f"runs as {len(shard_plans) + pending} shards ({', '.join(said)}){why}" + (f"; {problem}" if problem else "")
    busiest = next((phase for phase in (Phase.STALLED, Phase.RUNNING, Phase.SUBMITTED) if phases[phase]), Phase.PENDING)
    phase = Phase.FAILED if problem else busiest  # a shard held is shown, with its lever, as the shard it is
    others = tuple(action for action in cell_plan.actions if action is not launch_of(cell_plan))
    waits = Hold(reason=reason) if problem else Wait(reason=reason)
    return cell_plan.model_copy(update={"actions": (*others, waits), "phase": phase, "reason": reason,
                                        "rule": Rule.SHARDS})
