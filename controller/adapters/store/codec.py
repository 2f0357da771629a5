"""Stored values <-> Python values, tolerant of what the old listener and Postgres actually wrote.

Backend-agnostic: a Postgres backend hands in datetimes and decoded jsonb, SQLite hands in text;
both come out the same. Recognised variants are accepted; anything undecodable raises
`ValueError`, because guessing (e.g. reading garbage as "no metrics") would make the planner
resubmit — the store fails closed instead.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from controller.core.gpu_hours import AttemptCost
from controller.core.intake import RegisteredModel, Selection
from controller.core.metrics import same_metrics
from controller.core.notify import Episode, Notification, NotifyEvent
from controller.core.observed import CellOwner, Metric, RowStatus, Submission, TunnelLease
from controller.core.ports import WriteRefused
from controller.core.records import NamedRow, ResultUpload, RowAuditMark, SandboxJobRow, StateSnapshot
from controller.core.remedies import CellMemory, Quarantined
from controller.core.retry import RetryRequest
from controller.core.types import EvalRunRef

# How the backends spell a boolean: Postgres and PostgREST a bool, SQLite 0/1, hand-written text either.
_FLAGS = {"true": True, "t": True, "1": True, "false": False, "f": False, "0": False}


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


def parse_flag(value: object) -> bool | None:
    """A boolean column (`is_overlong`): null → None; a bool, 0/1 or true/false text; anything else raises."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int | str) and str(value).strip().lower() in _FLAGS:
        return _FLAGS[str(value).strip().lower()]
    raise ValueError(f"not a boolean: {value!r}")


def format_metrics(metrics: Iterable[Metric]) -> str:
    """Always the list form: the leaderboard ignores a dict."""
    return json.dumps([{"name": metric.name, "value": metric.value} for metric in metrics])


def sandbox_job_row(values: dict[str, Any]) -> SandboxJobRow:
    """A stored `sandbox_jobs` record (any backend's spelling) as the row the core reads; other columns are ignored."""
    values = {name: value for name, value in values.items() if name in SandboxJobRow.model_fields}
    try:
        for column in ("created_at", "submitted_at", "started_at", "ended_at"):
            values[column] = parse_timestamp(values.get(column))
        values["config"] = parse_config(values.get("config"))
        values["metrics"] = parse_metrics(values.get("metrics"))
        values["is_overlong"] = parse_flag(values.get("is_overlong"))
        values["n_rep_eval"] = _count_or_none(values.get("n_rep_eval"))
        for column in ("id", "model_id", "benchmark_id", "slurm_job_id"):
            if values.get(column) is not None:
                values[column] = str(values[column])
        return SandboxJobRow(**values)
    except (ValueError, ValidationError) as error:
        raise ValueError(f"row {values.get('id')}: {_first_line(error)}") from error


