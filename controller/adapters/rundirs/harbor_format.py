"""Harbor's on-disk formats (JobConfig, JobResult, TrialResult, the sbatch's meta.env), read leniently.

Every reader takes raw bytes and returns plain values or None: files written by old Harbor
versions, by the old listener, or half-written by a killed job must never stop a scan.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any, NamedTuple


def load_json(data: bytes | None) -> dict[str, Any] | None:
    if not data:
        return None
    try:
        doc = json.loads(data)
    except ValueError:  # JSONDecodeError and UnicodeDecodeError
        return None
    return doc if isinstance(doc, dict) else None


def parse_meta_env(data: bytes | None) -> dict[str, str]:
    """KEY=VALUE lines; tolerates `export`, quotes, comments and junk lines."""
    values: dict[str, str] = {}
    for line in (data or b"").decode("utf-8", "replace").splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.removeprefix("export ").partition("=")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        values[key.strip()] = value
    return values


def parse_time(value: object) -> datetime | None:
    """ISO timestamp → aware UTC. Harbor writes naive local times; those are read as this host's zone."""
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed.astimezone(UTC)  # astimezone() treats a naive value as local time


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
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def model_from_harbor(model_name: str) -> str:
    """`hosted_vllm/laion/Qwen3-8B` → `laion/Qwen3-8B`; a provider prefix goes only when an org remains."""
    provider, _, rest = model_name.partition("/")
    return rest if provider and "/" in rest else model_name


def dataset_basename(dataset: str) -> str:
    return dataset.rstrip("/").rsplit("/", 1)[-1]


class JobConfigFacts(NamedTuple):
    model: str | None
    dataset: str | None
    agent: str | None
    timeout_multiplier: float | None


def job_config_facts(doc: dict[str, Any]) -> JobConfigFacts:
    agent = _first(doc.get("agents"))
    dataset = _first(doc.get("datasets"))
    model = agent.get("model_name")
    dataset_ref = dataset.get("path") or dataset.get("name")
    return JobConfigFacts(
        model=model_from_harbor(model) if isinstance(model, str) and model else None,
        dataset=dataset_ref if isinstance(dataset_ref, str) else None,
        agent=agent.get("name") if isinstance(agent.get("name"), str) else None,
        timeout_multiplier=parse_float(doc.get("timeout_multiplier")),
    )


class TrialOutcome(NamedTuple):
    reward: float | None
    exception_type: str | None


def trial_outcome(doc: dict[str, Any]) -> TrialOutcome:
    rewards = _dict(_dict(doc.get("verifier_result")).get("rewards"))
    exception_type = _dict(doc.get("exception_info")).get("exception_type")
    return TrialOutcome(
        reward=parse_float(rewards.get("reward")),
        exception_type=exception_type if isinstance(exception_type, str) and exception_type else None,
    )


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _first(value: object) -> dict[str, Any]:
    return _dict(value[0]) if isinstance(value, list) and value else {}
