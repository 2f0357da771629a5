"""Stored values <-> Python values, tolerant of what the old listener and Postgres actually wrote.

Backend-agnostic: a Postgres backend hands in datetimes and decoded jsonb, SQLite hands in text;
both come out the same. Recognised variants are accepted; anything undecodable raises
`ValueError`, because guessing (e.g. reading garbage as "no metrics") would make the planner
resubmit — the store fails closed instead.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from controller.core.types import Metric


def format_timestamp(value: datetime | None) -> str | None:
    """ISO 8601 in UTC with an explicit offset and fixed width, so stored strings also sort correctly."""
    if value is None:
        return None
    return as_utc(value).isoformat(timespec="microseconds")


def parse_timestamp(value: object) -> datetime | None:
    """ISO with offset or 'Z', naive (= UTC), Postgres 'YYYY-MM-DD HH:MM:SS.ffffff+00', epoch seconds."""
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        return as_utc(value)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return datetime.fromtimestamp(value, UTC)
    if isinstance(value, str):
        return as_utc(datetime.fromisoformat(value.strip()))
    raise ValueError(f"not a timestamp: {value!r}")


def as_utc(value: datetime) -> datetime:
    """Naive datetimes are UTC by convention (the old listener wrote `datetime.utcnow()`)."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def parse_json(value: object) -> object:
    """Decode a JSON column; also accepts already-decoded values and double-encoded strings."""
    for _ in range(2):
        if not isinstance(value, str):
            return value
        if not value.strip():
            return None
        value = json.loads(value)
    return value


def parse_config(value: object) -> dict[str, Any] | None:
    config = parse_json(value)
    if config is None or isinstance(config, dict):
        return config
    raise ValueError(f"config is not a JSON object: {value!r}")


def parse_metrics(value: object) -> tuple[Metric, ...] | None:
    """The LIST of {name, value}; null → None, empty → ().

    A legacy dict (`{"accuracy": 0.5}`) is read as the equivalent list. The leaderboard ignores
    such rows, but the eval did finish, so dedup must still see its score.
    """
    metrics = parse_json(value)
    if metrics is None:
        return None
    if isinstance(metrics, dict):
        return tuple(Metric(name=str(name), value=score) for name, score in metrics.items())
    if isinstance(metrics, list) and all(isinstance(item, dict) and "name" in item for item in metrics):
        return tuple(Metric(name=str(item["name"]), value=item.get("value")) for item in metrics)
    raise ValueError(f"metrics are neither a list of {{name, value}} nor a dict: {value!r}")


def format_metrics(metrics: Iterable[Metric]) -> str:
    """Always the list form: the leaderboard ignores a dict."""
    return json.dumps([{"name": metric.name, "value": metric.value} for metric in metrics])
