"""plan(): the whole controller decision, as a pure function of observed data.

No I/O, no clock, no randomness: `now` is an argument and every fact arrives in an Observation.
Per cell, the first rule that applies decides (each names its `Rule`):
  1. its newest job FAILED / ran out of memory and the run dir cannot be seen  → hold for a human;
  2. a source could not be read                                                 → Unknown, no action;
  3. a run dir of the cell cannot be read and no job of it is live               → Unknown, no action;
  4. a job of the cell is queued or running → watch it: duplicate, stale queue, pre-walltime, zombie,
     stuck near complete, stuck general (RULES §2, §5);
  5. otherwise the newest matching row decides (RULES §2); where that row is ours or missing, an
     interrupted submission is finished first, then the cell's run dir is classified (§4): a dir on disk
     is worth more than a fresh start; a finished run is verified (§5) and its upload gated.
Then, for the whole EvalRun: cells another EvalRun owns only watch; pinggy leases whose job is over are
released; launches share the free pinggy pairs, the GPU-hour budget (`spec.budget.maxGpuHours`: a launch that
would take spent + estimated hours past it is held, with the numbers) and the submission budget, in cell order
(cells with nothing observed that wait past the submission budget share one plan, decided once by the same
rules); `suspend` turns every mutation into a hold.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from pydantic import Field

from controller.core.admission import (
    Admission,
    Admitted,
    GatePolicy,
    Refusal,
    Refused,
    admit,
    distinct_trials,
    expected_trials,
)
from controller.core.dedup import DEDUP_TABLE, RowCase, newest, row_case
from controller.core.gpu_hours import (
    UNKNOWN,
    GpuBudget,
    GpuEstimate,
    SizeBands,
    budget_reason,
    cell_hours,
    job_of,
    launch_cost,
    past_gpu_budget,
)
from controller.core.health import (
    HealthLimits,
    bad_request_share,
    blamed_node,
    count_instant_failures,
    diagnose,
    is_dead_launch,
    no_output_summary,
    read_output,
    unwired_api_base,
    verdict,
)
from controller.core.progress import progress_of
from controller.core.resume import RESUME_TABLE, DirClass, Next, classify
from controller.core.types import (
    Cell,
    CellMemory,
    EvalRunRef,
    FailureMode,
    FailureStage,
    Frozen,
    JobState,
    Observation,
    ObservedJob,
    ObservedRow,
    OutputReading,
    Quarantined,
    QuarantineKind,
    Remedy,
    RemedyCause,
    RemedyKind,
    RowStatus,
    RunDirFacts,
    StallReading,
    Submission,
    TunnelLease,
    run_tag_of,
    stem_of,
    walltime_seconds,
)
from controller.core.vocabulary import (
    Action,
    Analyze,
    Cancel,
    CellPlan,
    Effect,
    EffectKind,
    HealthState,
    Hold,
    Launch,
    Mutation,
    Phase,
    Plan,
    Quarantine,
    Resume,
    RowUpdate,
    Rule,
    Skip,
    Submit,
    Track,
    Upload,
    Wait,
)

OVER_BUDGET = "submission budget used up (maxSubmissionsPerPass / submissionsPerMinute); next pass"
UPLOAD_NOT_VERIFIED = "UploadNotVerified"
PAIR_LOCK = timedelta(hours=1)  # how long a pair whose token the pinggy server holds is handed to no job


class Policy(Frozen):
    """The knobs of one EvalRun on its cluster, in the units the rules use."""

    username: str
    force_eval: bool = False
    suspend: bool = False
    stale_started: timedelta = timedelta(hours=24)
    stale_pending: timedelta = timedelta(hours=6)
    max_total_fires: int = 2
    infra_error_threshold: int = 10
    near_complete_fraction: float = 0.97
    stale_near: timedelta = timedelta(minutes=60)
    stale_general: timedelta = timedelta(minutes=90)
    pre_walltime: timedelta = timedelta(minutes=15)
    settle: timedelta = timedelta(minutes=60)
    zombie_grace: timedelta = timedelta(minutes=10)
    upload_db: bool = True
    track: bool = Field(False, description="log to the tracker (MLflow); Completed needs its read-back")
    admission: GatePolicy = Field(GatePolicy(), description="what the admission gate lets through (RULES §14)")
    overlong: timedelta | Literal["walltime"] = Field(
        "walltime", description="a run longer than this is overlong (walltime: than one job of its cell may run)")
    walltime: timedelta = Field(timedelta(hours=24), description="the cluster's timeLimit (a cell may ask more)")
    hold_overlong: bool = Field(False, description="upload.overlong hold: an overlong run waits for forceUpload; "
                                                   "otherwise it is uploaded with is_overlong true")
    force_upload: bool = Field(False, description="an overlong hold is released by a human")
    max_submissions_per_pass: int = 6
    max_live_jobs: int = Field(50, description="the cluster's ceiling on our queued + running jobs (the caller's "
                                               "budget counts it)")
    tunnel_pairs: tuple[str, ...] = ()
    tunnel_urls: dict[str, str] = Field(default_factory=dict, description="pair → its public URL, where given")
    cancel_on_delete: bool = Field(False, description="deletionPolicy Cancel: deleting the EvalRun cancels its jobs")
    health: HealthLimits = HealthLimits()
    cluster: str = Field("", description="the EvalCluster, as quarantines of its nodes and launches name it")
    max_gpu_hours: float | None = Field(None, description="spec.budget.maxGpuHours: launches past it are held")
    gpus_per_job: int = Field(0, description="the cluster's gpusPerJob: what a run dir's wall time costs")
    size_bands: SizeBands = Field(SizeBands(), description="the size policy's bands: whose GPU-hours compare")


def plan(
    evalrun: EvalRunRef,
    cells: Sequence[Cell],
    observations: Sequence[Observation],
    policy: Policy,
    now: datetime,
    budget: int | None = None,
    budget_note: str = OVER_BUDGET,
    tunnel_leases: Sequence[TunnelLease] = (),
    live_job_names: frozenset[str] | None = None,
    owners: Mapping[str, EvalRunRef] | None = None,
    quarantined: Sequence[Quarantined] = (),
    estimates: Mapping[str, GpuEstimate] | None = None,
    usable_nodes: frozenset[str] | None = None,
) -> Plan:
    """Decide every cell, then share out what is scarce: launches (`budget`, default the policy's
    per-pass cap; `budget_note`: why the cells past it wait) and pinggy pairs (`policy.tunnel_pairs` minus those
    leased to live jobs or locked).

    `live_job_names`: every queued or running job on the cluster (None: the queue was not read).
    `owners`: cell key → the OTHER EvalRun that acts for it; such a cell is shown, never acted on.
    `quarantined`: nodes, pairs and cluster launches not to use now (the store's unexpired quarantines).
    `estimates`: cell key → the estimated GPU-hours of one attempt (unknown where missing), for the budget.
    `usable_nodes`: the nodes the cluster's jobs may run on (None: not known), so quarantines never take them all.
    """
    estimates = estimates or {}
    leased = {lease.holder: lease.pair for lease in tunnel_leases}
    decided: list[CellPlan | Cell] = [  # a Cell: nothing observed, decided below with the budget
        cell if _untouched(cell, obs) and not (owners and cell.key in owners)
        else plan_cell(cell, obs, policy, now, leased=leased, quarantined=quarantined)
        for cell, obs in zip(cells, observations, strict=True)]
    decided = [owned_elsewhere(c, owners[c.cell.key]) if isinstance(c, CellPlan) and owners and c.cell.key in owners
               else c for c in decided]
    released = () if policy.suspend else ended_leases(evalrun, tunnel_leases, observations, live_job_names)
    holders = {lease.pair: lease.holder for lease in tunnel_leases if lease not in released}
    ours = tuple(q for q in quarantined if q.scope in (str(evalrun), policy.cluster))
    decided = _within_node_cap(decided, ours, policy, usable_nodes)
    # what this very plan quarantines counts for its own launches (a refire must not go back to the bad node)
    deciding = [q for c in decided if isinstance(c, CellPlan) for a in c.actions if isinstance(a, Quarantine)
                if (q := _as_quarantined(a, now)).scope in (str(evalrun), policy.cluster)]
    locked = {q.name for q in (*ours, *deciding) if q.kind == QuarantineKind.PAIR}
    bad_nodes = tuple(sorted({q.name for q in (*ours, *deciding) if q.kind == QuarantineKind.NODE}))
    backing_off = next((q for q in (*ours, *deciding) if q.kind == QuarantineKind.CLUSTER), None)
    remaining = policy.max_submissions_per_pass if budget is None else budget
    over_budget = Wait(reason=budget_note)
    paused = None if backing_off is None else Wait(
        reason=f"launches on {policy.cluster} back off until {backing_off.until:%H:%M} UTC: {backing_off.reason}")
    nowhere = _no_usable_node(policy.cluster, bad_nodes, usable_nodes)
    untouched_waits: CellPlan | None = None  # 10,000 fresh cells past the budget: their one plan, decided once
    gpu, probing = _gpu_budget(evalrun, decided, observations, policy, estimates)
    planned = []
    for cell_plan in decided:
        blocked = nowhere or paused or (over_budget if remaining <= 0 else None)
        if isinstance(cell_plan, Cell) and blocked is not None:
            untouched_waits = untouched_waits or _without_launch(plan_cell(cell_plan, UNTOUCHED, policy, now), blocked)
            cell_plan = untouched_waits.model_copy(update={"cell": cell_plan})
        elif isinstance(cell_plan, Cell):
            cell_plan = plan_cell(cell_plan, UNTOUCHED, policy, now)
        launch = launch_of(cell_plan)
        if launch is not None:
            pair = _pair_for(launch, policy, holders, locked) if cell_plan.cell.needs_pinggy else None
            estimate = estimates.get(cell_plan.cell.key, UNKNOWN)
            cost = launch_cost(estimate, cell_plan.run_dir, resume=isinstance(launch, Resume))
            gpu_hold = _gpu_hold(gpu, cost, estimate, probing)
            if cell_plan.cell.needs_pinggy and pair is None:
                cell_plan = _without_launch(cell_plan, _no_pair(policy, holders, locked))
            elif nowhere is not None:
                cell_plan = _without_launch(cell_plan, nowhere)
            elif paused is not None and not _answers_back_off(cell_plan):
                cell_plan = _without_launch(cell_plan, paused)
            elif gpu_hold is not None:
                cell_plan = _without_launch(cell_plan, Hold(reason=gpu_hold))
                gpu = gpu.model_copy(update={"held": gpu.held + 1})
            elif remaining <= 0:
                cell_plan = _without_launch(cell_plan, over_budget)  # one Wait for all: 10,000 cells wait alike
            else:
                remaining -= 1
                if cost is None and gpu.max_hours is not None:  # the first of its group: it measures the cost
                    cost = _prior_hours(cell_plan.cell, policy)
                    probing.add(estimate.group)
                    cell_plan = _noted(cell_plan, f"GPU-hour probe for {estimate.group}: no estimate yet, counted "
                                                  f"as its walltime × GPUs ({cost:.3g} GPU-h) until it reports")
                gpu = gpu.model_copy(update={"committed": gpu.committed + (cost or 0.0),
                                             "unestimated": gpu.unestimated + (estimate.hours is None)})
                if pair is not None:
                    holders[pair] = launch.submission_name
                cell_plan = _placed(cell_plan, launch, pair, bad_nodes)
        if policy.suspend:
            cell_plan = _suspended(cell_plan)
        planned.append(cell_plan)
    return Plan(evalrun=evalrun, cells=tuple(planned), suspended=policy.suspend, tunnel_releases=released,
                quarantined=ours, estimates=dict(estimates), gpu_budget=gpu,
                effects=_effects(ours, deciding, planned))


EFFECT_KINDS: dict[QuarantineKind, EffectKind] = {
    QuarantineKind.CLUSTER: "back-off", QuarantineKind.NODE: "node", QuarantineKind.PAIR: "pinggy-pair"}


def _effects(live: Sequence[Quarantined], deciding: Sequence[Quarantined],
             planned: Sequence[CellPlan]) -> tuple[Effect, ...]:
    """The remedies in force for `status` and `explain`: the store's quarantines, the ones this plan starts, and
    refires waiting out their back-off."""
    found: dict[tuple[str, str], Effect] = {}
    for q in (*live, *deciding):
        found.setdefault((q.kind.value, q.name), Effect(
            kind=EFFECT_KINDS[q.kind], subject=q.name, cause=q.reason, since=q.since, until=q.until,
            owner=q.owner))
    refires = tuple(Effect(kind="refire", subject=c.cell.label, cause=remedy.diagnosis, since=remedy.at,
                           until=c.refire_due, owner=str(c.cell.evalrun))
                    for c in planned if c.refire_due is not None
                    for remedy in (c.remember or c.memory).remedies[-1:])
    return (*found.values(), *refires)


def _gpu_budget(evalrun: EvalRunRef, decided: Sequence[CellPlan | Cell], observations: Sequence[Observation],
                policy: Policy, estimates: Mapping[str, GpuEstimate]) -> tuple[GpuBudget, set[str]]:
    """Before any launch: what this EvalRun's jobs have spent, plus what its live cells are still expected to
    spend (their estimate, or with none their walltime × GPUs, less what their live attempt has used); and the
    groups (benchmark, size band) whose cost a live cell without an estimate is measuring."""
    spent = committed = 0.0
    unestimated = 0
    probing: set[str] = set()
    for decision, obs in zip(decided, observations, strict=True):
        if isinstance(decision, Cell):
            continue
        spent += decision.gpu_hours or 0.0
        if policy.max_gpu_hours is None or not obs.submissions or obs.jobs is None:
            continue  # without a budget, what live cells still need decides nothing
        live = next((job for job in obs.jobs if job.state.active), None)
        if live is None:
            continue
        ours = [s for s in obs.submissions if evalrun.known_as(s.evalrun)]
        estimate = estimates.get(decision.cell.key, UNKNOWN)
        if estimate.hours is None:
            unestimated += 1
            probing.add(estimate.group)
        expected = _prior_hours(decision.cell, policy) if estimate.hours is None else estimate.hours
        committed += max(expected - (cell_hours(ours, obs.jobs, run_tag=run_tag_of(live.name)) or 0.0), 0.0)
    return GpuBudget(max_hours=policy.max_gpu_hours, spent=spent, committed=spent + committed,
                     unestimated=unestimated), probing


def _gpu_hold(gpu: GpuBudget, cost: float | None, estimate: GpuEstimate, probing: set[str]) -> str | None:
    """Why the budget holds a launch, if it does. Without an estimate, one launch per group probes the cost (while
    any budget is left); the rest of its group waits for that number."""
    if gpu.max_hours is None:
        return None
    if cost is not None:
        return budget_reason(gpu, cost) if past_gpu_budget(gpu, cost) else None
    if estimate.group in probing:
        return (f"budget: no GPU-hour estimate for {estimate.group} yet; a probe job of it is measuring the cost, "
                "and this launch waits for that number (spec.budget.maxGpuHours)")
    return budget_reason(gpu, None) if gpu.committed >= gpu.max_hours else None


def _prior_hours(cell: Cell, policy: Policy) -> float:
    """The most one job of the cell can cost: its walltime × the cluster's GPUs per job."""
    seconds = walltime_seconds(cell.time_limit) if cell.time_limit else policy.walltime.total_seconds()
    return seconds / 3600 * policy.gpus_per_job


def _answers_back_off(cell_plan: CellPlan) -> bool:
    """The refire of a failure that backed the cluster off: the pause it started never blocks it."""
    memory = cell_plan.remember or cell_plan.memory
    remedy = memory.remedies[-1] if memory.remedies else None
    return cell_plan.rule == Rule.REFIRE and remedy is not None and remedy.kind == RemedyKind.BACK_OFF


def _within_node_cap(decided: list[CellPlan | Cell], live: Sequence[Quarantined], policy: Policy,
                     usable: frozenset[str] | None) -> list[CellPlan | Cell]:
    """New node quarantines, in cell order, while the cluster has fewer than `health.maxQuarantinedNodes` and at
    least one usable node would stay; past that the refire still goes elsewhere-or-anywhere, without excluding."""
    nodes = {q.name for q in live if q.kind == QuarantineKind.NODE and q.scope == policy.cluster}
    kept: list[CellPlan | Cell] = []
    for decision in decided:
        if isinstance(decision, Cell) or not any(isinstance(a, Quarantine) and a.subject == QuarantineKind.NODE
                                                 for a in decision.actions):
            kept.append(decision)
            continue
        actions: list[Action] = []
        skipped = []
        for action in decision.actions:
            if not (isinstance(action, Quarantine) and action.subject == QuarantineKind.NODE) or action.name in nodes:
                actions.append(action)
            elif len(nodes) >= policy.health.max_quarantined_nodes:
                skipped.append(f"node {action.name} not quarantined: {len(nodes)} already "
                               f"(health.maxQuarantinedNodes {policy.health.max_quarantined_nodes})")
            elif usable is not None and usable <= nodes | {action.name}:
                skipped.append(f"node {action.name} not quarantined: it is the last usable node of "
                               f"{policy.cluster}")
            else:
                nodes.add(action.name)
                actions.append(action)
        kept.append(decision.model_copy(update={"actions": tuple(actions)}) if not skipped else
                    _noted(decision.model_copy(update={"actions": tuple(actions)}), "; ".join(skipped)))
    return kept


def _no_usable_node(cluster: str, bad_nodes: Sequence[str], usable: frozenset[str] | None) -> Hold | None:
    """Every node the cluster's jobs may use is quarantined: a launch would only wait on BadConstraints."""
    if not usable or not usable <= set(bad_nodes):
        return None
    return Hold(reason=f"every usable node of {cluster} is quarantined ({', '.join(sorted(usable))}): release one "
                       f"with `evalctl nodes release NODE --cluster {cluster}`, or wait for the quarantines to end")


def _noted(cell_plan: CellPlan, note: str) -> CellPlan:
    return cell_plan.model_copy(update={"reason": f"{cell_plan.reason}; {note}"})


def _spent(cell: Cell, obs: Observation) -> float | None:
    """The actual GPU-hours of the EvalRun's own jobs of the cell (another EvalRun's are its own)."""
    ours = [s for s in obs.submissions or () if cell.evalrun.known_as(s.evalrun)]
    return cell_hours(ours, obs.jobs or ())


UNTOUCHED = Observation(rows=(), submissions=(), jobs=(), run_dirs=())


def _untouched(cell: Cell, obs: Observation) -> bool:
    """Nothing seen of a cell that needs no pinggy pair: its plan depends on the budget alone."""
    seen = (obs.rows, obs.submissions, obs.jobs, obs.run_dirs, obs.outputs, obs.memory, obs.unknown_reason)
    return seen == ((), (), (), (), (), UNTOUCHED.memory, "") and not cell.needs_pinggy


def _as_quarantined(action: Quarantine, now: datetime) -> Quarantined:
    return Quarantined(kind=action.subject, scope=action.scope, name=action.name, reason=action.reason,
                       until=now + timedelta(seconds=action.ttl_s), since=now, owner=action.owner)


def plan_deletion(evalrun: EvalRunRef, cells: Sequence[Cell], observations: Sequence[Observation],
                  owners: Mapping[str, EvalRunRef]) -> Plan:
    """deletionPolicy Cancel: cancel every queued or running job of the cells this EvalRun owns; nothing else."""
    planned = []
    for cell, obs in zip(cells, observations, strict=True):
        live = [job for job in obs.jobs or () if job.state.active]
        if cell.key in owners or not live:
            continue
        cancels = tuple(Cancel(job_id=job.job_id, reason=f"EvalRun {evalrun} deleted with deletionPolicy Cancel")
                        for job in live)
        phase = Phase.RUNNING if any(job.state == JobState.RUNNING for job in live) else Phase.SUBMITTED
        planned.append(CellPlan(cell=cell, phase=phase, actions=cancels, reason="EvalRun deleted",
                                rule=Rule.DELETION_CANCEL, memory=obs.memory))
    return Plan(evalrun=evalrun, cells=tuple(planned))


def launch_of(cell_plan: CellPlan) -> Launch | None:
    return next((a for a in cell_plan.actions if isinstance(a, Submit | Resume)), None)


def owned_elsewhere(cell_plan: CellPlan, owner: EvalRunRef) -> CellPlan:
    """Another EvalRun acts for this cell: keep what was observed (phase, reason, score), do nothing."""
    reason = f"owned by EvalRun {owner}"
    return cell_plan.model_copy(update={
        "actions": (Skip(reason=reason),), "row_updates": (), "remember": None,
        "reason": f"{cell_plan.reason} ({reason})", "rule": Rule.OWNED_ELSEWHERE})


def ended_leases(evalrun: EvalRunRef, leases: Sequence[TunnelLease], observations: Sequence[Observation],
                 live_job_names: frozenset[str] | None) -> tuple[TunnelLease, ...]:
    """This EvalRun's leases whose holder is no live job and will not be launched by a repair.

    A lease whose submission never reached sbatch (a crash between intent and sbatch) is kept: the repair
    reuses it. A lease whose submission no cell knows any more (the spec changed) goes once its job is over.
    A lease stamped with the bare name of a namespaced EvalRun (versions before 0.2) is this EvalRun's when
    its holder is a submission of one of its cells.
    """
    if live_job_names is None:
        return ()
    subs = {s.name: s for obs in observations for s in obs.submissions or ()}
    jobs = [job for obs in observations for job in obs.jobs or ()]
    ended = []
    for lease in leases:
        ours = lease.evalrun == evalrun or (evalrun.known_as(lease.evalrun) and lease.holder in subs)
        if not ours or lease.holder in live_job_names:
            continue
        sub = subs.get(lease.holder)
        awaiting_repair = sub is not None and sub.job_id is None and not any(
            job.name == sub.name and sub.may_have_launched(job) for job in jobs)
        if not awaiting_repair:
            ended.append(lease)
    return tuple(ended)


def plan_cell(cell: Cell, obs: Observation, policy: Policy, now: datetime, *,
              leased: Mapping[str, str] | None = None, quarantined: Sequence[Quarantined] = ()) -> CellPlan:
    """`leased`: submission name → the pinggy pair leased to its job."""
    if obs.run_dirs and cell.calls_model:  # instant failures are infra whatever Harbor called them
        obs = obs.model_copy(update={"run_dirs": tuple(count_instant_failures(d, policy.health.instant_fail)
                                                         for d in obs.run_dirs)})
    failed = _failed_job(obs.jobs) if obs.run_dirs is None else None
    if failed is not None and obs.rows is not None and obs.submissions is not None:
        # A hold changes nothing: a job that failed needs a human whether or not its run dir can be seen.
        reason = f"job {failed.job_id} {_failure(failed, policy)} (run dir not observed: {obs.unknown_reason})"
        return CellPlan(cell=cell, phase=Phase.FAILED, actions=(Hold(reason=reason),), reason=reason,
                        rule=Rule.JOB_FAILED_DIR_UNSEEN, memory=obs.memory, gpu_hours=_spent(cell, obs))
    if obs.rows is None or obs.submissions is None or obs.jobs is None or obs.run_dirs is None:
        # Only the run dirs unseen: a job found by its name is still recorded (bookkeeping of what was read).
        adoptions = () if obs.rows is None or obs.submissions is None or obs.jobs is None else tuple(
            _CellRules(cell, obs.model_copy(update={"run_dirs": ()}), policy, now).adoptions)
        return CellPlan(
            cell=cell,
            phase=Phase.UNKNOWN,
            actions=(),
            reason=f"not observed: {obs.unknown_reason or 'a source could not be read'}{_last_job_note(obs.jobs)}",
            rule=Rule.OBSERVATION_FAILED,
            row_updates=adoptions,
            memory=obs.memory,
            gpu_hours=_spent(cell, obs),  # the budget still counts what its jobs spent
        )
    rules = _CellRules(cell, obs, policy, now, leased or {}, quarantined)
    live = [job for job in obs.jobs if job.state.active]
    broken = next((d for d in rules.dirs.values() if d.unreadable), None)
    if broken is not None and not live:  # with a live job, the walltime and queue rules need no trial data
        return CellPlan(
            cell=cell,
            phase=Phase.UNKNOWN,
            actions=(),
            reason=f"not observed: run dir {broken.run_tag} cannot be read: {broken.unreadable}",
            rule=Rule.RUN_DIR_UNREADABLE,
            run_dir=broken,
            memory=obs.memory,
            gpu_hours=rules.gpu_hours,
        )
    return rules.in_flight(live) if live else rules.settled()


class _CellRules:
    """The rules of one cell over derived views of its observation (its own submissions, rows, dirs, jobs)."""

    def __init__(self, cell: Cell, obs: Observation, policy: Policy, now: datetime,
                 leased: Mapping[str, str] | None = None, quarantined: Sequence[Quarantined] = ()):
        assert obs.rows is not None and obs.submissions is not None
        assert obs.jobs is not None and obs.run_dirs is not None
        self.cell, self.policy, self.now = cell, policy, now
        self.subs: list[Submission] = sorted(obs.submissions, key=lambda s: (s.attempt, s.fire, s.created_at))
        self.own_row_ids = {s.row_id for s in self.subs if s.row_id}
        own_tags = {s.run_tag for s in self.subs}
        self.all_rows = obs.rows
        self.rows = tuple(r for r in obs.rows if r.id in self.own_row_ids) if policy.force_eval else obs.rows
        self.dirs: dict[str, RunDirFacts] = {
            d.run_tag: d for d in obs.run_dirs if not policy.force_eval or d.run_tag in own_tags
        }
        self.jobs = obs.jobs
        self.memory = obs.memory
        self.learnt = obs.memory  # the memory with what this pass read (a job's output); written if it changed
        self.outputs = {output.job_id: output for output in obs.outputs or ()}
        self.leased = leased or {}
        self.quarantined = quarantined
        self.model_names, self.benchmark_names = obs.model_names, obs.benchmark_names
        self.adoptions = [
            RowUpdate(submission_name=s.name, job_id=job.job_id, row_id=s.row_id)
            for s in self.subs
            if s.job_id is None
            and (job := self._newest([j for j in self._jobs_named(s.name) if s.may_have_launched(j)])) is not None
        ] + self._gpu_recordings()
        self.gpu_hours = _spent(cell, obs)

    def _gpu_recordings(self) -> list[RowUpdate]:
        """Our submissions whose job has ended with GPU-hours not recorded yet: recorded now, so they outlive the
        scheduler's accounting window (sacct looks back 14 days)."""
        found: list[RowUpdate] = []
        if not self.jobs:
            return found
        for sub in self.subs:
            job = job_of(sub, self.jobs)
            if job is not None and not job.state.active and job.gpu_hours is not None and sub.gpu_hours is None:
                found.append(RowUpdate(submission_name=sub.name, gpu_hours=job.gpu_hours))
        return found

    def _attempt_hours(self, run_tag: str) -> float | None:
        return cell_hours(self.subs, self.jobs, run_tag=run_tag)

    # ------------------------------------------------------------------ a job is queued or running

    def in_flight(self, live: list[ObservedJob]) -> CellPlan:
        live = sorted(live, key=lambda j: (_job_order(j.job_id), j.job_id))
        job, duplicates = live[0], live[1:]
        actions: list[Action] = [
            Cancel(reason=f"duplicate live job for one cell (keeping {job.job_id})", job_id=dup.job_id)
            for dup in duplicates
        ]
        updates = self._bookkeeping(job)
        facts = self.dirs.get(self._dir_tag(job))

        if job.state == JobState.QUEUED:
            queued_since = self._submitted_at(job)
            if queued_since is not None and self.now - queued_since >= self.policy.stale_pending:
                attempt = self._next_attempt()
                actions += [
                    Cancel(reason="stale pending: cancel the queued job first", job_id=job.job_id,
                           clears_way_for_launch=True),
                    self._submit(attempt, f"stale pending: queued since {queued_since:%Y-%m-%d %H:%M}; new attempt"),
                ]
                return self._result(Phase.SUBMITTED, actions, f"stale pending (job {job.job_id})", Rule.QUEUED_STALE,
                                    updates, facts)
            actions.append(Wait(reason=f"job {job.job_id} queued"))
            return self._result(Phase.SUBMITTED, actions, f"job pending (job {job.job_id} queued)", Rule.QUEUED,
                                updates, facts)

        if job.time_left_s is not None and job.time_left_s <= self.policy.pre_walltime.total_seconds():
            actions.append(Cancel(job_id=job.job_id,
                                  reason=f"{job.time_left_s // 60} min of walltime left; cancel now, resume later"))
            return self._result(Phase.RUNNING, actions, "pre-walltime cancel", Rule.PRE_WALLTIME, updates, facts)
        self._read_output(job)
        run = self._running(job, facts, actions, updates)
        for check in RUNNING_RULES:
            decided = check(self, run)
            if decided is not None:
                return _with_advice(decided, run.advice)
        run.actions.append(Wait(reason=f"job {job.job_id} running"))
        moving = self.learnt.model_copy(update={"stall_reading": None})  # progress ends a stall reading
        state, note = verdict(run.reading, facts, job.started_at, self.policy.health, self.now)
        return self._result(Phase.RUNNING, run.actions, f"job running ({_progress(facts)}); {note}", Rule.IN_FLIGHT,
                            updates, facts, remember=moving, health=(state, note))

    # ------------------------------------------------------------------ RULES §8: launch health

    def _read_output(self, job: ObservedJob) -> None:
        output = self.outputs.get(job.job_id)
        if output is not None and output.text:
            reading = read_output(self.learnt.output, output, self.policy.health.failure_modes, self.now)
            self.learnt = self.learnt.model_copy(update={"output": reading})

    def _reading(self, job: ObservedJob) -> OutputReading | None:
        reading = self.learnt.output
        return reading if reading is not None and reading.job_id == job.job_id else None

    def _running(self, job: ObservedJob, facts: RunDirFacts | None, actions: list[Action],
                 updates: list[RowUpdate]) -> _Running:
        """The derived view every running rule reads, with the effect of a back-off or hold match already among
        its actions: whatever rule decides, the match's back-off starts (once per matched line)."""
        reading = self._reading(job)
        readable = facts if facts is not None and not facts.unreadable else None
        mode = next((m for m in self.policy.health.failure_modes if reading is not None and m.name == reading.failure
                     and m.when == FailureStage.RUNNING), None)
        advice = mode if mode is not None and mode.remedy in (RemedyKind.BACK_OFF, RemedyKind.HOLD) else None
        if advice is not None and reading is not None and reading.failure_at == self.now:
            actions = [*actions, *self._quarantines(
                Remedy(run_tag="", kind=advice.remedy, diagnosis=f"{advice.name}: {advice.advice}", at=self.now,
                       backoff_minutes=advice.backoff_minutes, cause=RemedyCause.KNOWN_FAILURE), job, since=self.now)]
        expected = expected_trials(self.cell, readable)[0] if readable is not None else None
        last = readable.last_progress_at or job.started_at if readable is not None else None
        return _Running(job=job, facts=facts, readable=readable, reading=reading, actions=actions, updates=updates,
                        expected=expected or None, quiet=self.now - last if last is not None else timedelta(0),
                        catalogued=mode, advice=advice)

    # Each check of a running job, in RUNNING_RULES order: a plan when it decides, else None.

    def _dead_launch(self, run: _Running) -> CellPlan | None:
        facts = run.readable
        if facts is None or facts.n_completed < self.policy.health.dead_launch_trials or not is_dead_launch(facts):
            return None
        return self._cancel_to_remedy(run, facts, RemedyCause.DEAD_LAUNCH, RemedyKind.REFIRE, _dead_launch(facts))

    def _zombie(self, run: _Running) -> CellPlan | None:
        facts = run.readable
        if facts is None or not run.expected or run.quiet < self.policy.zombie_grace \
                or distinct_trials(facts, self.cell.n_attempts) < run.expected:
            return None
        return self._cancel_to_upload(run, facts, "zombie job", Rule.ZOMBIE,
                                      f"every trial has a result ({_progress(facts)}) but the job still runs")

    def _stuck_near_complete(self, run: _Running) -> CellPlan | None:
        facts = run.readable
        if facts is None or not run.expected or run.quiet < self.policy.stale_near \
                or facts.n_scored < math.ceil(self.policy.near_complete_fraction * run.expected):
            return None
        return self._cancel_to_upload(run, facts, "stuck near complete", Rule.STUCK_NEAR_COMPLETE,
                                      f"{_progress(facts)}, no new score for {_minutes(run.quiet)}")

    def _pinggy_unwired(self, run: _Running) -> CellPlan | None:
        if run.readable is None or not self.cell.needs_pinggy:
            return None
        pair = self.leased.get(run.job.name)
        unwired = unwired_api_base(run.readable.api_base, self.policy.tunnel_urls.get(pair or ""))
        if not unwired:
            return None
        return self._cancel_to_remedy(run, run.readable, RemedyCause.PINGGY_NOT_WIRED, RemedyKind.HOLD,
                                      f"pinggy not wired: {unwired}; the job must send the agent to its pair's "
                                      "public URL (EVAL_PINGGY_URL)")

    def _pinggy_locked(self, run: _Running) -> CellPlan | None:
        if run.reading is None or run.reading.pinggy != "locked":
            return None
        pair = self.leased.get(run.job.name)
        locked = "pinggy pair locked: a tunnel with the same token is already active on the server"
        if pair:
            run.actions.append(Quarantine(subject=QuarantineKind.PAIR, scope=str(self.cell.evalrun), name=pair,
                                          reason=locked, ttl_s=PAIR_LOCK.total_seconds(), owner=str(self.cell.evalrun)))
        return self._cancel_to_remedy(run, run.facts, RemedyCause.PINGGY_LOCKED, RemedyKind.REFIRE,
                                      f"{locked} (pair {pair}); refire on another pair")

    def _catalog_cancel(self, run: _Running) -> CellPlan | None:
        mode = run.catalogued
        if mode is None or mode.remedy not in (RemedyKind.REFIRE, RemedyKind.REFIRE_ELSEWHERE):
            return None
        return self._cancel_to_remedy(run, run.facts, RemedyCause.KNOWN_FAILURE, mode.remedy,
                                      f"{mode.name}: {mode.advice}", mode.job_env)

    def _launch_stalled(self, run: _Running) -> CellPlan | None:
        started, facts = run.job.started_at, run.readable
        launching = facts is None or (facts.n_started_trials == 0 and facts.n_completed == 0)
        unreadable = run.facts is not None and run.facts.unreadable
        if not launching or started is None or unreadable or self.now - started < self.policy.health.launch_grace:
            return None
        return self._cancel_to_remedy(run, run.facts, RemedyCause.LAUNCH_STALLED, RemedyKind.REFIRE,
                                      f"stalled launch: no trial started in {_minutes(self.now - started)} "
                                      f"(health.launchGraceMinutes {_minutes(self.policy.health.launch_grace)})")

    def _no_traffic(self, run: _Running) -> CellPlan | None:
        reading, facts = run.reading, run.readable
        pending = facts is None or facts.n_total is None or facts.n_completed < facts.n_total
        if reading is None or reading.ready_at is None or not pending:
            return None
        quiet = self.now - (reading.last_request_at or reading.ready_at)
        if quiet < self.policy.health.no_traffic:
            return None
        return self._stalled(run, Rule.NO_TRAFFIC, f"no traffic: no chat completion request for {_minutes(quiet)} "
                                                   "since vLLM was ready, with trials pending (agents not reaching "
                                                   "the model?)")

    def _bad_requests(self, run: _Running) -> CellPlan | None:
        health, reading = self.policy.health, run.reading
        share = bad_request_share(reading) if reading is not None else None
        if reading is None or share is None or share <= health.bad_request_fraction:
            return None
        return self._stalled(run, Rule.BAD_REQUESTS,
                             f"{share:.0%} of {reading.requests} requests answered 400 (health.badRequestFraction "
                             f"{health.bad_request_fraction:g}): context overflow? lower max_input_tokens / "
                             "max_output_tokens in the harbor config")

    def _catalog_advice(self, run: _Running) -> CellPlan | None:
        """A back-off or hold match: the job goes on (the cluster launches less, or a human decides)."""
        if run.advice is None:
            return None
        return self._stalled(run, Rule.KNOWN_FAILURE, f"{run.advice.name}: {run.advice.advice}")

    def _cancel_to_remedy(self, run: _Running, facts: RunDirFacts | None, cause: RemedyCause, kind: RemedyKind,
                          diagnosis: str, job_env: Mapping[str, str] | None = None) -> CellPlan:
        """Cancel a job that cannot work, and remember what to do once it ended (refire, or a human)."""
        job = run.job
        remedy = Remedy(run_tag=facts.run_tag if facts is not None else self._dir_tag(job), kind=kind,
                        diagnosis=diagnosis, at=self.now, node=blamed_node(job.nodes, job.log_tail),
                        job_env=dict(job_env or {}), cause=cause)
        cancel = Cancel(job_id=job.job_id, reason=diagnosis)
        rule = DIAGNOSED_BY[cause]
        return self._result(Phase.STALLED, [*run.actions, cancel, *self._quarantines(remedy, job, since=self.now)],
                            diagnosis, rule, run.updates, facts, remember=self._with_remedy(remedy),
                            health=(HealthState.DEAD, diagnosis))

    def _stalled(self, run: _Running, rule: Rule, diagnosis: str) -> CellPlan:
        """Running but not working: reported, not cancelled (a long tail or a slow model can look alike)."""
        return self._result(Phase.STALLED, [*run.actions, Wait(reason=diagnosis)], diagnosis, rule, run.updates,
                            run.facts, remember=self.learnt, health=(HealthState.STALLED, diagnosis))

    def _with_remedy(self, remedy: Remedy) -> CellMemory:
        kept = tuple(r for r in self.learnt.remedies if r.run_tag != remedy.run_tag)
        return self.learnt.model_copy(update={"remedies": (*kept, remedy)})

    def _quarantines(self, remedy: Remedy, job: ObservedJob | None, since: datetime) -> list[Action]:
        """What a remedy takes out of use, from `since` (the failure it answers), unless already: the one node a
        refire-elsewhere failure points at, or the cluster's new launches for a back-off's minutes."""
        health, cluster, owner = self.policy.health, self.policy.cluster, str(self.cell.evalrun)
        active = {(q.kind, q.scope, q.name) for q in self.quarantined}
        if remedy.kind == RemedyKind.REFIRE_ELSEWHERE and remedy.node:
            if (QuarantineKind.NODE, cluster, remedy.node) not in active:
                return [Quarantine(subject=QuarantineKind.NODE, scope=cluster, name=remedy.node, owner=owner,
                                   reason=remedy.diagnosis, ttl_s=health.bad_node.total_seconds())]
        left = remedy.backoff_minutes * 60.0 - (self.now - since).total_seconds()
        if remedy.kind == RemedyKind.BACK_OFF and left > 0 and (QuarantineKind.CLUSTER, cluster, cluster) not in active:
            return [Quarantine(subject=QuarantineKind.CLUSTER, scope=cluster, name=cluster, reason=remedy.diagnosis,
                               ttl_s=left, owner=owner)]
        return []

    def _stuck_general(self, run: _Running) -> CellPlan | None:
        """Long retry tails are normal: the first reading only reports; a second one, a whole `stale_general`
        later with still no new score, cancels and uploads what is there (RULES §5: the second consecutive reading)."""
        facts = run.readable
        if facts is None or not run.expected or run.quiet < self.policy.stale_general:
            return None
        progress = _progress(facts)
        reading = self.memory.stall_reading
        same = reading is not None and reading.run_tag == facts.run_tag and reading.scored == facts.n_scored
        first_at = reading.at if reading is not None and same else None
        if first_at is not None and self.now - first_at >= self.policy.stale_general:
            return self._cancel_to_upload(run, facts, "stuck general, second reading", Rule.STUCK_GENERAL_AGAIN,
                                          f"{progress}, no new score since {first_at:%Y-%m-%d %H:%M}")
        actions = [*run.actions, Wait(reason=f"no new score for {_minutes(run.quiet)} ({progress})")]
        remember = self.learnt if first_at is not None else self.learnt.model_copy(update={
            "stall_reading": StallReading(run_tag=facts.run_tag, scored=facts.n_scored, at=self.now)})
        return self._result(Phase.STALLED, actions, f"stalled: no progress for {_minutes(run.quiet)}"
                            + (f" (first reading {first_at:%H:%M}; cancelled if still stuck a "
                               f"{_minutes(self.policy.stale_general)} after it)" if first_at else " (first reading)"),
                            Rule.STUCK_GENERAL, run.updates, facts, remember=remember)

    def _cancel_to_upload(self, run: _Running, facts: RunDirFacts, what: str, rule: Rule, why: str) -> CellPlan:
        """Cancel, and remember that this run dir is to be uploaded as it is once it settles, never resumed."""
        actions = [*run.actions, Cancel(job_id=run.job.job_id, reason=f"{what}: {_progress(facts)}")]
        remember = self.learnt.model_copy(update={"stall_reading": None, "upload_as_is": facts.run_tag})
        return self._result(Phase.STALLED, actions, f"{what}: {why}", rule, run.updates, facts, remember=remember)

    def _bookkeeping(self, job: ObservedJob) -> list[RowUpdate]:
        """Move our Pending row to Started once its job runs."""
        sub = next((s for s in self.subs if s.name == job.name), None)
        row = self._own_row(sub.row_id) if sub is not None else None
        if row is not None and row.job_status == RowStatus.PENDING and job.state == JobState.RUNNING:
            return [RowUpdate(row_id=row.id, status=RowStatus.STARTED, started_at=job.started_at or self.now)]
        return []

    # ------------------------------------------------------------------ nothing is running

    def settled(self) -> CellPlan:
        row = newest(self.rows)
        case = row_case(row, stale_started=self.policy.stale_started,
                        stale_pending=self.policy.stale_pending, now=self.now)
        dedup = DEDUP_TABLE[case]

        if case == RowCase.NONE:
            if self.subs and (repair := self._finish_interrupted(self.subs[-1], row=None)) is not None:
                return repair  # the intent was recorded, its row not yet: the same submission, not a new one
            orphan = self._orphan_dir()
            if orphan is not None:
                return self._from_dir(orphan, row=None, why="orphan run dir (no row points at it)")
            return self._result(Phase.PENDING, [self._submit(self._next_attempt(), dedup.reason)], dedup.reason,
                                dedup.rule)
        assert row is not None
        if case == RowCase.FINISHED:
            return self._finished(row, dedup.rule)
        if case == RowCase.UNRECOGNISED:
            hold = Hold(reason=f"row {row.id}: job_status {row.job_status!r}")
            return self._result(Phase.FAILED, [hold], dedup.reason, dedup.rule)
        if case == RowCase.METRICS_CLEARED:
            return self._result(Phase.PENDING, [self._submit(self._next_attempt(), dedup.reason)], dedup.reason,
                                dedup.rule)

        if self._ours(row):
            return self._own_row_without_live_job(row)
        # Someone else's Started/Pending row: their job is invisible to us, so the thresholds decide.
        if not dedup.start:
            since = row.started_at if case == RowCase.STARTED_FRESH else row.submitted_at
            phase = Phase.RUNNING if case == RowCase.STARTED_FRESH else Phase.SUBMITTED
            reason = f"{dedup.reason} (row of {row.username or 'unknown user'} since {_when(since)})"
            return self._result(phase, [Skip(reason=reason)], reason, dedup.rule)
        return self._result(Phase.PENDING, [self._submit(self._next_attempt(), f"{dedup.reason} (row of "
                                                         f"{row.username or 'unknown user'})")], dedup.reason,
                            dedup.rule)

    def _finished(self, row: ObservedRow, rule: Rule) -> CellPlan:
        score = _metric(row, "accuracy")
        valid = _metric(row, "n_valid_trials")
        n_scored = int(valid) if valid is not None else None
        facts = self.dirs.get(row.job_name or "")
        expected = expected_trials(self.cell, facts)[0] if facts is not None else None
        if facts is not None and expected and distinct_trials(facts, self.cell.n_attempts) < expected:
            cls = self._classify(facts, job=None)
            if cls in (DirClass.AT_RESUME_LIMIT, DirClass.REJECTED):
                reason = f"uploaded as is: {RESUME_TABLE[cls].reason} ({_progress(facts)})"
                return self._result(Phase.FAILED, [Hold(reason=reason)], reason, RESUME_TABLE[cls].rule,
                                    facts=facts, score=score, n_scored=n_scored)
        if self._needs_tracking(row, facts):
            assert facts is not None
            admission = self._admit(facts, can_resume=False)
            if isinstance(admission, Admitted):
                reason = self._not_verified()
                upload = self._upload_action(facts, row.id, f"{reason}: log and read back", admission)
                return self._result(Phase.EVALUATED, [self._analyze(facts, admission), upload], reason,
                                    Rule.VERIFY_UPLOAD, facts=facts, admission=admission, score=score, n_scored=n_scored)
            reason = f"job finished; not logged to MLflow: its run dir is {admission.summary()}"
            return self._result(Phase.COMPLETED, [Skip(reason=reason)], reason, rule, facts=facts,
                                admission=admission, score=score, n_scored=n_scored)
        reason = f"job finished{self._flag_note(row, facts)}"
        return self._result(Phase.COMPLETED, [Skip(reason=reason)], reason, rule, facts=facts, score=score, n_scored=n_scored)

    def _flag_note(self, row: ObservedRow, facts: RunDirFacts | None) -> str:
        """What a finished row's is_overlong says, and whether our run's dir disagrees. Shown, never rewritten:
        a Finished row is history (perhaps the old listener's, under our name), not ours to re-upload."""
        if row.is_overlong:
            return "; its row is flagged is_overlong"
        overlong = self._overlong(facts) if facts is not None and self._ours(row) else None
        return "" if overlong is None else f"; {overlong}, but its row is not flagged is_overlong"

    def _needs_tracking(self, row: ObservedRow, facts: RunDirFacts | None) -> bool:
        """Our finished run whose MLflow run has not been read back yet. Other users' rows are theirs to log."""
        return (self.policy.track and self._ours(row) and facts is not None
                and not facts.unreadable and self.memory.tracked_run_tag != facts.run_tag)

    def _not_verified(self) -> str:
        return f"{UPLOAD_NOT_VERIFIED}: {self.memory.track_error or 'not logged to MLflow yet'}"

    def _own_row_without_live_job(self, row: ObservedRow) -> CellPlan:
        """Our Pending/Started row and nothing of ours in the queue: the job ended, died or never started."""
        tag = row.job_name or ""
        last = next((s for s in reversed(self.subs) if s.run_tag == tag), None)
        if last is not None and (repair := self._finish_interrupted(last, row=row)) is not None:
            return repair
        facts = self.dirs.get(tag) or RunDirFacts(run_tag=tag, path="")
        return self._from_dir(facts, row=row, why=f"our {row.job_status} row, no job queued or running")

    def _finish_interrupted(self, last: Submission, row: ObservedRow | None) -> CellPlan | None:
        """An intent with no job id and no job of its name: the process stopped before sbatch. Finish that same
        submission (steps 2–3), writing its row if the crash came before it."""
        if last.job_id is not None or any(last.may_have_launched(j) for j in self._jobs_named(last.name)):
            return None
        reason = f"intent {last.name} recorded but no job has that name: finish the submission"
        row_id = row.id if row is not None else last.row_id
        action: Launch = (Submit(run_tag=last.run_tag, attempt=last.attempt, row_id=row_id, intent_at=last.created_at,
                                 reason=reason) if last.fire == 1 else
                          Resume(run_tag=last.run_tag, attempt=last.attempt, fire=last.fire, row_id=row_id,
                                 intent_at=last.created_at, reason=reason))
        return self._result(Phase.PENDING, [action], "submission interrupted before sbatch", Rule.SUBMISSION_REPAIR)

    def _from_dir(self, facts: RunDirFacts, row: ObservedRow | None, why: str) -> CellPlan:
        job = self._last_job(facts.run_tag)
        cls = self._classify(facts, job)
        verdict = RESUME_TABLE[cls]
        fires = self._fires(facts)
        row_id = row.id if row is not None else None
        remedy = self._remedy_for(facts, job, cls)
        if remedy is not None:
            return self._remediate(facts, job, remedy)
        if job is not None and job.state in (JobState.FAILED, JobState.OUT_OF_MEMORY) and cls == DirClass.EARLY_KILL:
            what = "ran out of memory" if job.state == JobState.OUT_OF_MEMORY else "failed before any trial ran"
            reason = f"job {job.job_id} {what}" + (f": {job.reason}" if job.reason else "")
            return self._result(Phase.FAILED, [Hold(reason=reason)], reason, Rule.JOB_FAILED_AT_START, facts=facts)
        if verdict.next == Next.WAIT:
            reason = f"{verdict.reason} ({_progress(facts)})"
            return self._result(Phase.SETTLING, [Wait(reason=reason)], reason, verdict.rule, facts=facts)
        cancelled_at = job.ended_at if job is not None and self.memory.upload_as_is == facts.run_tag else None
        if cancelled_at is not None and self.now - cancelled_at < self.policy.settle:
            reason = f"cancelled at {cancelled_at:%H:%M:%S}; its sandboxes may write until " \
                     f"{cancelled_at + self.policy.settle:%H:%M:%S} ({_progress(facts)}): upload after that"
            return self._result(Phase.SETTLING, [Wait(reason=reason)], reason, Rule.SETTLE_AFTER_CANCEL, facts=facts)
        if verdict.next == Next.RESUME and self.memory.upload_as_is == facts.run_tag:
            return self._upload(facts, row_id, cls, Rule.MONITOR_CANCELLED)
        if verdict.next == Next.RESUME:
            reason = f"{why}; {cls}: {verdict.reason} ({_progress(facts)}) → resume, fire {fires + 1} of " \
                     f"{self.policy.max_total_fires}"
            action = Resume(reason=reason, run_tag=facts.run_tag, attempt=self._attempt_of(facts.run_tag),
                            fire=fires + 1, row_id=row_id)
            return self._result(Phase.PENDING, [action], reason, verdict.rule, facts=facts)
        return self._upload(facts, row_id, cls, verdict.rule)

    def _remedy_for(self, facts: RunDirFacts, job: ObservedJob | None, cls: DirClass) -> Remedy | None:
        """What an ended attempt calls for: what was decided when it was cancelled, else what its log or its
        trials say now (a catalogued start failure; a dead launch)."""
        known = next((r for r in self.learnt.remedies if r.run_tag == facts.run_tag), None)
        if known is not None:
            return known
        failed = job is not None and job.state in (JobState.FAILED, JobState.OUT_OF_MEMORY)
        found = diagnose(job.log_tail or job.reason, self.policy.health.failure_modes, FailureStage.START) \
            if job is not None and failed and cls == DirClass.EARLY_KILL else None
        if found is not None:
            assert job is not None
            return Remedy(run_tag=facts.run_tag, kind=found.mode.remedy, diagnosis=str(found), at=self.now,
                          node=blamed_node(job.nodes, job.log_tail), job_env=found.mode.job_env,
                          backoff_minutes=found.mode.backoff_minutes, cause=RemedyCause.KNOWN_FAILURE)
        if is_dead_launch(facts) and cls != DirClass.SETTLING:
            return Remedy(run_tag=facts.run_tag, kind=RemedyKind.REFIRE, diagnosis=_dead_launch(facts), at=self.now,
                          cause=RemedyCause.DEAD_LAUNCH)
        return None

    def _remediate(self, facts: RunDirFacts, job: ObservedJob | None, remedy: Remedy) -> CellPlan:
        """Carry out a remedy: hold for a human, or refire (a new attempt) after the back-off, at most maxRefires
        times per cell. Never an upload: nothing in a remedied attempt is a score."""
        health, remember = self.policy.health, self._with_remedy(remedy)
        failed_at = job.ended_at if job is not None and job.ended_at else remedy.at
        # its effect starts once, when the remedy is decided: a remembered one is never renewed
        actions = [] if remedy in self.learnt.remedies else self._quarantines(remedy, job, since=failed_at)
        rule = DIAGNOSED_BY[remedy.cause]
        if remedy.kind == RemedyKind.HOLD:
            return self._result(Phase.FAILED, [*actions, Hold(reason=remedy.diagnosis)], remedy.diagnosis, rule,
                                facts=facts, remember=remember)
        refired = sum(1 for r in remember.remedies if r.run_tag != remedy.run_tag and r.kind != RemedyKind.HOLD)
        if refired >= health.max_refires:
            reason = f"{remedy.diagnosis}; not refired again: {refired} refire(s) used (health.maxRefires)"
            return self._result(Phase.FAILED, [*actions, Hold(reason=reason)], reason, Rule.REFIRES_EXHAUSTED,
                                facts=facts, remember=remember)
        after = failed_at + health.refire_backoff
        if remedy.kind == RemedyKind.BACK_OFF:  # the refire waits out the cluster's pause (and passes it)
            after = max(after, failed_at + timedelta(minutes=remedy.backoff_minutes))
        if self.now < after:
            reason = f"refire after {after:%H:%M:%S} UTC (health.refireBackoffMinutes): {remedy.diagnosis}"
            return self._result(Phase.PENDING, [*actions, Wait(reason=reason)], reason, Rule.REFIRE, facts=facts,
                                remember=remember).model_copy(update={"refire_due": after})
        attempt = self._next_attempt()
        reason = f"refire {refired + 1} of {health.max_refires}: {remedy.diagnosis}"
        submit = Submit(run_tag=self.cell.run_tag(attempt), attempt=attempt, reason=reason, job_env=remedy.job_env)
        return self._result(Phase.PENDING, [*actions, submit], reason, Rule.REFIRE, facts=facts, remember=remember)

    def _upload(self, facts: RunDirFacts, row_id: str | None, cls: DirClass, rule: Rule) -> CellPlan:
        """Through the admission gate (RULES §14), then the overlong hold; only an admitted number is uploaded."""
        verdict = RESUME_TABLE[cls]
        can_resume = (cls not in (DirClass.REJECTED, DirClass.AT_RESUME_LIMIT) and not facts.no_resume
                      and self.memory.upload_as_is != facts.run_tag
                      and self._fires(facts) < self.policy.max_total_fires)
        admission = self._admit(facts, can_resume)
        if isinstance(admission, Refused):
            return self._refused(facts, row_id, admission)
        if self.policy.hold_overlong and not self.policy.force_upload and (overlong := self._overlong(facts)):
            reason = f"{verdict.reason}; upload gate: {overlong} (is_overlong; upload.overlong: hold): not " \
                     "uploading; set upload.forceUpload to upload it anyway"
            return self._result(Phase.FAILED, [Hold(reason=reason)], reason, Rule.UPLOAD_GATE, facts=facts,
                                admission=admission)
        if not self.policy.upload_db:
            return self._without_db_upload(facts, rule, admission)
        upload = self._upload_action(facts, row_id, f"{verdict.reason} ({_progress(facts)}): upload metrics",
                                     admission)
        reason = f"{verdict.reason}: analyze and upload; {admission.summary()}{_flagged(self._overlong(facts))}"
        return self._result(Phase.EVALUATED, [self._analyze(facts, admission), upload], reason, rule, facts=facts,
                            admission=admission)

    def _admit(self, facts: RunDirFacts, can_resume: bool) -> Admission:
        reading = self.learnt.output
        jobs = {job.job_id for job in self.jobs if self._dir_tag(job) == facts.run_tag}
        requests = reading.requests if reading is not None and reading.job_id in jobs else None
        return admit(self.cell, facts, self.policy.admission, requests=requests, can_resume=can_resume,
                     model_names=self.model_names, benchmark_names=self.benchmark_names)

    def _refused(self, facts: RunDirFacts, row_id: str | None, refused: Refused) -> CellPlan:
        """What a refusal calls for: a resume (fires left), a refire (a dead launch), or a human."""
        rule = ADMISSION_RULES[refused.refusal]
        if refused.remedy == "refire":
            remedy = Remedy(run_tag=facts.run_tag, kind=RemedyKind.REFIRE, diagnosis=f"{refused.summary()}",
                            at=self.now, cause=RemedyCause.DEAD_LAUNCH)
            return self._remediate(facts, self._last_job(facts.run_tag), remedy)
        if refused.remedy == "resume":
            fires = self._fires(facts)
            reason = f"{refused.summary()} → resume, fire {fires + 1} of {self.policy.max_total_fires}"
            action = Resume(reason=reason, run_tag=facts.run_tag, attempt=self._attempt_of(facts.run_tag),
                            fire=fires + 1, row_id=row_id)
            return self._result(Phase.PENDING, [action], reason, rule, facts=facts, admission=refused)
        reason = f"{refused.summary()}: not uploading"
        return self._result(Phase.FAILED, [Hold(reason=reason)], reason, rule, facts=facts, admission=refused)

    def _upload_action(self, facts: RunDirFacts, row_id: str | None, reason: str, admitted: Admitted) -> Upload:
        """Every upload of a run carries the same flag, so a re-upload (to verify MLflow) never clears it."""
        overlong = self._overlong(facts)
        return Upload(facts=facts, row_id=row_id, is_overlong=overlong is not None, admitted=admitted,
                      reason=reason + _flagged(overlong), gpu_hours=self._attempt_hours(facts.run_tag))

    def _without_db_upload(self, facts: RunDirFacts, rule: Rule, admitted: Admitted) -> CellPlan:
        """upload.db off: done once the report is written, or, with MLflow on, once its run reads back. That is
        where its result went, so a Completed cell shows the score of its finished run dir."""
        tag = facts.run_tag
        if self.policy.track and self.memory.tracked_run_tag == tag:
            reason = f"MLflow run {tag} read back as logged; upload.db is off"
            return self._result(Phase.COMPLETED, [Skip(reason=reason)], reason, rule, facts=facts,
                                admission=admitted, score=admitted.score, n_scored=admitted.n_scored)
        if self.policy.track:
            reason = self._not_verified()
            track = Track(facts=facts, reason=f"{reason}: log and read back (upload.db is off)", admitted=admitted,
                          gpu_hours=self._attempt_hours(facts.run_tag))
            return self._result(Phase.EVALUATED, [self._analyze(facts, admitted), track], reason, Rule.VERIFY_UPLOAD,
                                facts=facts, admission=admitted)
        if self.memory.analyzed_run_tag == tag:
            reason = f"post-eval report written for {tag}; upload.db and upload.mlflow are off"
            return self._result(Phase.COMPLETED, [Skip(reason=reason)], reason, rule, facts=facts,
                                admission=admitted, score=admitted.score, n_scored=admitted.n_scored)
        return self._result(Phase.EVALUATED, [self._analyze(facts, admitted)],
                            "trials done; upload.db is off: post-eval report only", rule, facts=facts,
                            admission=admitted)

    def _overlong(self, facts: RunDirFacts) -> str | None:
        """How a run took longer than upload.overlongHours, from its started_at (the first fire's: Harbor keeps it
        on a resume) to its end, else from its jobs' accounting (first start to last end); None if not."""
        jobs = [job for job in self.jobs if self._dir_tag(job) == facts.run_tag]
        limit = self.policy.overlong
        start = facts.started_at or min((j.started_at for j in jobs if j.started_at), default=None)
        end = facts.finished_at or facts.last_progress_at or max((j.ended_at for j in jobs if j.ended_at), default=None)
        if limit == "walltime":
            limit = timedelta(seconds=walltime_seconds(self.cell.time_limit)) if self.cell.time_limit \
                else self.policy.walltime
        if start is None or end is None or end - start <= limit:
            return None
        what = "one job's walltime" if self.policy.overlong == "walltime" else "overlongHours"
        source = "" if facts.started_at else " (by the scheduler's accounting: the run dir has no started_at)"
        return f"ran {(end - start).total_seconds() / 3600:.3g} h, longer than {what} " \
               f"{limit.total_seconds() / 3600:g}{source}"

    # ------------------------------------------------------------------ helpers

    def _classify(self, facts: RunDirFacts, job: ObservedJob | None) -> DirClass:
        return classify(
            facts,
            expected=expected_trials(self.cell, facts)[0],
            seen=distinct_trials(facts, self.cell.n_attempts),
            job_active=job is not None and job.state.active,
            job_ended_at=job.ended_at if job is not None else None,
            fires=self._fires(facts),
            max_total_fires=self.policy.max_total_fires,
            infra_error_threshold=self.policy.infra_error_threshold,
            settle=self.policy.settle,
            now=self.now,
        )

    def _fires(self, facts: RunDirFacts) -> int:
        """Jobs that ran on the dir: what its meta.env says, or what we launched, whichever is more."""
        launched = sum(1 for s in self.subs if s.run_tag == facts.run_tag)
        return max(facts.fires, launched)

    def _last_job(self, run_tag: str) -> ObservedJob | None:
        return self._newest([j for j in self.jobs if self._dir_tag(j) == run_tag])

    @staticmethod
    def _newest(jobs: list[ObservedJob]) -> ObservedJob | None:
        return max(jobs, key=lambda j: (_job_order(j.job_id), j.job_id), default=None)

    def _jobs_named(self, name: str) -> list[ObservedJob]:
        return [j for j in self.jobs if j.name == name]

    def _dir_tag(self, job: ObservedJob) -> str:
        tag = run_tag_of(job.name)
        if tag not in self.dirs and tag.startswith("ev_") and tag.removeprefix("ev_") in self.dirs:
            return tag.removeprefix("ev_")
        return tag

    def _orphan_dir(self) -> RunDirFacts | None:
        """The newest run dir of the cell that no row (of anyone) points at."""
        pointed = {r.job_name for r in self.all_rows if r.job_name}
        orphans = [d for tag, d in self.dirs.items() if tag not in pointed]
        return max(orphans, key=lambda d: (d.started_at or d.last_progress_at or datetime.min.replace(
            tzinfo=self.now.tzinfo), d.run_tag), default=None)

    def _ours(self, row: ObservedRow) -> bool:
        """A row this cell may resume, adopt or upload to: of our username AND of this cell (RULES §2) — one of its
        submissions wrote it, or it names one of its run tags. Every tenant on a ClusterEvalCluster has the same
        username, and the cell key (so the run tag) carries the namespace: a row of another cell, however alike, is
        someone else's evidence, never ours to act on. A row under a tag of no EvalRun (the old listener's) is
        adopted only by an EvalRun outside any namespace: in the operator two tenants could both adopt it."""
        if row.username != self.policy.username:
            return False
        stem = stem_of(row.job_name or "")
        return (row.id in self.own_row_ids or stem in self.cell.tag_stems
                or (stem is None and self.cell.evalrun.namespace is None))

    def _own_row(self, row_id: str | None) -> ObservedRow | None:
        return next((r for r in self.all_rows if r.id == row_id), None) if row_id else None

    def _submitted_at(self, job: ObservedJob) -> datetime | None:
        sub = next((s for s in self.subs if s.name == job.name), None)
        return sub.created_at if sub is not None else job.submitted_at

    def _next_attempt(self) -> int:
        seen = [s.attempt for s in self.subs]
        seen += [a for a in (self.cell.attempt_of(t) for t in self.dirs) if a is not None]
        seen += [a for a in (self.cell.attempt_of(r.job_name or "") for r in self.all_rows) if a is not None]
        return max(seen, default=0) + 1

    def _attempt_of(self, run_tag: str) -> int:
        return self.cell.attempt_of(run_tag) or next((s.attempt for s in self.subs if s.run_tag == run_tag), 0)

    def _submit(self, attempt: int, reason: str) -> Submit:
        return Submit(reason=reason, run_tag=self.cell.run_tag(attempt), attempt=attempt)

    @staticmethod
    def _analyze(facts: RunDirFacts, admitted: Admitted) -> Analyze:
        return Analyze(facts=facts, admitted=admitted, reason=f"post-eval report for {facts.run_tag}")

    def _result(
        self,
        phase: Phase,
        actions: list[Action],
        reason: str,
        rule: Rule,
        updates: list[RowUpdate] | None = None,
        facts: RunDirFacts | None = None,
        score: float | None = None,
        remember: CellMemory | None = None,
        health: tuple[HealthState, str] | None = None,
        admission: Admission | None = None,
        n_scored: int | None = None,
    ) -> CellPlan:
        """`remember`: the memory after this pass, written only if it differs from what was observed. `score`: only
        what an uploaded row holds, never one computed from a run dir (a running cell has no score)."""
        state, note = health if health is not None else (None, "")
        return CellPlan(cell=self.cell, phase=phase, actions=tuple(actions), reason=reason, rule=rule,
                        row_updates=(*self.adoptions, *(updates or ())), run_dir=facts, score=score,
                        progress=progress_of(facts, self.now, running=phase == Phase.RUNNING),
                        memory=self.memory, remember=remember if remember != self.memory else None,
                        health=state, health_note=note, gpu_hours=self.gpu_hours, admission=admission,
                        **self._trust(admission, facts, score, n_scored))

    def _trust(self, admission: Admission | None, facts: RunDirFacts | None, score: float | None,
               n_scored: int | None) -> dict[str, Any]:
        """How far the cell's score can be trusted (RULES §14): the gate's verdict of this pass, else what it said
        of the upload that holds the score (the controller state), else the row's own n_valid_trials."""
        trust = self.policy.admission.trust_threshold
        if isinstance(admission, Admitted):
            return {"n_scored": admission.n_scored, "provisional": admission.provisional,
                    "partial": admission.partial, "evidence": admission.summary()}
        if isinstance(admission, Refused):
            return {"n_scored": n_scored, "provisional": None if n_scored is None else n_scored < trust,
                    "evidence": admission.summary()}
        record = self.memory.admitted
        if score is not None and record is not None and facts is not None and record.run_tag == facts.run_tag:
            return {"n_scored": record.n_scored, "provisional": record.provisional, "partial": record.partial,
                    "evidence": record.evidence}
        return {"n_scored": n_scored, "provisional": None if n_scored is None else n_scored < trust}


@dataclass(frozen=True)
class _Running:
    """What the rules of a running job read: its run dir, its output so far, how long since its last score."""

    job: ObservedJob
    facts: RunDirFacts | None
    readable: RunDirFacts | None  # facts, when they can be read
    reading: OutputReading | None
    actions: list[Action]  # what every decision carries: duplicate cancels, a back-off match's effect
    updates: list[RowUpdate]
    expected: int | None  # trials expected (None: not known yet)
    quiet: timedelta  # since the last score (or the job's start)
    catalogued: FailureMode | None  # the running catalog entry its output matched
    advice: FailureMode | None  # that entry, when it neither cancels nor refires


# RULES §8 and §5 for a running job, in precedence order: the first that decides wins. Rules that free GPUs
# (cancel) come before the ones that only report; a catalog match that backs off or holds only advises, last, and
# its effect rides along with whatever decides (`_with_advice`), so no match makes a job immune to cancellation.
RUNNING_RULES: tuple[Callable[[_CellRules, _Running], CellPlan | None], ...] = (
    _CellRules._dead_launch,           # every completed trial measured nothing  → cancel, refire
    _CellRules._zombie,                # every trial has a result, job still runs → cancel, upload
    _CellRules._stuck_near_complete,   # ≥ 97 % scored, then quiet                → cancel, upload
    _CellRules._pinggy_unwired,        # trials call an address that is not the pair → cancel, hold
    _CellRules._pinggy_locked,         # the pair's token is held elsewhere      → cancel, refire on another pair
    _CellRules._catalog_cancel,        # a refire / refire-elsewhere catalog match → cancel, refire
    _CellRules._launch_stalled,        # no trial started within the grace        → cancel, refire
    _CellRules._stuck_general,         # no new score: report, cancel at the second reading
    _CellRules._no_traffic,            # vLLM ready, no request                   → report
    _CellRules._bad_requests,          # too many 400s                            → report
    _CellRules._catalog_advice,        # a back-off / hold catalog match          → report with its advice
)


def _with_advice(decided: CellPlan, advice: FailureMode | None) -> CellPlan:
    """A rule other than the match itself decided: its reason also says what the catalog matched."""
    if advice is None or decided.rule == Rule.KNOWN_FAILURE:
        return decided
    return decided.model_copy(update={"reason": f"{decided.reason}; output also matched {advice.name}: "
                                                f"{advice.advice}"})


# ---------------------------------------------------------------------- caps


def _without_launch(cell_plan: CellPlan, instead: Action) -> CellPlan:
    """Keep the cell's phase; replace its launch (and the cancel that only made room for it) by `instead`."""
    kept = [a for a in cell_plan.actions if not isinstance(a, Submit | Resume)
            and not (isinstance(a, Cancel) and a.clears_way_for_launch)]
    return cell_plan.model_copy(update={"actions": (*kept, instead)})


def _pair_for(launch: Launch, policy: Policy, holders: dict[str, str], locked: set[str]) -> str | None:
    """The pair this submission already holds (a repaired submission), else the first free one that is not locked."""
    own = next((pair for pair, held_by in holders.items()
                if held_by == launch.submission_name and pair in policy.tunnel_pairs), None)
    return own or next((pair for pair in policy.tunnel_pairs if pair not in holders and pair not in locked), None)


def _no_pair(policy: Policy, holders: dict[str, str], locked: set[str]) -> Action:
    if not policy.tunnel_pairs:
        return Hold(reason="installed-agent harness needs a pinggy pair; add spec.pinggy.pairs to the EvalRun")
    busy = sum(1 for pair in policy.tunnel_pairs if pair in holders)
    held = sum(1 for pair in policy.tunnel_pairs if pair in locked and pair not in holders)
    return Wait(reason=f"waiting for a free pinggy pair ({busy} of {len(policy.tunnel_pairs)} in use by running jobs"
                       + (f", {held} locked on the pinggy server" if held else "") + ")")


def _placed(cell_plan: CellPlan, launch: Launch, pair: str | None, bad_nodes: tuple[str, ...]) -> CellPlan:
    """The launch with the pinggy pair it was given and the cluster's bad nodes excluded."""
    placed = launch.model_copy(update={"tunnel": pair or launch.tunnel, "exclude_nodes": bad_nodes})
    actions = tuple(placed if a is launch else a for a in cell_plan.actions)
    return cell_plan.model_copy(update={"actions": actions})


def _suspended(cell_plan: CellPlan) -> CellPlan:
    held = tuple(Hold(reason=f"suspended; would {a.render()}") if isinstance(a, Mutation) else a
                 for a in cell_plan.actions)
    return cell_plan.model_copy(update={"actions": held, "row_updates": ()})


# ---------------------------------------------------------------------- formatting


def _progress(facts: RunDirFacts | None) -> str:
    if facts is None:
        return "no run dir yet"
    if facts.unreadable:
        return f"run dir cannot be read: {facts.unreadable}"
    total = facts.n_total if facts.n_total is not None else "?"
    return f"{facts.n_scored} scored, {facts.n_completed}/{total} completed, {facts.n_infra_errors} infra errors"


def _metric(row: ObservedRow, name: str) -> float | None:
    return next((m.value for m in row.metrics or () if m.name == name), None)


def _failed_job(jobs: Sequence[ObservedJob] | None) -> ObservedJob | None:
    """The newest job, if it ended FAILED or OUT_OF_MEMORY and nothing of the cell is queued or running."""
    newest = max(jobs or (), key=lambda j: (_job_order(j.job_id), j.job_id), default=None)
    if newest is None or any(j.state.active for j in jobs or ()):
        return None
    return newest if newest.state in (JobState.FAILED, JobState.OUT_OF_MEMORY) else None


def _failure(job: ObservedJob, policy: Policy) -> str:
    what = "ran out of memory" if job.state == JobState.OUT_OF_MEMORY else "failed"
    found = diagnose(job.log_tail or job.reason, policy.health.failure_modes, FailureStage.START)
    return what + (f": {found}" if found else f": {job.reason}" if job.reason else "")


def _dead_launch(facts: RunDirFacts) -> str:
    return (f"dead launch: {no_output_summary(facts)}, 0 real trials — served model unreachable? "
            "(check the vLLM server and the api_base the trials call)")


ADMISSION_RULES: dict[Refusal, Rule] = {
    Refusal.IDENTITY: Rule.ADMISSION_IDENTITY, Refusal.INVALID_REWARD: Rule.ADMISSION_INVALID_REWARD,
    Refusal.NO_TRAFFIC: Rule.ADMISSION_NO_TRAFFIC, Refusal.NO_TOTAL: Rule.ADMISSION_NO_TOTAL,
    Refusal.INCOMPLETE: Rule.ADMISSION_INCOMPLETE, Refusal.INFRA_SHARE: Rule.ADMISSION_INFRA_SHARE,
    Refusal.NOTHING_SCORED: Rule.ADMISSION_NOTHING_SCORED,
}


DIAGNOSED_BY: dict[RemedyCause, Rule] = {
    RemedyCause.DEAD_LAUNCH: Rule.DEAD_LAUNCH, RemedyCause.LAUNCH_STALLED: Rule.LAUNCH_STALLED,
    RemedyCause.PINGGY_NOT_WIRED: Rule.PINGGY_NOT_WIRED, RemedyCause.PINGGY_LOCKED: Rule.PINGGY_LOCKED,
    RemedyCause.KNOWN_FAILURE: Rule.KNOWN_FAILURE,
}


def _last_job_note(jobs: Sequence[ObservedJob] | None) -> str:
    """What the scheduler said of the newest job, when it was read: often the cause (a failed start)."""
    job = max(jobs or (), key=lambda j: (_job_order(j.job_id), j.job_id), default=None)
    if job is None:
        return ""
    return f"; last job {job.job_id} {job.state.value}" + (f": {job.reason}" if job.reason else "")


def _minutes(delta: timedelta) -> str:
    return f"{delta.total_seconds() / 60:.0f} min"


def _flagged(overlong: str | None) -> str:
    """What a reason adds for an overlong run that is uploaded: the flag is never silent."""
    return "" if overlong is None else f"; flagged is_overlong: {overlong}"


def _when(moment: datetime | None) -> str:
    return f"{moment:%Y-%m-%d %H:%M}" if moment is not None else "an unknown time"


def _job_order(job_id: str) -> int:
    return int(job_id) if job_id.isdigit() else -1
