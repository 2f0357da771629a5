"""Launch health (RULES §8, §9): what an operator checks by hand after every launch, as pure functions.

- **Instant failures**: a trial that raised before one output token, within `instant_fail` of agent time or
  without the model ever answering one request, is infra (the served model was not reachable), never the
  model's 0. (Real Harbor retries an unreachable model for ~36 s before it raises: time alone misses it.)
  `count_instant_failures` files them in the `InstantFailure` bucket, so gates, resume, metrics and MLflow all
  see them as infra.
- **The failure catalog**: `diagnose` finds the first catalogued failure mode in a log.
- **The job's output**: `read_output` folds what a running job printed since the last pass into a reading
  (vLLM's access lines, its ready line, pinggy's lines, catalogued running failures).
- **Pinggy wiring**: `unwired_api_base` says why a trial's `api_base` is not the leased pair's public URL.
"""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Sequence
from datetime import datetime, timedelta
from urllib.parse import urlsplit

from pydantic import Field

from controller.core import patterns
from controller.core.hostlist import HostlistError, expand
from controller.core.observed import ErrorKind, JobOutput, RunDirFacts
from controller.core.remedies import FailureMode, FailureStage, OutputReading
from controller.core.trial_errors import INSTANT_FAILURE, NO_MODEL_OUTPUT
from controller.core.types import Frozen
from controller.core.vocabulary import HealthState

# vLLM's uvicorn access lines: `INFO:     127.0.0.1:53312 - "POST /v1/chat/completions HTTP/1.1" 200 OK`
REQUEST = re.compile(r'"POST /v1/(?:chat/)?completions HTTP/[\d.]+" (\d{3})')
SERVER_READY = re.compile(r"Application startup complete|Uvicorn running on")
PINGGY_LIVE = re.compile(r"You are authenticated as")
PINGGY_LOCKED = re.compile(r"A tunnel with the same token .*is already active")
MIN_REQUESTS_FOR_SHARE = 50  # fewer requests than this say nothing about their 400 share


class HealthLimits(Frozen):
    """The EvalRun's `spec.health`, in the units the rules use, and the failure catalog of its cluster (no
    defaults here: the spec's are the only ones)."""

    instant_fail: timedelta
    dead_launch_trials: int
    launch_grace: timedelta
    no_traffic: timedelta
    bad_request_fraction: float
    max_refires: int
    refire_backoff: timedelta
    bad_node: timedelta
    max_quarantined_nodes: int
    failure_modes: tuple[FailureMode, ...] = Field(description="the catalog, then the cluster's own entries")


def count_instant_failures(facts: RunDirFacts, instant_fail: timedelta) -> RunDirFacts:
    """The facts with every trial that measured nothing of the model moved to an infra bucket: instant failures
    (from their exception class to `InstantFailure`) and graded trials whose agent reported 0 output tokens or
    never ran (to `NoModelOutput`: a dead server behind a live harness, a verifier grading an untouched
    workspace). Out of the scored trials, the reward sums and their task's tally; into the infra count and
    breakdown. Only for agents that call a model."""
    moved = [q for q in facts.quiet_failures if q.exception_type is None or not q.answered
             or q.agent_seconds is None or q.agent_seconds < instant_fail.total_seconds()]
    if not moved or facts.unreadable:
        return facts
    breakdown, infra_breakdown = dict(facts.error_breakdown), dict(facts.infra_error_breakdown)
    counts = {ErrorKind.INFRA: facts.n_infra_errors, ErrorKind.BENIGN: facts.n_benign_errors}
    graded, instant = facts.n_graded, 0
    reward_sum = facts.reward_sum
    tasks = dict(facts.tasks)
    for trial in moved:
        if trial.exception_type is None:
            graded -= 1
            bucket = NO_MODEL_OUTPUT
        else:
            breakdown[trial.exception_type] = breakdown.get(trial.exception_type, 1) - 1
            if trial.kind is not ErrorKind.BENIGN:
                infra_breakdown[trial.exception_type] = infra_breakdown.get(trial.exception_type, 1) - 1
            counts[trial.kind or ErrorKind.INFRA] -= 1
            instant += 1
            bucket = INSTANT_FAILURE
        breakdown[bucket] = breakdown.get(bucket, 0) + 1
        infra_breakdown[bucket] = infra_breakdown.get(bucket, 0) + 1
        counts[ErrorKind.INFRA] += 1
        if trial.kind != ErrorKind.INFRA:  # it was scored: the sums and its task's tally held it
            reward = trial.reward or 0.0
            reward_sum -= reward
            seen, scored, task_sum = tasks.get(trial.task, (1, 1, reward))
            tasks[trial.task] = (seen, scored - 1, task_sum - reward)
    return facts.model_copy(update={
        "n_instant_failures": instant, "error_breakdown": dict(sorted(breakdown.items())),
        "infra_error_breakdown": dict(sorted(infra_breakdown.items())),
        "n_infra_errors": counts[ErrorKind.INFRA], "n_benign_errors": counts[ErrorKind.BENIGN], "n_graded": graded,
        "reward_sum": reward_sum, "tasks": tasks})


def measured_nothing(facts: RunDirFacts) -> int:
    """Completed trials in which the model never answered: instant failures, and graded ones with 0 output tokens."""
    return facts.n_instant_failures + facts.error_breakdown.get(NO_MODEL_OUTPUT, 0)


