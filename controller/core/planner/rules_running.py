"""RULES §8 and §5 for a running job: `RUNNING_RULES`, one precedence table of small checks, each a plan when it
decides, else None. Rules that free GPUs (cancel) come before the ones that only report; a catalog match that backs
off or holds only advises, last, and its effect rides along with whatever decides (`with_advice`), so no match
makes a job immune to cancellation.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta

from controller.core.actions import Action, Cancel, Quarantine, Wait
from controller.core.admission import distinct_trials, trial_pairs
from controller.core.health import bad_request_share, blamed_node, is_dead_launch, unwired_api_base
from controller.core.observed import ObservedJob, RunDirFacts
from controller.core.planner.policy import PAIR_LOCK
from controller.core.planner.rules_remedy import quarantines, with_remedy
from controller.core.planner.view import CellView
from controller.core.planner.words import DIAGNOSED_BY, dead_launch, minutes, progress
from controller.core.remedies import (
    CellMemory,
    FailureMode,
    OutputReading,
    QuarantineKind,
    Remedy,
    RemedyCause,
    RemedyKind,
    StallReading,
)
from controller.core.vocabulary import CellPlan, HealthState, Phase, RowUpdate, Rule


@dataclass(slots=True)
class Running:
    """What the rules of a running job read: its run dir, its output so far, how long since its last score."""

    view: CellView
    job: ObservedJob
    facts: RunDirFacts | None
    readable: RunDirFacts | None  # facts, when they can be read
    reading: OutputReading | None
    learnt: CellMemory  # the memory with what this pass read (the job's output); written if it changed
    actions: Sequence[Action]  # what every decision carries: duplicate cancels, a back-off match's effect
    updates: Sequence[RowUpdate]
    expected: int | None  # trials expected (None: not known yet)
    quiet: timedelta  # since the last score (or the job's start)
    catalogued: FailureMode | None  # the running catalog entry its output matched
    advice: FailureMode | None  # that entry, when it neither cancels nor refires


def dead_launch_check(run: Running) -> CellPlan | None:
    facts = run.readable
    if facts is None or facts.n_completed < run.view.policy.health.dead_launch_trials or not is_dead_launch(facts):
        return None
    return cancel_to_remedy(run, facts, RemedyCause.DEAD_LAUNCH, RemedyKind.REFIRE, dead_launch(facts))


def zombie(run: Running) -> CellPlan | None:
    facts, view = run.readable, run.view
    if facts is None or not run.expected or run.quiet < view.policy.zombie_grace \
            or distinct_trials(facts, view.cell.n_attempts) < run.expected:
        return None
    return cancel_to_upload(run, facts, "zombie job", Rule.ZOMBIE,
                            f"every trial has a result ({progress(facts)}) but the job still runs")


def stuck_near_complete(run: Running) -> CellPlan | None:
    facts, policy = run.readable, run.view.policy
    if facts is None or not run.expected or run.quiet < policy.stale_near:
        return None
    if trial_pairs(facts, run.view.cell.n_attempts)[1] < math.ceil(policy.near_complete_fraction * run.expected):
        return None  # re-runs of a task count once: they measure no more of the benchmark
    return cancel_to_upload(run, facts, "stuck near complete", Rule.STUCK_NEAR_COMPLETE,
                            f"{progress(facts)}, no new score for {minutes(run.quiet)}")


def pinggy_unwired(run: Running) -> CellPlan | None:
    view = run.view
    if run.readable is None or not view.cell.needs_pinggy:
        return None
    pair = view.leased.get(run.job.name)
    unwired = unwired_api_base(run.readable.api_base, view.policy.tunnel_urls.get(pair or ""))
    if not unwired:
        return None
    return cancel_to_remedy(run, run.readable, RemedyCause.PINGGY_NOT_WIRED, RemedyKind.HOLD,
                            f"pinggy not wired: {unwired}; the job must send the agent to its pair's "
                            "public URL (EVAL_PINGGY_URL)")


def pinggy_locked(run: Running) -> CellPlan | None:
    if run.reading is None or run.reading.pinggy != "locked":
        return None
    view = run.view
    pair = view.leased.get(run.job.name)
    locked = "pinggy pair locked: a tunnel with the same token is already active on the server"
    evalrun = str(view.cell.evalrun)
    lock = [Quarantine(subject=QuarantineKind.PAIR, scope=evalrun, name=pair, reason=locked,
                       ttl_s=PAIR_LOCK.total_seconds(), owner=evalrun)] if pair else []
    return cancel_to_remedy(run, run.facts, RemedyCause.PINGGY_LOCKED, RemedyKind.REFIRE,
                            f"{locked} (pair {pair}); refire on another pair", lock=lock)


def catalog_cancel(run: Running) -> CellPlan | None:
    mode = run.catalogued
    if mode is None or mode.remedy not in (RemedyKind.REFIRE, RemedyKind.REFIRE_ELSEWHERE):
        return None
    return cancel_to_remedy(run, run.facts, RemedyCause.KNOWN_FAILURE, mode.remedy, f"{mode.name}: {mode.advice}",
                            mode.job_env)


def launch_stalled(run: Running) -> CellPlan | None:
    started, facts, view = run.job.started_at, run.readable, run.view
    launching = facts is None or (facts.n_started_trials == 0 and facts.n_completed == 0)
    if not launching or started is None or (run.facts is not None and run.facts.unreadable) \
            or view.now - started < view.policy.health.launch_grace:
        return None
    return cancel_to_remedy(run, run.facts, RemedyCause.LAUNCH_STALLED, RemedyKind.REFIRE,
                            f"stalled launch: no trial started in {minutes(view.now - started)} "
                            f"(health.launchGraceMinutes {minutes(view.policy.health.launch_grace)})")


def stuck_general(run: Running) -> CellPlan | None:
    """Long retry tails are normal: the first reading only reports; a second one, a whole `stale_general`
    later with still no new score, cancels and uploads what is there (RULES §5: the second consecutive reading)."""
    facts, view = run.readable, run.view
    stale = view.policy.stale_general
    if facts is None or not run.expected or run.quiet < stale:
        return None
    seen = progress(facts)
    reading = view.memory.stall_reading
    same = reading is not None and reading.run_tag == facts.run_tag and reading.scored == facts.n_scored
    first_at = reading.at if reading is not None and same else None
    if first_at is not None and view.now - first_at >= stale:
        return cancel_to_upload(run, facts, "stuck general, second reading", Rule.STUCK_GENERAL_AGAIN,
                                f"{seen}, no new score since {first_at:%Y-%m-%d %H:%M}")
    actions = [*run.actions, Wait(reason=f"no new score for {minutes(run.quiet)} ({seen})")]
    remember = run.learnt if first_at is not None else run.learnt.model_copy(update={
        "stall_reading": StallReading(run_tag=facts.run_tag, scored=facts.n_scored, at=view.now)})
    return view.result(Phase.STALLED, actions, f"stalled: no progress for {minutes(run.quiet)}"
                       + (f" (first reading {first_at:%H:%M}; cancelled if still stuck a "
                          f"{minutes(stale)} after it)" if first_at else " (first reading)"),
                       Rule.STUCK_GENERAL, run.updates, facts, remember=remember)


def no_traffic(run: Running) -> CellPlan | None:
    reading, facts, view = run.reading, run.readable, run.view
    if reading is None or reading.ready_at is None:
        return None
    if facts is not None and facts.n_total is not None and facts.n_completed >= facts.n_total:
        return None  # no trial pending
    quiet = view.now - (reading.last_request_at or reading.ready_at)
    if quiet < view.policy.health.no_traffic:
        return None
    return stalled(run, Rule.NO_TRAFFIC, f"no traffic: no chat completion request for {minutes(quiet)} "
                                         "since vLLM was ready, with trials pending (agents not reaching the model?)")


def bad_requests(run: Running) -> CellPlan | None:
    reading = run.reading
    share = bad_request_share(reading) if reading is not None else None
    if reading is None or share is None:
        return None
    health = run.view.policy.health
    if share <= health.bad_request_fraction:
        return None
    return stalled(run, Rule.BAD_REQUESTS,
                   f"{share:.0%} of {reading.requests} requests answered 400 (health.badRequestFraction "
                   f"{health.bad_request_fraction:g}): context overflow? lower max_input_tokens / "
                   "max_output_tokens in the harbor config")


def catalog_advice(run: Running) -> CellPlan | None:
    """A back-off or hold match: the job goes on (the cluster launches less, or a human decides)."""
    if run.advice is None:
        return None
    return stalled(run, Rule.KNOWN_FAILURE, f"{run.advice.name}: {run.advice.advice}")


# RULES §8 and §5 for a running job, in precedence order: the first that decides wins.
RUNNING_RULES: tuple[Callable[[Running], CellPlan | None], ...] = (
    dead_launch_check,    # every completed trial measured nothing  → cancel, refire
    zombie,               # every trial has a result, job still runs → cancel, upload
    stuck_near_complete,  # ≥ 97 % scored, then quiet                → cancel, upload
    pinggy_unwired,       # trials call an address that is not the pair → cancel, hold
    pinggy_locked,        # the pair's token is held elsewhere      → cancel, refire on another pair
    catalog_cancel,       # a refire / refire-elsewhere catalog match → cancel, refire
    launch_stalled,       # no trial started within the grace        → cancel, refire
    stuck_general,        # no new score: report, cancel at the second reading
    no_traffic,           # vLLM ready, no request                   → report
    bad_requests,         # too many 400s                            → report
    catalog_advice,       # a back-off / hold catalog match          → report with its advice
)


def with_advice(decided: CellPlan, advice: FailureMode | None) -> CellPlan:
    """A rule other than the match itself decided: its reason also says what the catalog matched."""
    if advice is None or decided.rule == Rule.KNOWN_FAILURE:
        return decided
    return decided.model_copy(update={"reason": f"{decided.reason}; output also matched {advice.name}: "
                                                f"{advice.advice}"})


def cancel_to_remedy(run: Running, facts: RunDirFacts | None, cause: RemedyCause, kind: RemedyKind,
                     diagnosis: str, job_env: Mapping[str, str] | None = None, lock: Sequence[Action] = ()) -> CellPlan:
    """Cancel a job that cannot work, and remember what to do once it ended (refire, or a human)."""
    job, view = run.job, run.view
    remedy = Remedy(run_tag=facts.run_tag if facts is not None else view.dir_tag(job), kind=kind,
                    diagnosis=diagnosis, at=view.now, node=blamed_node(job.nodes, job.log_tail),
                    job_env=dict(job_env or {}), cause=cause)
    cancel = Cancel(job_id=job.job_id, reason=diagnosis)
    return view.result(Phase.STALLED, [*run.actions, *lock, cancel, *quarantines(view, remedy, since=view.now)],
                       diagnosis, DIAGNOSED_BY[cause], run.updates, facts, remember=with_remedy(run.learnt, remedy),
                       health=(HealthState.DEAD, diagnosis))


def stalled(run: Running, rule: Rule, diagnosis: str) -> CellPlan:
    """Running but not working: reported, not cancelled (a long tail or a slow model can look alike)."""
    return run.view.result(Phase.STALLED, [*run.actions, Wait(reason=diagnosis)], diagnosis, rule, run.updates,
                           run.facts, remember=run.learnt, health=(HealthState.STALLED, diagnosis))


def cancel_to_upload(run: Running, facts: RunDirFacts, what: str, rule: Rule, why: str) -> CellPlan:
    """Cancel, and remember that this run dir is to be uploaded as it is once it settles, never resumed."""
    actions = [*run.actions, Cancel(job_id=run.job.job_id, reason=f"{what}: {progress(facts)}")]
    remember = run.learnt.model_copy(update={"stall_reading": None, "upload_as_is": facts.run_tag})
    return run.view.result(Phase.STALLED, actions, f"{what}: {why}", rule, run.updates, facts, remember=remember)