def _count_or_none(value: object) -> int | None:
    """A count another tool wrote, or None: a column only matching reads is no reason to drop the row."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def decode_rows(records: Iterable[dict[str, Any]]) -> tuple[tuple[SandboxJobRow, ...], tuple[str, ...]]:
    """Rows that decode, and one 'row <id>: why' per row that does not (the caller decides to fail closed)."""
    rows, undecodable = [], []
    for record in records:
        try:
            rows.append(sandbox_job_row(record))
        except ValueError as error:
            undecodable.append(str(error))
    return tuple(rows), tuple(undecodable)


def decode_families(records: Iterable[Sequence[Any]]) -> tuple[tuple[NamedRow, ...], tuple[NamedRow, ...]]:
    """`(kind, id, name, duplicate_of)` records of the SQL backends' family statement, kind 'model' or
    'benchmark', as (models, benchmarks) in the order given."""
    named: dict[str, list[NamedRow]] = {"model": [], "benchmark": []}
    for kind, id_, name, duplicate_of in records:
        named[kind].append(NamedRow(id=id_, name=name, duplicate_of=duplicate_of))
    return tuple(named["model"]), tuple(named["benchmark"])


# Postgres' own spelling of its infinite timestamps, which sort after (before) every finite one.
_INFINITE = {"infinity": datetime.max.replace(tzinfo=UTC), "-infinity": datetime.min.replace(tzinfo=UTC)}


def registry_order(record: Mapping[str, Any]) -> tuple[bool, bool, datetime, str]:
    """Sort key of the `models`/`benchmarks` rows of one name: which one a new row reuses (ResultsDB.create_row).

    Canonical first, then the oldest `creation_time` (compared as times, whatever the spelling; none, or one
    that is not a time, last; benchmarks have none), then the smallest id. `postgres_sql.CREATE_ROW` sorts the
    same in SQL: booleans false first, timestamptz by instant NULLS LAST, ids as text in byte order.
    """
    stored = record.get("creation_time")
    try:
        created = _INFINITE[stored] if stored in _INFINITE else parse_timestamp(stored)
    except ValueError:
        created = None
    return (record.get("duplicate_of") is not None, created is None, created or _INFINITE["-infinity"],
            str(record.get("id")))


def reused_id(records: Iterable[Mapping[str, Any]]) -> str | None:
    """The id of the row a new row reuses among these rows of one name (`registry_order`), None if there are none."""
    first = min(records, key=registry_order, default=None)
    return None if first is None else str(first["id"])


def registered_models(records: Iterable[Mapping[str, Any]]) -> tuple[RegisteredModel, ...]:
    """`(name, creation_time)` records: a time that does not decode (or an infinite one) is unknown, so such a
    model is never taken for a recent one."""
    models = []
    for record in records:
        try:
            created = None if record["creation_time"] in _INFINITE else parse_timestamp(record["creation_time"])
        except ValueError:
            created = None
        models.append(RegisteredModel(name=record["name"], created_at=created))
    return tuple(models)


def model_selections(records: Iterable[Mapping[str, Any]]) -> tuple[Selection, ...]:
    """Raises ValueError on a record that does not decode: the caller fails the read closed."""
    try:
        return tuple(Selection(model=r["model"], rule=r["rule"], selected_at=r["selected_at"]) for r in records)
    except ValidationError as error:
        raise ValueError(_first_line(error)) from None


def audit_marks(records: Iterable[Mapping[str, Any]]) -> dict[str, RowAuditMark]:
    """Row id → its audit mark. Raises ValueError on a record that does not decode: the caller fails the read closed."""
    try:
        return {str(r["row_id"]): RowAuditMark(**{**r, "row_id": str(r["row_id"]),
                                                  "audited_at": parse_timestamp(r["audited_at"])}) for r in records}
    except ValidationError as error:
        raise ValueError(_first_line(error)) from None


def notifications(records: Iterable[Mapping[str, Any]]) -> tuple[Notification, ...]:
    """Raises ValueError on a record that does not decode: the caller fails the read closed."""
    try:
        return tuple(Notification(**{**r, "evalrun": EvalRunRef.parse(r["evalrun"]),
                                     "created_at": parse_timestamp(r["created_at"])}) for r in records)
    except ValidationError as error:
        raise ValueError(_first_line(error)) from None


def episodes(records: Iterable[Mapping[str, Any]]) -> dict[tuple[str, NotifyEvent], Episode]:
    """An EvalRun's recorded episodes by (subject, event)."""
    try:
        found = (Episode(subject=r["subject"], event=r["event"], episode=r["episode"], active=bool(r["active"]))
                 for r in records)
        return {(e.subject, e.event): e for e in found}
    except ValidationError as error:
        raise ValueError(_first_line(error)) from None


def state_snapshot(tables: Mapping[str, Iterable[Mapping[str, Any]]]) -> StateSnapshot:
    """The controller state from its tables' records (any backend's spelling; a table not read is empty).
    Raises ValueError on a record that does not decode: the caller fails the read closed."""
    def records(table: str) -> Iterable[Mapping[str, Any]]:
        return tables.get(table, ())

    def timed(record: Mapping[str, Any], *columns: str) -> dict[str, Any]:
        """The record with these time columns parsed (one a table's older spelling lacks reads as None)."""
        return {**record, **{column: parse_timestamp(record.get(column)) for column in columns}}

    try:
        return StateSnapshot(
            submissions=tuple(Submission(**timed(r, "created_at", "finished_at")) for r in records("evalrun_submissions")),
            tunnel_leases=tuple(TunnelLease(**timed(r, "leased_at")) for r in records("evalrun_tunnel_leases")),
            cell_owners=tuple(CellOwner(**timed(r, "renewed_at")) for r in records("evalrun_cell_owners")),
            cell_memory={r["cell_key"]: CellMemory.from_stored(parse_json(r["memory"]))
                         for r in records("evalrun_cell_memory")},
            quarantined=tuple(Quarantined(**timed(r, "until", "since")) for r in records("evalrun_quarantine")),
            gpu_history=tuple(AttemptCost(**r) for r in records("gpu_history")),
            retries=tuple(RetryRequest(**timed(r, "requested_at", "consumed_at"))
                          for r in records("evalrun_retry_requests")),
        )
    except ValidationError as error:
        raise ValueError(_first_line(error)) from None


def stored_metrics_are(stored: object, written: Iterable[Metric]) -> bool:
    """Does a stored metrics value (raw or decoded) hold exactly these metrics? Undecodable → no."""
    try:
        decoded = stored if isinstance(stored, tuple) else parse_metrics(stored)
    except ValueError:
        return False
    return same_metrics(decoded, written)


def already_uploaded(status: object, metrics: object, is_overlong: object, result: ResultUpload) -> bool:
    """upload_result's exactly-once test on the stored row: Finished with these metrics and this flag (null
    reads as false). Anything else, an undecodable flag included, is written."""
    try:
        same_flag = bool(parse_flag(is_overlong)) == result.is_overlong
    except ValueError:
        return False
    return status == RowStatus.FINISHED.value and same_flag and stored_metrics_are(metrics, result.metrics)


def check_owner(row_id: str, username: object, owner: str) -> None:
    """The contract's rule for every write to `sandbox_jobs`: only rows of our user."""
    if username != owner:
        raise WriteRefused(f"sandbox_jobs row {row_id} belongs to {username!r}, not {owner!r}: not written")


def _first_line(error: Exception) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