def no_output_summary(facts: RunDirFacts) -> str:
    """'12 instant failures' (and 'N graded trials without one output token', when there are such)."""
    silent = measured_nothing(facts) - facts.n_instant_failures
    return f"{facts.n_instant_failures} instant failures" + (
        f" and {silent} graded trials without one output token" if silent else "")


def is_dead_launch(facts: RunDirFacts) -> bool:
    """Every trial that completed failed instantly or got no output from the model: nothing in the dir is a score."""
    return facts.n_completed > 0 and measured_nothing(facts) == facts.n_completed


class Diagnosis(Frozen):
    mode: FailureMode
    line: str = Field(description="the line that matched, cut short")

    def __str__(self) -> str:
        return f"{self.mode.name}: {self.mode.advice}"


def diagnose(text: str, modes: Sequence[FailureMode], stage: FailureStage) -> Diagnosis | None:
    """The first catalogued failure of `stage` whose pattern matches a line of `text` (catalog order), matched by
    RE2 (`patterns.py`): linear in the text whatever a cluster's catalog says."""
    data = text.encode("utf-8", "replace")
    for mode in modes:
        if mode.when != stage:
            continue
        for pattern in mode.patterns:
            found = patterns.search(pattern, data)
            if found is not None:
                return Diagnosis(mode=mode, line=found.line[:200])
    return None


def read_output(previous: OutputReading | None, output: JobOutput, modes: Sequence[FailureMode],
                now: datetime) -> OutputReading:
    """Fold a running job's new output into what its earlier output said (a reading of another job starts over)."""
    reading = previous if previous is not None and previous.job_id == output.job_id else OutputReading(
        job_id=output.job_id, read_at=now)
    statuses = REQUEST.findall(output.text)
    bad = sum(1 for status in statuses if status == "400")
    minutes = (now - reading.read_at).total_seconds() / 60
    rate = len(statuses) / minutes if minutes > 0 else reading.requests_per_minute
    pinggy = "locked" if PINGGY_LOCKED.search(output.text) else (
        "live" if PINGGY_LIVE.search(output.text) else reading.pinggy)
    failure = diagnose(output.text, modes, FailureStage.RUNNING)
    return reading.model_copy(update={
        "offset": output.end, "read_at": now, "requests": reading.requests + len(statuses),
        "bad_requests": reading.bad_requests + bad, "requests_per_minute": rate,
        "ready_at": reading.ready_at or (now if SERVER_READY.search(output.text) else None),
        "last_request_at": now if statuses else reading.last_request_at, "pinggy": pinggy,
        "failure": reading.failure or (failure.mode.name if failure else None),
        "failure_at": now if failure is not None else reading.failure_at})


def blamed_node(nodes: str, log: str = "") -> str | None:
    """The one node a failure points at: the job's only node, or the one of its nodes its log names alone.
    None when that cannot be told (a multi-node job whose log names none or several, an unparsable NodeList):
    excluding a whole NodeList expression would take many healthy nodes out for a day."""
    try:
        names = expand(nodes)
    except HostlistError:
        return None
    if len(names) <= 1:
        return names[0] if names else None
    named = [name for name in names if re.search(rf"(?<![\w.-]){re.escape(name)}(?![\w-])", log)]
    return named[0] if len(named) == 1 else None


def bad_request_share(reading: OutputReading) -> float | None:
    """The 400 share, once there are enough requests to say anything."""
    if reading.requests < MIN_REQUESTS_FOR_SHARE:
        return None
    return reading.bad_requests / reading.requests


def unwired_api_base(api_base: str | None, pair_url: str | None) -> str:
    """Why a pinggy cell's trials do not reach the model through its pair ('' when they do, or cannot tell)."""
    if not api_base:
        return ""
    host = urlsplit(api_base).hostname or ""
    if _private(host):
        return f"api_base {api_base} is an internal address"
    if pair_url and host != (urlsplit(pair_url).hostname or ""):
        return f"api_base {api_base} is not the leased pair's URL {pair_url}"
    return ""


def verdict(reading: OutputReading | None, facts: RunDirFacts | None, job_started: datetime | None,
            health: HealthLimits, now: datetime) -> tuple[HealthState, str]:
    """Whether a running job works, in one line a person reads: alive, launching, or suspect."""
    traffic = _traffic(reading)
    if facts is None or (facts.n_started_trials == 0 and facts.n_completed == 0):
        waited = _minutes(now - job_started) if job_started is not None else "?"
        return HealthState.LAUNCHING, f"launching ({waited} of {_minutes(health.launch_grace)}{traffic})"
    if is_dead_launch(facts):
        return HealthState.STALLED, (f"suspect: {no_output_summary(facts)} and no real trial yet "
                                     f"(a dead launch at {health.dead_launch_trials}){traffic}")
    last = facts.last_progress_at
    since = f", last result {_minutes(now - last)} ago" if last else ""
    return HealthState.ALIVE, f"alive: {facts.n_scored} trials scored{since}{traffic}"


def _traffic(reading: OutputReading | None) -> str:
    if reading is None or not reading.requests:
        return ""
    rate = f", {reading.requests_per_minute:.0f} req/min" if reading.requests_per_minute is not None else ""
    return f"{rate}, {reading.bad_requests / reading.requests:.0%} 400s of {reading.requests} requests"


def _private(host: str) -> bool:
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host.endswith((".local", ".internal", ".cluster"))
    return address.is_private or address.is_loopback or address.is_link_local


def _minutes(delta: timedelta) -> str:
    return f"{max(math.floor(delta.total_seconds() / 60), 0)} min"
