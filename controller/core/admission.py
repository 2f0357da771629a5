"""The admission gate (RULES §14): a run dir's number reaches the results DB only with the evidence that the model
earned it. Pure; the planner asks it before every upload and `plan`, `explain`, `status`, the report and
`db audit` show what it said. No other code computes a score.

Every completed trial is in exactly one class (the adapter counts them, `count_instant_failures` moves the ones
that measured nothing): graded, the model's failure, infra (every other exception, known or unknown; ungraded;
no model output) or invalid. Each task weighs at most nAttempts (task, attempt) pairs, whatever a resume or a
killed fire's sandboxes left beside them: score = Σ_task mean(its scored rewards) · w / Σ_task w, with
w = min(its scored trials, nAttempts) (with no duplicates, the scored trials' rewards / (graded + the model's
failures)). The checks, in order, each a named refusal with its remedy:

- identity: what each of config.json, meta.env and the trial results records (model, dataset, benchmark, agent,
  timeout multiplier, nAttempts; `identity`) is the cell's, and the run has no more tasks than the catalog's
  → else hold (an incident), naming what differs and which file says it;
- rewards: every reward a number in [0, 1] under Harbor's `reward` key, 0 or 1 where the preset gives no partial
  credit → else hold, naming the trial;
- traffic: some trial shows the model answering (output tokens, or vLLM requests where no usage is reported)
  → else refire (a dead launch, whatever the trials raised);
- completeness: the distinct (task, attempt) pairs reach the expected trials (the catalog's tasks × nAttempts,
  else Harbor's total and at least nAttempts for every task seen; duplicates count once) → else resume, then
  hold (or a partial upload);
- infra share: at most `upload.maxInfraErrorFraction` of the distinct (task, attempt) pairs with a result have
  only infra results → else resume, then hold (or a partial upload);
- something scored → else hold.
An admitted number with fewer than `report.trustThreshold` scored trials is provisional; its standard error is
clustered by task (the attempts of one task are not independent).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from enum import StrEnum
from typing import Literal

from pydantic import Field

from controller.core.identity import identity_differences
from controller.core.observed import RunDirFacts
from controller.core.remedies import AdmissionRecord
from controller.core.types import Cell, Frozen

GATE_VERSION = 4  # bump when a rule changes what is admitted: a row's evidence says which gate passed it


class Refusal(StrEnum):
    IDENTITY = "IdentityMismatch"
    INVALID_REWARD = "InvalidReward"
    NO_TRAFFIC = "NoModelTraffic"
    NO_TOTAL = "NoExpectedTotal"
    INCOMPLETE = "Incomplete"
    INFRA_SHARE = "InfraShare"
    NOTHING_SCORED = "NothingScored"


Remedy = Literal["resume", "refire", "hold"]


class GatePolicy(Frozen):
    """The EvalRun's upload and report settings the gate reads (the spec's defaults are the only ones)."""

    max_infra_fraction: float = Field(description="upload.maxInfraErrorFraction")
    partial_upload: bool = Field(description="upload.partial upload: what resumes cannot complete is uploaded with "
                                             "partial true instead of held")
    min_completed_fraction: float = Field(description="upload.minCompletedFraction: the least a partial upload covers")
    trust_threshold: int = Field(description="report.trustThreshold: fewer scored trials → provisional")


class Evidence(Frozen):
    """What the gate saw: stored with every upload (row stats, controller state, MLflow) for a reviewer."""

    gate: int = GATE_VERSION
    trials: int = Field(description="completed trials read (a cancelled one is not completed)")
    graded: int
    model_failures: int
    infra: int
    invalid: int
    scored: int = Field(description="(task, attempt) pairs scored, at most nAttempts a task: the score's weight "
                                    "(graded + the model's failures where no task has more)")
    expected: int | None = Field(description="trials the run must have: tasks × nAttempts")
    expected_from: Literal["catalog", "harbor"] | None
    seen: int = Field(description="distinct (task, attempt) pairs with a result")
    duplicates: int = Field(description="trials beyond nAttempts of their task (a resume re-ran them): counted once, "
                                        "and weighed in the score as their task's mean")
    tasks: int
    unmeasured: int = Field(description="distinct (task, attempt) pairs with a result but none scored: only infra "
                                        "(or invalid) results")
    infra_share: float = Field(description="unmeasured / seen")
    identity: str = Field(description="'ok', or how the run dir differs from the cell")
    traffic: str = Field(description="what shows the model answering")

    def summary(self) -> str:
        expected = "?" if self.expected is None else str(self.expected)
        return (f"{self.seen}/{expected} trials, {self.graded} graded, {self.model_failures} model failures, "
                f"{self.infra} infra" + (f", {self.unmeasured} unmeasured" if self.unmeasured != self.infra else "")
                + f" ({self.infra_share:.1%})" + (f", {self.invalid} invalid" if self.invalid else "")
                + (f", {self.duplicates} duplicates" if self.duplicates else "")
                + f", identity {self.identity}, {self.traffic}")


class Admitted(Frozen):
    score: float
    stderr: float | None = Field(description="clustered by task; None with fewer than 2 tasks scored")
    n_scored: int
    provisional: bool = Field(description="n_scored < report.trustThreshold: too few to decide on")
    partial: bool = Field(False, description="uploaded under upload.partial: upload although incomplete or over the "
                                             "infra share")
    partial_why: str = ""
    evidence: Evidence

    def summary(self) -> str:
        flags = "".join((f"; provisional (n={self.n_scored} < trust threshold)" if self.provisional else "",
                         f"; partial: {self.partial_why}" if self.partial else ""))
        return f"admitted: {self.evidence.summary()}{flags}"


class Refused(Frozen):
    refusal: Refusal
    reason: str = Field(description="what is wrong, naming the evidence")
    remedy: Remedy
    evidence: Evidence
    partial_would_publish: bool = Field(False, description="held only because partial uploads are off: "
                                                           "upload.partial: upload or upload.forceUpload would "
                                                           "publish it flagged partial")

    def summary(self) -> str:
        return f"refused ({self.refusal.value}): {self.reason}"


Admission = Admitted | Refused


def admit(cell: Cell, facts: RunDirFacts, policy: GatePolicy, *, requests: int | None = None,
          can_resume: bool = False, model_names: Iterable[str] = (), benchmark_names: Iterable[str] = (),
          judge_traffic: bool = True) -> Admission:
    """The gate, for a run dir read whole (`count_instant_failures` applied where the agent calls a model).

    `requests`: vLLM requests its job's output showed (None: not read); `can_resume`: a resume may still complete it
    (fires left, not marked to upload as it is); `model_names`/`benchmark_names`: the DB's names for the cell's model
    and benchmark (their families), besides its own; `judge_traffic` False: `db audit` of a run whose traffic only
    its job's output could show, long gone — every other check is made, and the evidence says the requests were
    not read."""
    evidence = _evidence(cell, facts, requests, model_names, benchmark_names)

    def refused(refusal: Refusal, reason: str, remedy: Remedy, *, partial_would_publish: bool = False) -> Refused:
        return Refused(refusal=refusal, reason=reason, remedy=remedy, evidence=evidence,
                       partial_would_publish=partial_would_publish)

    if evidence.identity != "ok":
        return refused(Refusal.IDENTITY, f"run dir {facts.run_tag} is not this cell's run: {evidence.identity}", "hold")
    if facts.n_invalid:
        return refused(Refusal.INVALID_REWARD, f"{facts.n_invalid} trial(s) with an invalid reward, e.g. "
                                               f"{facts.path}/{facts.invalid}", "hold")
    if cell.partial_credit is False and facts.n_fractional:
        return refused(Refusal.INVALID_REWARD, f"{facts.n_fractional} reward(s) between 0 and 1 on {cell.benchmark}, "
                                               f"which gives no partial credit, e.g. {facts.path}/{facts.fractional}",
                       "hold")
    if cell.calls_model and facts.n_completed and judge_traffic and not _answered(cell, facts, requests):
        return refused(Refusal.NO_TRAFFIC, f"no trial shows the model answering ({evidence.traffic}): a dead "
                                           "launch; check the vLLM server and the api_base the trials call", "refire")
    if evidence.expected is None:
        return refused(Refusal.NO_TOTAL, "neither the benchmark catalog nor Harbor says how many trials the run "
                                         "must have: complete it by hand, or name a preset with its task count", "hold")
    short = _short(evidence, policy)
    if short is not None:
        refusal, reason = short
        if can_resume:
            return refused(refusal, reason, "resume")
        covered = evidence.seen / evidence.expected if evidence.expected else 0.0
        publishable = evidence.scored > 0 and covered >= policy.min_completed_fraction
        if not policy.partial_upload or not publishable:
            return refused(refusal, f"{reason}; resumes cannot complete it{_unpublished(evidence, policy, covered)}",
                           "hold", partial_would_publish=publishable)
        return _admitted(cell, facts, evidence, policy, partial_why=reason)
    if evidence.scored == 0:
        return refused(Refusal.NOTHING_SCORED, "no trial was graded or failed as the model's own", "hold")
    return _admitted(cell, facts, evidence, policy)


def admission_record(run_tag: str, admitted: Admitted) -> AdmissionRecord:
    """What the controller state keeps of an upload that read back: status and explain show it."""
    return AdmissionRecord(run_tag=run_tag, score=admitted.score, n_scored=admitted.n_scored,
                           provisional=admitted.provisional, partial=admitted.partial,
                           evidence=admitted.summary())


def expected_trials(cell: Cell, facts: RunDirFacts) -> tuple[int | None, Literal["catalog", "harbor"] | None]:
    """tasks × nAttempts from the catalog, else Harbor's own total, but never fewer than nAttempts for every task
    seen (a run of fewer attempts than the cell's, whose files do not say so, is short whatever its total), else
    unknown."""
    if cell.tasks is not None:
        return cell.tasks * cell.n_attempts, "catalog"
    if facts.n_total is not None:
        return max(facts.n_total, len(facts.tasks) * cell.n_attempts), "harbor"
    return None, None


def distinct_trials(facts: RunDirFacts, n_attempts: int) -> int:
    """(task, attempt) pairs with a result: a task's trials beyond nAttempts are re-runs, counted once."""
    return sum(min(seen, n_attempts) for seen, _, _ in facts.tasks.values())


def trial_pairs(facts: RunDirFacts, n_attempts: int) -> tuple[int, int]:
    """(`distinct_trials`, the pairs the model was measured on): a task's scored trials beyond nAttempts are
    re-runs, counted once, so the second is the n the gate admits a score over. One pass: progress reads both for
    every cell shown with a run dir."""
    seen_pairs = measured = 0
    for seen, scored, _ in facts.tasks.values():
        seen_pairs += seen if seen < n_attempts else n_attempts
        measured += scored if scored < n_attempts else n_attempts
    return seen_pairs, measured


def unmeasured_trials(facts: RunDirFacts, n_attempts: int) -> int:
    """(task, attempt) pairs with a result but no scored one: a task's scored trials cover up to nAttempts of its
    pairs, and its other pairs had only infra (or invalid) results. Which attempt a re-run stood for is not
    recorded, so a task with one infra and one graded result of its single attempt was measured."""
    seen, measured = trial_pairs(facts, n_attempts)
    return seen - measured


def infra_share(facts: RunDirFacts, n_attempts: int) -> float:
    """The share of the distinct (task, attempt) pairs with a result that measured nothing of the model: the part of
    the benchmark the score does not cover, which duplicates of the measured tasks cannot dilute."""
    seen, measured = trial_pairs(facts, n_attempts)
    return (seen - measured) / seen if seen else 0.0


def task_weights(tasks: Iterable[tuple[int, int, float]], n_attempts: int) -> list[tuple[int, float]]:
    """(weight, weighted reward sum) of each task with a scored trial: weight min(scored, nAttempts), the sum at the
    task's mean reward. A task's trials beyond its nAttempts (a resume re-ran it, a killed fire's sandboxes landed
    late) weigh as their mean, never as more attempts; no duplicate has to be chosen over another."""
    weights = []
    for _, scored, total in tasks:
        if scored > 0:
            weight = min(scored, n_attempts)
            weights.append((weight, total * weight / scored))
    return weights


def clustered_stderr(clusters: Sequence[tuple[int, float]]) -> float | None:
    """Standard error of the mean reward with tasks as clusters (CR1): G/(G-1) · Σ_g (S_g − n_g·m)² / n², over the
    (n_g, S_g) of `task_weights`. With one trial per task it is the usual sample standard error."""
    n = sum(count for count, _ in clusters)
    if len(clusters) < 2:
        return None
    mean = sum(total for _, total in clusters) / n
    spread = sum((total - count * mean) ** 2 for count, total in clusters)
    return math.sqrt(len(clusters) / (len(clusters) - 1) * spread / (n * n))


def _admitted(cell: Cell, facts: RunDirFacts, evidence: Evidence, policy: GatePolicy,
              partial_why: str = "") -> Admitted:
    """The score and its standard error over the same task weights as `evidence.scored`."""
    weights = task_weights(facts.tasks.values(), cell.n_attempts)
    return Admitted(score=sum(total for _, total in weights) / evidence.scored, stderr=clustered_stderr(weights),
                    n_scored=evidence.scored, provisional=evidence.scored < policy.trust_threshold,
                    partial=bool(partial_why), partial_why=partial_why, evidence=evidence)


def _short(evidence: Evidence, policy: GatePolicy) -> tuple[Refusal, str] | None:
    """Why the run is not yet a whole result (incomplete, or too many infra trials), if it is not."""
    assert evidence.expected is not None
    if evidence.seen < evidence.expected:
        return Refusal.INCOMPLETE, (f"{evidence.seen} of {evidence.expected} expected trials ({evidence.expected_from})"
                                    f" have a result")
    if evidence.infra_share > policy.max_infra_fraction:
        return Refusal.INFRA_SHARE, (f"{evidence.unmeasured} of {evidence.seen} trials are infra "
                                     f"({evidence.infra_share:.0%}), above upload.maxInfraErrorFraction "
                                     f"{policy.max_infra_fraction:g}")
    return None


def _unpublished(evidence: Evidence, policy: GatePolicy, covered: float) -> str:
    """Why a run resumes cannot complete is held rather than uploaded flagged partial, and whether a flag would."""
    if evidence.scored == 0:
        return "; nothing scored to publish, even flagged partial"
    if covered < policy.min_completed_fraction:
        return (f"; {covered:.0%} of the expected trials covered, below the upload.minCompletedFraction "
                f"{policy.min_completed_fraction:g} even a partial upload needs")
    return "; set upload.partial: upload (or upload.forceUpload: true) to publish it flagged partial"


def _answered(cell: Cell, facts: RunDirFacts, requests: int | None) -> bool:
    """Some trial shows the model answering: output tokens where usage is reported; vLLM requests where it is not
    (a harness that never reports tokens is judged by requests alone). A union of shards: each shard's gate judged
    its own job's (RULES §17)."""
    if facts.shards:
        return True
    if not traffic_needs_requests(cell, facts):
        return facts.n_answered > 0
    return bool(requests)


def traffic_needs_requests(cell: Cell, facts: RunDirFacts) -> bool:
    """Only the vLLM requests in the job's output can show this run's model answering: no trial reported token
    usage, or the harness reports none. Where that output is gone (`db audit`), traffic cannot be judged."""
    return not (cell.reports_tokens and facts.n_usage_reported)


def _evidence(cell: Cell, facts: RunDirFacts, requests: int | None, model_names: Iterable[str],
              benchmark_names: Iterable[str]) -> Evidence:
    expected, source = expected_trials(cell, facts)
    return Evidence(
        trials=facts.n_completed, graded=facts.n_graded, model_failures=facts.n_benign_errors,
        infra=facts.n_infra_errors, invalid=facts.n_invalid,
        scored=sum(weight for weight, _ in task_weights(facts.tasks.values(), cell.n_attempts)),
        expected=expected, expected_from=source, seen=distinct_trials(facts, cell.n_attempts),
        duplicates=sum(max(seen - cell.n_attempts, 0) for seen, _, _ in facts.tasks.values()),
        tasks=len(facts.tasks), unmeasured=unmeasured_trials(facts, cell.n_attempts),
        infra_share=infra_share(facts, cell.n_attempts),
        identity=_identity(cell, facts, model_names, benchmark_names), traffic=_traffic(cell, facts, requests))


def _identity(cell: Cell, facts: RunDirFacts, model_names: Iterable[str], benchmark_names: Iterable[str]) -> str:
    """'ok', or what the run dir's files say it evaluated that is not the cell (what they do not say is not held)."""
    return "; ".join(identity_differences(cell, facts, model_names, benchmark_names)) or "ok"


def _traffic(cell: Cell, facts: RunDirFacts, requests: int | None) -> str:
    if not cell.calls_model:
        return f"agent {cell.agent} calls no model"
    if facts.shards:
        return f"judged per shard, by each shard's gate ({len(facts.shards)} shards)"
    parts = []
    if facts.n_usage_reported:
        parts.append(f"{facts.n_answered} of {facts.n_usage_reported} trials reporting usage got model output")
    else:
        parts.append("no trial reported token usage")
    parts.append("vLLM requests not read" if requests is None else f"{requests} vLLM requests")
    return ", ".join(parts)
