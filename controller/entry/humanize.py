"""Values as a person reads them: `Started`, `2026-12-01 07:28 UTC (12 min ago)`, `0.4167`, `—`. Never a repr."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from enum import Enum

from pydantic import BaseModel

NOTHING = "—"


def value_text(value: object, now: datetime) -> str:
    """Any value a plan carries: enums by value, datetimes in UTC with their age, None as —, floats to 4 digits,
    sequences joined, models and mappings as `name value` pairs (their empty fields left out)."""
    if value is None:
        return NOTHING
    if isinstance(value, Enum):
        return str(value.value)
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, datetime):
        return moment(value, now)
    if isinstance(value, timedelta):
        return duration(value)
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, BaseModel):
        return fields_text(dict(value), now)
    if isinstance(value, Mapping):
        return fields_text(value, now)
    if isinstance(value, list | tuple | set | frozenset):
        return ", ".join(value_text(item, now) for item in value) or NOTHING
    return str(value)


def fields_text(fields: Mapping[object, object], now: datetime) -> str:
    shown = [f"{name} {value_text(value, now)}" for name, value in fields.items() if not _empty(value)]
    return "; ".join(shown) or NOTHING


def moment(when: datetime, now: datetime) -> str:
    """`2026-12-01 07:28 UTC (12 min ago)`; a naive datetime is taken as UTC (what the stores hold)."""
    aware = when if when.tzinfo is not None else when.replace(tzinfo=UTC)
    age = now - aware
    relative = f"{duration(age)} ago" if age >= timedelta(0) else f"in {duration(-age)}"
    return f"{aware.astimezone(UTC):%Y-%m-%d %H:%M} UTC ({relative})"


def duration(span: timedelta) -> str:
    seconds = span.total_seconds()
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.0f} h"
    return f"{seconds / 86400:.0f} d"


def _empty(value: object) -> bool:
    return value is None or (isinstance(value, list | tuple | dict | str) and not value)
