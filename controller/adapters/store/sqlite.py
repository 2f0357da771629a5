"""The embedded store: one SQLite file, OT-Agent-compatible, safe for two processes at once.

WAL mode lets a reader (`evalctl plan`) and a writer (`reconcile`) share the file; every write
is one `BEGIN IMMEDIATE` transaction, so the intent (submission + Pending row) is durable as a
unit before anything runs. A read-only store never creates, converts or touches the file.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from os import PathLike
from typing import Any

from controller.adapters.store import sqlite_schema as schema
from controller.adapters.store import sqlite_sql as sql
from controller.adapters.store.codec import (
    already_uploaded,
    as_utc,
    audit_marks,
    check_owner,
    decode_families,
    decode_rows,
    episodes,
    format_metrics,
    format_timestamp,
    model_selections,
    notifications,
    registered_models,
    sandbox_job_row,
    state_snapshot,
)
from controller.adapters.store.sqlite_rows import insert_row
from controller.adapters.store.sqlite_session import SqliteSession, as_json, missing_columns, transaction
from controller.core.intake import RegisteredModel, Selection
from controller.core.notify import Fact, Notification, NotifyEvent, transitions
from controller.core.observed import RowStatus, Submission, TunnelLease
from controller.core.ports import GPU_HISTORY_MAX, ObservationError
from controller.core.records import NamedRow, NewRow, ResultsSnapshot, ResultUpload, RowAuditMark, SandboxJobRow, StateSnapshot
from controller.core.remedies import CellMemory, Quarantined, QuarantineKind
from controller.core.retry import RetryRequest
from controller.core.types import EvalRunRef

BUSY_TIMEOUT_S = 30.0
NO_RESULTS = ResultsSnapshot(models=(), benchmarks=(), rows=())


class SqliteStore:
    """Both halves of the store (`ResultsDB` and `ControllerState`) in one SQLite file (the connection: `SqliteSession`).

    `queries` counts data statements executed (transaction control excluded).
    """

    def __init__(self, path: str | PathLike[str], *, readonly: bool = False,
                 busy_timeout_s: float = BUSY_TIMEOUT_S) -> None:
        self._db = SqliteSession(str(path), readonly=readonly, busy_timeout_s=busy_timeout_s)
        self.path, self.readonly, self.busy_timeout_s = self._db.path, readonly, busy_timeout_s

    @property
    def queries(self) -> int:
        return self._db.queries

    # ----------------------------------------------------------------------- results DB: reads

    def read_results(self, model_names: list[str] | None, benchmark_names: list[str] | None) -> ResultsSnapshot:
        """Three statements in one read transaction, whatever the number of names.

        A store without the OT-Agent tables (a read-only store on a missing file) has no results yet.
        """
        conn = self._db.connection()
        if conn is None:
            return NO_RESULTS
        try:
            with transaction(conn, "DEFERRED"):
                if not self._db.tables(conn).issuperset(schema.OT_AGENT_TABLES):
                    return NO_RESULTS
                models, benchmarks = self._families(conn, model_names, benchmark_names)
                records = self._db.run(conn, sql.ROWS_IN_FAMILIES, {
                    "all_models": model_names is None, "model_ids": as_json(m.id for m in models),
                    "all_benchmarks": benchmark_names is None, "benchmark_ids": as_json(b.id for b in benchmarks),
                }).fetchall()
        except sqlite3.Error as error:
            raise ObservationError(self._db.line(error)) from error
        rows, undecodable = decode_rows(dict(record) for record in records)
        return ResultsSnapshot(models=models, benchmarks=benchmarks, rows=rows, undecodable=undecodable)

    def read_row(self, row_id: str) -> SandboxJobRow | None:
        conn = self._db.connection()
        if conn is None:
            return None
        try:
            record = self._db.run(conn, sql.ROW_BY_ID, (row_id,)).fetchone()
            return None if record is None else sandbox_job_row(dict(record))
        except (sqlite3.Error, ValueError) as error:
            raise ObservationError(f"store {self.path}: {error}") from error

    def read_models(self) -> tuple[RegisteredModel, ...]:
        conn = self._db.connection()
        if conn is None or "models" not in self._db.tables(conn):
            return ()
        try:
            return registered_models(dict(r) for r in self._db.run(conn, sql.REGISTERED_MODELS).fetchall())
        except sqlite3.Error as error:
            raise ObservationError(self._db.line(error)) from error

    # ----------------------------------------------------------------------- results DB: writes

    def create_row(self, row: NewRow) -> None:
        with self._db.writing() as conn:
            insert_row(self._db, conn, row, self._now())

    def update_row(self, row_id: str, *, owner: str, status: RowStatus | None = None,
                   started_at: datetime | None = None, slurm_job_id: str | None = None) -> None:
        with self._db.writing() as conn:
            changed = self._db.run(conn, sql.UPDATE_ROW, {
                "id": row_id, "owner": owner, "status": None if status is None else status.value,
                "started_at": format_timestamp(started_at), "slurm_job_id": slurm_job_id,
            }).rowcount
            if not changed:
                self._owned_row(conn, row_id, owner)  # raises unless the row is ours and simply further along

    def upload_result(self, row_id: str, result: ResultUpload, *, owner: str) -> bool:
        with self._db.writing() as conn:
            if already_uploaded(*self._owned_row(conn, row_id, owner), result):
                return False
            self._db.run(conn, sql.SET_ROW_RESULT, {
                "id": row_id, "owner": owner, "metrics": format_metrics(result.metrics),
                "stats": json.dumps(result.stats), "n_trials": result.n_trials,
                "ended_at": format_timestamp(result.ended_at), "is_overlong": int(result.is_overlong),
                "env": result.env,
            })
            return True

    # ----------------------------------------------------------------------- row audit marks (`evalctl db audit`)

    def read_audit_marks(self, row_ids: Sequence[str]) -> dict[str, RowAuditMark]:
        conn = self._db.connection()
        if conn is None or not row_ids or "evalrun_row_audit" not in self._db.tables(conn):
            return {}
        try:
            records = self._db.run(conn, sql.ROW_AUDITS, (as_json(row_ids),)).fetchall()
            return audit_marks(map(dict, records))
        except (sqlite3.Error, ValueError) as error:
            raise ObservationError(self._db.line(error)) from error

    def mark_rows(self, marks: Sequence[RowAuditMark]) -> None:
        """Our own table only: `sandbox_jobs` is not touched, whoever owns the rows."""
        now = format_timestamp(self._now())
        with self._db.writing() as conn:
            for mark in marks:
                self._db.run(conn, sql.PUT_ROW_AUDIT, {
                    "row_id": mark.row_id, "gate": mark.gate, "verdict": mark.verdict.value, "refusal": mark.refusal,
                    "reason": mark.reason, "now": now})

    # ----------------------------------------------------------------------- controller state

    def read_state(self, evalrun: EvalRunRef, cell_keys: list[str], owner_ttl_s: float,
                   benchmarks: Sequence[str] = ()) -> StateSnapshot:
        conn = self._db.connection()
        if conn is None:
            return StateSnapshot()
        now = self._now()
        named = {"evalrun": str(evalrun), "cell_keys": as_json(cell_keys), "now": format_timestamp(now),
                 "stale_before": format_timestamp(now - timedelta(seconds=owner_ttl_s)),
                 "benchmarks": as_json(benchmarks), "history_max": GPU_HISTORY_MAX}
        try:
            with transaction(conn, "DEFERRED"):
                tables = self._db.tables(conn)

                def select(table: str, statement: str, params: Any = ()) -> list[sqlite3.Row]:
                    return self._db.run(conn, statement, params).fetchall() if table in tables else []

                # a writable store upgraded the file when it opened it; a reader never alters it
                stale = missing_columns(conn) if self.readonly else {}
                lacking = stale.get("evalrun_submissions", {})
                submissions = select("evalrun_submissions",
                                     sql.SUBMISSIONS_OF.format(columns=sql.submission_columns(lacking)), named)
                history = select("evalrun_submissions", sql.gpu_history(lacking), named) \
                    if benchmarks and sql.GPU_HISTORY_COLUMNS.isdisjoint(lacking) else []
                owners = select("evalrun_cell_owners", sql.OWNERS_OF_CELLS, named)
                tunnels = select("evalrun_tunnel_leases", sql.TUNNEL_LEASES)
                memory = select("evalrun_cell_memory", sql.MEMORY_OF_CELLS, named)
                quarantined = select("evalrun_quarantine", _live_quarantines(stale), named)
                retries = select("evalrun_retry_requests", sql.RETRIES_OF_CELLS, named)
            return state_snapshot({
                "evalrun_submissions": map(dict, submissions), "evalrun_tunnel_leases": map(dict, tunnels),
                "evalrun_cell_owners": map(dict, owners), "evalrun_cell_memory": map(dict, memory),
                "evalrun_quarantine": map(dict, quarantined), "gpu_history": map(dict, history),
                "evalrun_retry_requests": map(dict, retries)})
        except (sqlite3.Error, ValueError) as error:
            raise ObservationError(self._db.line(error)) from error

    def read_inventory(self) -> StateSnapshot | None:
        conn = self._db.connection()
        if conn is None:
            return None
        try:
            with transaction(conn, "DEFERRED"):
                tables = self._db.tables(conn)
                if "evalrun_submissions" not in tables:
                    return None
                stale = missing_columns(conn) if self.readonly else {}
                every = sql.EVERY_SUBMISSION.format(columns=sql.submission_columns(stale.get("evalrun_submissions", {})))
                submissions = self._db.run(conn, every).fetchall()
                memory = self._db.run(conn, sql.EVERY_MEMORY).fetchall() if "evalrun_cell_memory" in tables else []
            return state_snapshot({"evalrun_submissions": map(dict, submissions),
                                   "evalrun_cell_memory": map(dict, memory)})
        except (sqlite3.Error, ValueError) as error:
            raise ObservationError(self._db.line(error)) from error

    def live_quarantines(self) -> tuple[Quarantined, ...]:
        conn = self._db.connection()
        if conn is None or "evalrun_quarantine" not in self._db.tables(conn):
            return ()
        try:
            stale = missing_columns(conn) if self.readonly else {}
            records = self._db.run(conn, _live_quarantines(stale), {"now": format_timestamp(self._now())}).fetchall()
            return state_snapshot({"evalrun_quarantine": map(dict, records)}).quarantined
        except (sqlite3.Error, ValueError) as error:
            raise ObservationError(self._db.line(error)) from error

    def read_memories(self, cell_keys: Sequence[str]) -> dict[str, CellMemory]:
        conn = self._db.connection()
        if conn is None:
            return {}
        try:
            if "evalrun_cell_memory" not in self._db.tables(conn):
                return {}
            records = self._db.run(conn, sql.MEMORY_OF_CELLS, {"cell_keys": as_json(cell_keys)}).fetchall()
            return state_snapshot({"evalrun_cell_memory": map(dict, records)}).cell_memory
        except (sqlite3.Error, ValueError) as error:
            raise ObservationError(self._db.line(error)) from error

    def read_selections(self, evalrun: EvalRunRef) -> tuple[Selection, ...]:
        conn = self._db.connection()
        if conn is None:
            return ()
        try:
            if "evalrun_model_selections" not in self._db.tables(conn):
                return ()
            return model_selections(dict(r) for r in self._db.run(conn, sql.MODEL_SELECTIONS, (str(evalrun),)))
        except (sqlite3.Error, ValueError) as error:
            raise ObservationError(self._db.line(error)) from error

    def record_selections(self, evalrun: EvalRunRef, selections: Sequence[Selection]) -> None:
        with self._db.writing() as conn:
            for selection in selections:
                self._db.run(conn, sql.RECORD_SELECTION, (str(evalrun), selection.model, selection.rule,
                                                          format_timestamp(selection.selected_at)))

    def record_submission(self, submission: Submission) -> None:
        with self._db.writing() as conn:
            recorded = self._db.run(conn, sql.INSERT_SUBMISSION, _submission_params(submission)).rowcount
            if recorded and submission.fire == 1:
                self._db.run(conn, sql.CONSUME_RETRIES, {
                    "name": submission.name, "attempt": submission.attempt, "cell_key": submission.cell_key,
                    "now": format_timestamp(self._now())})

    def request_retry(self, request: RetryRequest) -> bool:
        with self._db.writing() as conn:
            return bool(self._db.run(conn, sql.INSERT_RETRY, {
                **request.model_dump(include={"id", "cell_key", "requested_by", "reason"}),
                "evalrun": str(request.evalrun), "requested_at": format_timestamp(request.requested_at)}).rowcount)

    def record_job_id(self, submission_name: str, job_id: str) -> None:
        with self._db.writing() as conn:
            self._db.run(conn, sql.SET_SUBMISSION_JOB_ID, (job_id, submission_name))

    def record_job_end(self, submission_name: str, gpu_hours: float | None, elapsed_hours: float | None) -> None:
        with self._db.writing() as conn:
            self._db.run(conn, sql.SET_SUBMISSION_JOB_END, (gpu_hours, elapsed_hours, submission_name))

    def finish_attempt(self, run_tag: str) -> None:
        with self._db.writing() as conn:
            self._db.run(conn, sql.FINISH_ATTEMPT, (format_timestamp(self._now()), run_tag))

    def remember(self, cell_key: str, memory: CellMemory) -> None:
        with self._db.writing() as conn:
            self._db.run(conn, sql.PUT_MEMORY, (cell_key, json.dumps(memory.stored()), format_timestamp(self._now())))

    def quarantine(self, kind: QuarantineKind, scope: str, name: str, reason: str, ttl_s: float,
                   owner: str = "") -> bool:
        """One upsert (this host's clock is the DB's)."""
        now = self._now()
        with self._db.writing() as conn:
            return bool(self._db.run(conn, sql.PUT_QUARANTINE, {
                "kind": QuarantineKind(kind).value, "scope": scope, "name": name, "reason": reason, "owner": owner,
                "now": format_timestamp(now), "until": format_timestamp(now + timedelta(seconds=ttl_s))}).rowcount)

    def release_quarantine(self, kind: QuarantineKind, scope: str, name: str) -> bool:
        with self._db.writing() as conn:
            return bool(self._db.run(conn, sql.RELEASE_QUARANTINE, {
                "kind": QuarantineKind(kind).value, "scope": scope, "name": name,
                "now": format_timestamp(self._now())}).rowcount)

    # ----------------------------------------------------------------------- leases (this host's clock is the DB's)

    def try_lease(self, name: str, holder: str, ttl_s: float) -> bool:
        """Take a free or expired lease, or renew our own; read and write under one write lock."""
        with self._db.writing() as conn:
            now = self._now()
            current = self._db.run(conn, sql.LEASE_BY_NAME, (name,)).fetchone()
            held_by_other = current is not None and current["holder"] != holder
            if held_by_other and as_utc(datetime.fromisoformat(current["expires_at"])) > now:
                return False
            self._db.run(conn, sql.PUT_LEASE, (name, holder, format_timestamp(now + timedelta(seconds=ttl_s))))
            return True

    def lease_holder(self, name: str) -> str | None:
        with self._db.writing() as conn:
            current = self._db.run(conn, sql.LEASE_BY_NAME, (name,)).fetchone()
        if current is None or as_utc(datetime.fromisoformat(current["expires_at"])) <= self._now():
            return None
        return str(current["holder"])

    def release_lease(self, name: str, holder: str) -> None:
        """Only the holder's own lease is dropped; releasing twice is a no-op."""
        with self._db.writing() as conn:
            self._db.run(conn, sql.DELETE_LEASE, (name, holder))

    def claim_cells(self, evalrun: EvalRunRef, cell_keys: list[str], ttl_s: float) -> dict[str, EvalRunRef]:
        now = self._now()
        named = {"evalrun": str(evalrun), "cell_keys": as_json(cell_keys), "now": format_timestamp(now),
                 "stale_before": format_timestamp(now - timedelta(seconds=ttl_s))}
        with self._db.writing() as conn:
            self._db.run(conn, sql.CLAIM_CELLS, named)
            self._db.run(conn, sql.DROP_UNNAMED_CLAIMS, named)
            owners = self._db.run(conn, sql.OWNERS_OF_CELLS, named).fetchall()
        return {record["cell_key"]: EvalRunRef.parse(record["evalrun"]) for record in owners}

    # ----------------------------------------------------------------------- pinggy tunnel leases

    def take_tunnel(self, lease: TunnelLease) -> bool:
        """Insert-if-free and read back under one write lock: two reconcilers never both get a pair."""
        with self._db.writing() as conn:
            self._db.run(conn, sql.TAKE_TUNNEL, (lease.pair, lease.holder, str(lease.evalrun),
                                                 format_timestamp(lease.leased_at)))
            (holder,) = self._db.run(conn, sql.TUNNEL_HOLDER, (lease.pair,)).fetchone()
        return bool(holder == lease.holder)

    def release_tunnel(self, pair: str, holder: str) -> None:
        with self._db.writing() as conn:
            self._db.run(conn, sql.DELETE_TUNNEL, (pair, holder))

    # ----------------------------------------------------------------------- notifications (this host's clock is the DB's)

    def record_transitions(self, evalrun: EvalRunRef, facts: Sequence[Fact],
                           webhooks: Mapping[NotifyEvent, Sequence[str]]) -> tuple[Notification, ...]:
        """Read the episodes, write the changes and queue the messages under one write lock."""
        now = format_timestamp(self._now())
        with self._db.writing() as conn:
            recorded = episodes(map(dict, self._db.run(conn, sql.EPISODES_OF_EVALRUN, (str(evalrun),))))
            changed, queued = transitions(evalrun, recorded, facts, webhooks)
            for episode in changed:
                self._db.run(conn, sql.PUT_EPISODE, (str(evalrun), episode.subject, episode.event.value,
                                                     episode.episode, episode.active, now))
            for message in queued:
                self._db.run(conn, sql.QUEUE_NOTIFICATION, {
                    "id": message.id, "evalrun": str(evalrun), "webhook": message.webhook,
                    "subject": message.fact.subject, "label": message.fact.label, "event": message.fact.event.value,
                    "episode": message.episode, "detail": message.fact.detail, "now": now})
            records = self._db.run(conn, sql.UNDELIVERED_NOTIFICATIONS, (str(evalrun),)).fetchall()
        return _notifications(self.path, records)

    def read_notifications(self, evalrun: EvalRunRef) -> tuple[Notification, ...]:
        conn = self._db.connection()
        if conn is None or "evalrun_notifications" not in self._db.tables(conn):
            return ()
        try:
            records = self._db.run(conn, sql.UNDELIVERED_NOTIFICATIONS, (str(evalrun),)).fetchall()
        except sqlite3.Error as error:
            raise ObservationError(self._db.line(error)) from error
        return _notifications(self.path, records)

    def claim_notification(self, notification_id: str, holder: str, claim_s: float, *,
                           take_from: str | None = None) -> bool:
        now = self._now()
        with self._db.writing() as conn:
            return bool(self._db.run(conn, sql.CLAIM_NOTIFICATION, {
                "id": notification_id, "holder": holder, "take_from": take_from, "now": format_timestamp(now),
                "until": format_timestamp(now + timedelta(seconds=claim_s))}).rowcount)

    def finish_notification(self, notification_id: str, holder: str, *, delivered: bool, error: str = "",
                            retry_in_s: float | None = None) -> None:
        now = self._now()
        with self._db.writing() as conn:
            if delivered:
                self._db.run(conn, sql.NOTIFICATION_DELIVERED,
                             {"id": notification_id, "holder": holder, "now": format_timestamp(now)})
                return
            self._db.run(conn, sql.NOTIFICATION_FAILED, {
                "id": notification_id, "holder": holder, "now": format_timestamp(now), "error": error,
                "give_up": retry_in_s is None,
                "next": format_timestamp(now + timedelta(seconds=retry_in_s or 0))})

    def close(self) -> None:
        self._db.close()

    # ----------------------------------------------------------------------- internals

    @staticmethod
    def _now() -> datetime:
        """The embedded database's clock is this host's."""
        return datetime.now(UTC)

    def _families(
        self, conn: sqlite3.Connection, model_names: list[str] | None, benchmark_names: list[str] | None
    ) -> tuple[tuple[NamedRow, ...], tuple[NamedRow, ...]]:
        records = self._db.run(conn, sql.FAMILIES, {
            "models": None if model_names is None else as_json(model_names),
            "benchmarks": None if benchmark_names is None else as_json(benchmark_names),
        }).fetchall()
        return decode_families(records)

    def _owned_row(self, conn: sqlite3.Connection, row_id: str, owner: str) -> tuple[object, object, object]:
        """The row's job_status, stored metrics and is_overlong, after checking it exists and is `owner`'s."""
        found = self._db.run(conn, sql.ROW_OWNER_AND_STATUS, (row_id,)).fetchone()
        if found is None:
            raise LookupError(f"sandbox_jobs row {row_id} does not exist")
        username, status, metrics, is_overlong = found
        check_owner(row_id, username, owner)
        return status, metrics, is_overlong


def _live_quarantines(stale: Mapping[str, object]) -> str:
    """What reads the quarantines in force: without what a file made before since/owner lacks, for a reader of one."""
    return sql.LEGACY_LIVE_QUARANTINES if "evalrun_quarantine" in stale else sql.LIVE_QUARANTINES


def _notifications(path: str, records: Sequence[sqlite3.Row]) -> tuple[Notification, ...]:
    try:
        return notifications(map(dict, records))
    except ValueError as error:
        raise ObservationError(f"store {path}: notifications: {error}") from None


def _submission_params(submission: Submission) -> dict[str, Any]:
    return {**submission.model_dump(), "created_at": format_timestamp(submission.created_at)}
