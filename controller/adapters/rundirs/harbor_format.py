"""Harbor's on-disk formats (JobConfig, JobResult, TrialResult, the sbatch's meta.env).

Each reader takes a file's bytes and returns the facts the rules use, or raises `FormatError` when the file
does not say them: not UTF-8, not JSON, not a JSON object, or a field the rules read holding the wrong type.
Fields that are absent or null stay lenient (None): old Harbor versions and the old listener left many out.
A file that raises makes its run dir unreadable — read as "absent", a bad trial result would look unfinished
and a partial score would be uploaded as complete.
"""

from __future__ import annotations

import json
import math
import posixpath
import sys
from collections.abc import Iterable
from datetime import datetime, timezone
from typing import Any, NamedTuple, TypeVar

T = TypeVar("T", int, float)


class FormatError(ValueError):
    """A file that is there but does not say what the rules need."""


def load_json(data: bytes) -> dict[str, Any]:
    """A UTF-8 JSON object. NaN and Infinity decode to floats that every field reader refuses (`_number`): a
    trial's reward of NaN is then an invalid reward, named as such, and any other field one makes the file bad."""
    try:
        doc = _DECODER.decode(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise FormatError("not UTF-8") from None
    except ValueError as exc:
        raise FormatError(f"not JSON: {exc}") from None
    except RecursionError:
        raise FormatError("not JSON: nested too deeply") from None
    if not isinstance(doc, dict):
        raise FormatError(f"a JSON {_json_type(doc)}, not an object")
    return doc


_DECODER = json.JSONDecoder()  # one, as json.loads keeps for its defaults


def parse_meta_env(data: bytes) -> dict[str, str]:
    """KEY=VALUE lines; tolerates `export`, quotes, comments and junk lines, but not binary or non-UTF-8 bytes."""
    if b"\0" in data:
        raise FormatError("binary (NUL bytes), not KEY=VALUE text")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise FormatError("not UTF-8") from None
    values: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.removeprefix("export ").partition("=")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        values[key.strip()] = value
    return values


class MetaFacts(NamedTuple):
    model: str | None = None
    dataset: str | None = None
    benchmark_name: str | None = None
    agent: str | None = None
    timeout_multiplier: float | None = None
    resume_count: int | None = None
    n_attempts: int | None = None
    task_subset: str | None = None  # `shard 1/4`: the job ran part of the dataset (EVAL_SHARD)


def meta_env_facts(data: bytes) -> MetaFacts:
    """meta.env; an empty value is unset (the sbatch writes `SLURM_JOB_ID=` outside SLURM), a garbled number is not."""
    values = parse_meta_env(data)
    multiplier = values.get("TIMEOUT_MULTIPLIER") or None
    resume_count = values.get("RESUME_COUNT") or None
    attempts = values.get("N_ATTEMPTS") or None
    parsed_multiplier = parse_float(multiplier)
    parsed_count = parse_int(resume_count)
    parsed_attempts = parse_int(attempts)
    if multiplier is not None and parsed_multiplier is None:
        raise FormatError(f"TIMEOUT_MULTIPLIER={_shown(multiplier)} is not a number")
    if resume_count is not None and (parsed_count is None or parsed_count < 0):
        raise FormatError(f"RESUME_COUNT={_shown(resume_count)} is not a count")
    if attempts is not None and (parsed_attempts is None or parsed_attempts < 1):
        raise FormatError(f"N_ATTEMPTS={_shown(attempts)} is not a count of attempts")
    return MetaFacts(
        model=values.get("MODEL") or None,
        dataset=values.get("REPO_ID") or None,
        benchmark_name=values.get("BENCHMARK_NAME") or None,
        agent=values.get("AGENT_NAME") or None,
        timeout_multiplier=parsed_multiplier,
        resume_count=parsed_count,
        n_attempts=parsed_attempts,
        task_subset=f"shard {shard}" if (shard := values.get("SHARD")) else None,
    )


def parse_time(value: object) -> datetime | None:
    """ISO timestamp → aware UTC. Harbor writes naive local times; those are read as this host's zone."""
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed.astimezone(timezone.utc)  # astimezone() treats a naive value as local time


def parse_int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    try:
        return int(str(value).strip())
    except ValueError:
        return None


def parse_float(value: object) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        parsed = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return parsed if math.isfinite(parsed) else None


def model_from_harbor(model_name: str) -> str:
    """`hosted_vllm/laion/Qwen3-8B` → `laion/Qwen3-8B`; a provider prefix goes only when an org remains."""
    provider, _, rest = model_name.partition("/")
    return rest if provider and "/" in rest else model_name


def named_model(model_name: str | None) -> str | None:
    """The model a name names, or None: nothing, or vLLM's numeric served id (`48213`, `hosted_vllm/48213`), which
    says nothing about which weights answered."""
    if not model_name or model_name.rstrip("/").rsplit("/", 1)[-1].isdigit():
        return None
    return model_from_harbor(model_name)


def dataset_basename(dataset: str) -> str:
    return dataset.rstrip("/").rsplit("/", 1)[-1]


class JobConfigFacts(NamedTuple):
    model: str | None = None
    dataset: str | None = None
    agent: str | None = None
    timeout_multiplier: float | None = None
    n_attempts: int | None = None
    task_subset: str | None = None  # `task_names (5)`: Harbor ran part of the dataset, or more than one


def job_config_facts(data: bytes) -> JobConfigFacts:
    """config.json (JobConfig): agents[0].name/model_name, datasets[0].path or name, timeout_multiplier, n_attempts
    (absent from Harbor 0.25's sparse config when it is the default 1: then unknown), and the filters that restrict
    the run to part of the dataset."""
    doc = load_json(data)
    agent = _first(doc, "agents")
    dataset = _first(doc, "datasets")
    model = _str(agent, "model_name", "agents[0]")
    dataset_ref = _str(dataset, "path", "datasets[0]") or _str(dataset, "name", "datasets[0]")
    return JobConfigFacts(
        model=model_from_harbor(model) if model else None,
        dataset=dataset_ref or None,
        agent=_str(agent, "name", "agents[0]") or None,
        timeout_multiplier=_number(doc, "timeout_multiplier"),
        n_attempts=_count(doc, "n_attempts"),
        task_subset=_task_subset(doc, dataset),
    )


def _task_subset(doc: dict[str, Any], dataset: dict[str, Any]) -> str | None:
    """What makes the run other than the whole dataset (None: nothing does): Harbor's task filters, which it writes
    into config.json (a resume runs them again), or several datasets in one job. Harbor's total is then the subset's,
    and complete by it is no run of the benchmark."""
    said = []
    for key in ("task_names", "exclude_task_names"):
        names = dataset.get(key)
        if names is not None and not isinstance(names, list):
            raise FormatError(f"datasets[0].{key} is a JSON {_json_type(names)}, not a list")
        if names:
            said.append(f"{key} ({len(names)})")
    if (first := _count(dataset, "n_tasks", "datasets[0]")) is not None:
        said.append(f"n_tasks {first}")
    if isinstance(datasets := doc.get("datasets"), list) and len(datasets) > 1:
        said.append(f"{len(datasets)} datasets")
    return ", ".join(said) or None


class JobResultFacts(NamedTuple):
    n_total: int | None
    started_at: datetime | None
    finished_at: datetime | None


def job_result_facts(data: bytes) -> JobResultFacts:
    """result.json (JobResult): the expected trial count and whether the job finished."""
    doc = load_json(data)
    n_total = doc.get("n_total_trials")
    if n_total is not None and (isinstance(n_total, bool) or not isinstance(n_total, int) or n_total < 0):
        raise FormatError(f"n_total_trials is {_shown(n_total)}, not a count")
    return JobResultFacts(n_total=n_total, started_at=_time(doc, "started_at"), finished_at=_time(doc, "finished_at"))


class TrialOutcome(NamedTuple):
    reward: float | None
    exception_type: str | None
    n_output_tokens: int | None = None  # None: the agent reported no usage (it may never have called the model)
    agent_seconds: float | None = None  # agent_execution finished - started; None: it never ran (or never ended)
    n_input_tokens: int | None = None  # None or 0 with no output either: no request of it was ever answered
    task: str | None = None  # task_name: which task the trial ran (attempts of one task share it)
    reward_problem: str | None = None  # why the verifier's rewards hold no usable `reward` (then reward is None)
    exception_qualified: str | None = None  # `module.Class` of the exception, where its traceback or message says
    step_exceptions: tuple[tuple[str, str | None], ...] = ()  # (class, qualified) of each step's, in step order
    agent_ran: bool = True  # False: neither the trial nor any step records an agent_execution or an agent_result
    model: str | None = None  # the model the trial's agent called, as `named_model` reads it
    source: str | None = None  # the dataset Harbor says the task came from (a local dataset dir's name)
    task_dir: str | None = None  # the dir holding the trial's local task (`task_id.path`'s parent): its dataset


def trial_outcome(data: bytes) -> TrialOutcome:
    """A trial's result.json (TrialResult): verifier_result.rewards.reward, exception_info.exception_type, and what
    tells an instant failure: agent_result.n_output_tokens and the agent_execution times.

    A multi-step trial (Harbor 0.26) records its agent's usage and times per step (`step_results`) instead: they
    are summed, as Harbor's `compute_token_cost_totals` does, so a multi-step trial that ran is not taken for one
    that never did. It records a step's failure on the step too, leaving the trial's exception_info null and its
    reward the mean over the steps that were verified: the steps' exceptions are read, for the tally to classify.
    """
    doc = load_json(data)
    verifier = _object(doc, "verifier_result")
    rewards = _object(verifier, "rewards", "verifier_result")
    exception_type, qualified = _exception(doc, "")
    steps = _objects(doc, "step_results")
    tokens, prompt, seconds = _agent_usage(doc, "")
    if doc.get("agent_result") is None or doc.get("agent_execution") is None:
        usage = [_agent_usage(step, f"step_results[{i}]") for i, step in enumerate(steps)]
        if doc.get("agent_result") is None:
            tokens, prompt = _sum(t for t, _, _ in usage), _sum(p for _, p, _ in usage)
        if doc.get("agent_execution") is None:
            seconds = _sum(s for _, _, s in usage)
    recorded = (_exception(step, f"step_results[{i}]") for i, step in enumerate(steps))
    step_exceptions = tuple((name, origin) for name, origin in recorded if name is not None)
    reward, problem = _reward(rewards) if rewards or "rewards" in verifier else _stray_reward(verifier)
    task = doc.get("task_name")
    return TrialOutcome(reward=reward, exception_type=exception_type, n_output_tokens=tokens,
                        agent_seconds=seconds, n_input_tokens=prompt, task=task if isinstance(task, str) else None,
                        reward_problem=problem, exception_qualified=qualified, step_exceptions=step_exceptions,
                        agent_ran=_agent_ran(doc, steps), model=_trial_model(doc),
                        source=_interned(_str(doc, "source")), task_dir=_task_dir(doc))


UNNAMED_EXCEPTION = "UnnamedException"  # an exception_info without a class: no catalog lists it, so it is infra


def _exception(doc: dict[str, Any], where: str) -> tuple[str | None, str | None]:
    """(class, `module.Class` where known) of the exception_info of a trial or a step; (None, None) when none is
    recorded. One recorded without a class (no `exception_type`, or a blank one) is `UnnamedException`: something
    went wrong that nobody named, which is never evidence that the model failed (RULES §3)."""
    if doc.get("exception_info") is None:
        return None, None
    exception = _object(doc, "exception_info", where)
    named = _str(exception, "exception_type", _field(where, "exception_info"))
    if not named or not named.strip():
        return UNNAMED_EXCEPTION, None
    return named, _qualified(named, exception)


def _agent_ran(doc: dict[str, Any], steps: list[dict[str, Any]]) -> bool:
    """Whether anything records the agent running: an agent_execution or an agent_result, of the trial or a step.
    A trial without either that was graded had its verifier grade a workspace no agent touched."""
    return any(part.get(key) is not None for part in (doc, *steps) for key in ("agent_execution", "agent_result"))


def _trial_model(doc: dict[str, Any]) -> str | None:
    """The model a trial's agent was configured with (`config.agent.model_name`), else the one Harbor's agent
    reports (`agent_info.model_info`, where it is no served id)."""
    configured = _str(_object(_object(doc, "config"), "agent", "config"), "model_name", "config.agent")
    info = _object(_object(doc, "agent_info"), "model_info", "agent_info")
    return _interned(named_model(configured) or named_model(_str(info, "name", "agent_info.model_info")))


def _task_dir(doc: dict[str, Any]) -> str | None:
    """The dir holding a local task (`task_id.path` without `git_url`), i.e. the dataset it belongs to."""
    task_id = _object(doc, "task_id")
    path = _str(task_id, "path", "task_id")
    if not path or task_id.get("git_url"):
        return None
    parent = posixpath.dirname(path.rstrip("/"))
    return _interned(parent) if parent else None


def _interned(text: str | None) -> str | None:
    """Every trial of a run names the same model and dataset: one string each, however many trials are kept."""
    return sys.intern(text) if text else None


REWARD_KEY = "reward"  # Harbor's verifier writes the trial's score under this key of verifier_result.rewards


def _stray_reward(verifier: dict[str, Any]) -> tuple[None, str | None]:
    """A verifier_result without `rewards` but with other keys (an older format's `reward` beside it): the verifier
    scored the trial where Harbor does not read it. A problem, never "not graded": that would count a 0 as infra."""
    others = sorted(str(key) for key, value in verifier.items() if value is not None)
    return None, (f"verifier_result has no 'rewards' (only {', '.join(others)[:80]})" if others else None)


def _reward(rewards: dict[str, Any]) -> tuple[float | None, str | None]:
    """(the reward, None), or (None, why it is not one): a value that is no finite number, or rewards with other
    keys only. Not a file error: an unusable reward is evidence about the run, which the admission gate names."""
    if REWARD_KEY not in rewards or rewards[REWARD_KEY] is None:
        others = sorted(str(key) for key in rewards if key != REWARD_KEY)
        return None, (f"rewards has no {REWARD_KEY!r} key (only {', '.join(others)[:80]})" if others else None)
    value = rewards[REWARD_KEY]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(_as_float(value)):
        return None, f"reward is {_shown(value)}, not a finite number"
    return float(value), None


def _qualified(exception_type: str, exception: dict[str, Any]) -> str | None:
    """Where the exception class came from: the dotted name ending in `.<class>` that the traceback's last line or
    the message starts with (`litellm.BadRequestError: ...`), or the type itself when it is dotted."""
    if "." in exception_type:
        return exception_type
    bare = exception_type.rsplit(".", 1)[-1]
    for key in ("exception_traceback", "exception_message"):
        text = exception.get(key)
        if not isinstance(text, str):
            continue
        lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
        for line in (lines[-1:] if key == "exception_traceback" else lines[:1]):
            name = line.split(":", 1)[0].strip()
            if name.endswith(f".{bare}") and all(part.isidentifier() for part in name.split(".")):
                return name
    return None


def trial_api_base(data: bytes) -> str | None:
    """A trial's config.json (TrialConfig): the endpoint its agent calls, `agent.kwargs.api_base` (what the sbatch
    patches for pinggy), else `agent.base_url` (Harbor's own override of the inference endpoint)."""
    agent = _object(load_json(data), "agent")
    kwargs = _object(agent, "kwargs", "agent")
    return _str(kwargs, "api_base", "agent.kwargs") or _str(agent, "base_url", "agent") or None


def _agent_usage(doc: dict[str, Any], where: str) -> tuple[int | None, int | None, float | None]:
    """(agent_result.n_output_tokens, .n_input_tokens, agent_execution seconds) of a trial or of one of its steps."""
    result_where, execution_where = _field(where, "agent_result"), _field(where, "agent_execution")
    tokens = _count(_object(doc, "agent_result", where), "n_output_tokens", result_where)
    prompt = _count(_object(doc, "agent_result", where), "n_input_tokens", result_where)
    execution = _object(doc, "agent_execution", where)
    started = _time(execution, "started_at", execution_where)
    finished = _time(execution, "finished_at", execution_where)
    seconds = (finished - started).total_seconds() if started is not None and finished is not None else None
    return tokens, prompt, seconds


def _sum(values: Iterable[T | None]) -> T | None:
    """The sum of the values that are there; None when none is (as Harbor sums per-step usage)."""
    known = [value for value in values if value is not None]
    return sum(known) if known else None


def _object(doc: dict[str, Any], key: str, where: str = "") -> dict[str, Any]:
    value = doc.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise FormatError(f"{_field(where, key)} is a JSON {_json_type(value)}, not an object")
    return value


def _first(doc: dict[str, Any], key: str) -> dict[str, Any]:
    value = doc.get(key)
    if value is None or value == []:
        return {}
    if not isinstance(value, list) or not isinstance(value[0], dict):
        raise FormatError(f"{key} is not a list of objects")
    return value[0]


def _str(doc: dict[str, Any], key: str, where: str = "") -> str | None:
    value = doc.get(key)
    if value is not None and not isinstance(value, str):
        raise FormatError(f"{_field(where, key)} is a JSON {_json_type(value)}, not a string")
    return value


def _number(doc: dict[str, Any], key: str, where: str = "") -> float | None:
    value = doc.get(key)
    if value is None:
        return None
    if not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(_as_float(value)):
        return float(value)
    raise FormatError(f"{_field(where, key)} is {_shown(value)}, not a number")


def _as_float(value: float) -> float:
    try:
        return float(value)
    except OverflowError:  # an integer beyond float range
        return math.inf


def _objects(doc: dict[str, Any], key: str) -> list[dict[str, Any]]:
    value = doc.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise FormatError(f"{key} is not a list of objects")
    return value


def _count(doc: dict[str, Any], key: str, where: str = "") -> int | None:
    value = doc.get(key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise FormatError(f"{_field(where, key)} is {_shown(value)}, not a count")
    return value


def _time(doc: dict[str, Any], key: str, where: str = "") -> datetime | None:
    value = doc.get(key)
    parsed = parse_time(value)
    if value is not None and parsed is None:
        raise FormatError(f"{_field(where, key)} is {_shown(value)}, not an ISO timestamp")
    return parsed


def _field(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _json_type(value: object) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def _shown(value: object) -> str:
    """A value for a reason, cut short: the value may be a few MiB of garbage."""
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."
