"""RULES §9: what a failed attempt calls for (its remedy), and what carrying it out takes out of use."""

from __future__ import annotations

from datetime import datetime, timedelta

from controller.core.actions import Action, Hold, Quarantine, Submit, Wait
from controller.core.health import blamed_node, diagnose, is_dead_launch
from controller.core.observed import JobState, ObservedJob, RunDirFacts
from controller.core.planner.view import CellView
from controller.core.planner.words import DIAGNOSED_BY, dead_launch
from controller.core.remedies import CellMemory, FailureStage, QuarantineKind, Remedy, RemedyCause, RemedyKind
from controller.core.resume import DirClass
from controller.core.vocabulary import CellPlan, Phase, Rule


def with_remedy(learnt: CellMemory, remedy: Remedy) -> CellMemory:
    kept = tuple(r for r in learnt.remedies if r.run_tag != remedy.run_tag)
    return learnt.model_copy(update={"remedies": (*kept, remedy)})


def quarantines(view: CellView, remedy: Remedy, since: datetime) -> list[Action]:
    """What a remedy takes out of use, from `since` (the failure it answers), unless already: the one node a
    refire-elsewhere failure points at, or the cluster's new launches for a back-off's minutes."""
    if remedy.kind not in (RemedyKind.REFIRE_ELSEWHERE, RemedyKind.BACK_OFF):
        return []  # a refire or a hold takes nothing out of use
    health, cluster, owner = view.policy.health, view.policy.cluster, str(view.cell.evalrun)
    active = {(q.kind, q.scope, q.name) for q in view.quarantined}
    if remedy.kind == RemedyKind.REFIRE_ELSEWHERE and remedy.node:
        if (QuarantineKind.NODE, cluster, remedy.node) not in active:
            return [Quarantine(subject=QuarantineKind.NODE, scope=cluster, name=remedy.node, owner=owner,
                               reason=remedy.diagnosis, ttl_s=health.bad_node.total_seconds())]
    left = remedy.backoff_minutes * 60.0 - (view.now - since).total_seconds()
    if remedy.kind == RemedyKind.BACK_OFF and left > 0 and (QuarantineKind.CLUSTER, cluster, cluster) not in active:
        return [Quarantine(subject=QuarantineKind.CLUSTER, scope=cluster, name=cluster, reason=remedy.diagnosis,
                           ttl_s=left, owner=owner)]
    return []


def remedy_for(view: CellView, facts: RunDirFacts, job: ObservedJob | None, cls: DirClass) -> Remedy | None:
    """What an ended attempt calls for: what was decided when it was cancelled, else what its log or its
    trials say now (a catalogued start failure; a dead launch)."""
    known = next((r for r in view.memory.remedies if r.run_tag == facts.run_tag), None)
    if known is not None:
        return known
    failed = job is not None and job.state in (JobState.FAILED, JobState.OUT_OF_MEMORY)
    found = diagnose(job.log_tail or job.reason, view.policy.health.failure_modes, FailureStage.START) \
        if job is not None and failed and cls == DirClass.EARLY_KILL else None
    if found is not None:
        assert job is not None
        return Remedy(run_tag=facts.run_tag, kind=found.mode.remedy, diagnosis=str(found), at=view.now,
                      node=blamed_node(job.nodes, job.log_tail), job_env=found.mode.job_env,
                      backoff_minutes=found.mode.backoff_minutes, cause=RemedyCause.KNOWN_FAILURE)
    if is_dead_launch(facts) and cls != DirClass.SETTLING:
        return Remedy(run_tag=facts.run_tag, kind=RemedyKind.REFIRE, diagnosis=dead_launch(facts), at=view.now,
                      cause=RemedyCause.DEAD_LAUNCH)
    return None


def remediate(view: CellView, facts: RunDirFacts, job: ObservedJob | None, remedy: Remedy) -> CellPlan:
    """Carry out a remedy: hold for a human, or refire (a new attempt) after the back-off, at most maxRefires
    times per cell. Never an upload: nothing in a remedied attempt is a score."""
    health, remember = view.policy.health, with_remedy(view.memory, remedy)
    failed_at = job.ended_at if job is not None and job.ended_at else remedy.at
    # its effect starts once, when the remedy is decided: a remembered one is never renewed
    actions = [] if remedy in view.memory.remedies else quarantines(view, remedy, since=failed_at)
    rule = DIAGNOSED_BY[remedy.cause]
    if remedy.kind == RemedyKind.HOLD:
        return view.result(Phase.FAILED, [*actions, Hold(reason=remedy.diagnosis)], remedy.diagnosis, rule,
                           facts=facts, remember=remember)
    refired = sum(1 for r in remember.remedies if r.run_tag != remedy.run_tag and r.kind != RemedyKind.HOLD
                  and (view.cell.attempt_of(r.run_tag) or 0) >= view.retried_from)  # a retry's bounds are fresh
    if refired >= health.max_refires:
        reason = f"{remedy.diagnosis}; not refired again: {refired} refire(s) used (health.maxRefires)"
        return view.result(Phase.FAILED, [*actions, Hold(reason=reason)], reason, Rule.REFIRES_EXHAUSTED,
                           facts=facts, remember=remember)
    after = failed_at + health.refire_backoff
    if remedy.kind == RemedyKind.BACK_OFF:  # the refire waits out the cluster's pause (and passes it)
        after = max(after, failed_at + timedelta(minutes=remedy.backoff_minutes))
    if view.now < after:
        reason = (f"refire{_with(remedy.job_env)} after {after:%H:%M:%S} UTC (health.refireBackoffMinutes): "
                  f"{remedy.diagnosis}")
        return view.result(Phase.PENDING, [*actions, Wait(reason=reason)], reason, Rule.REFIRE, facts=facts,
                           remember=remember).model_copy(update={"refire_due": after})
    attempt = view.next_attempt()
    reason = f"refire {refired + 1} of {health.max_refires}{_with(remedy.job_env)}: {remedy.diagnosis}"
    submit = Submit(run_tag=view.cell.run_tag(attempt), attempt=attempt, reason=reason, job_env=remedy.job_env)
    return view.result(Phase.PENDING, [*actions, submit], reason, Rule.REFIRE, facts=facts, remember=remember)


def _with(job_env: dict[str, str]) -> str:
    """What a refire's environment adds (the catalog entry's `job_env`), said where the refire is."""
    return f" with {', '.join(f'{name}={value}' for name, value in sorted(job_env.items()))}" if job_env else ""
