"""The shared store: both halves (`ResultsDB` and `ControllerState`) in one PostgreSQL database.

A lab server, or a Supabase project's direct connection. Many reconcilers (CLI runs, the kopf operator's
threads) use it at once, so every rule is kept by the database: ownership and forward-only status are part
of each UPDATE, expiry of leases and claims is decided by the server's clock, and each operation is one
transaction. Statements of one operation go out in one pipeline (one round trip), whatever the number
of names. The OT-Agent tables are the lab's: created only where absent, never altered; the reconciler's
own tables come from versioned migrations applied under an advisory lock.
"""

from __future__ import annotations

import math
import re
import select
import threading
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from datetime import datetime
from importlib import resources
from typing import Any
from urllib.parse import unquote

import psycopg
from psycopg import errors
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.pq import TransactionStatus
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool, PoolTimeout

from controller.adapters.store import postgres_sql as sql
from controller.adapters.store.codec import (
    already_uploaded,
    audit_marks,
    check_owner,
    decode_families,
    decode_rows,
    episodes,
    model_selections,
    notifications,
    registered_models,
    sandbox_job_row,
    state_snapshot,
)
from controller.adapters.store.errors import StoreUnavailable, WriteRefused
from controller.core.intake import RegisteredModel, Selection
from controller.core.notify import Fact, Notification, NotifyEvent, transitions
from controller.core.observed import RowStatus, Submission, TunnelLease
from controller.core.ports import GPU_HISTORY_MAX, ObservationError
from controller.core.records import NewRow, ResultsSnapshot, ResultUpload, RowAuditMark, SandboxJobRow, StateSnapshot
from controller.core.remedies import CellMemory, Quarantined, QuarantineKind
from controller.core.types import EvalRunRef

Params = Sequence[Any] | Mapping[str, Any] | None
Statement = tuple[str, Params]
Connection = psycopg.Connection[tuple[Any, ...]]

NO_RESULTS = ResultsSnapshot(models=(), benchmarks=(), rows=())
BEGIN_READ = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"  # one snapshot for every statement of a read
BEGIN = "BEGIN"
COMMIT = "COMMIT"
_CONTROL = frozenset((BEGIN_READ, BEGIN, COMMIT))
MIGRATION_FILE = re.compile(r"(\d{4})_(\w+)\.sql")


class PostgresStore:
    """Both halves of the store in one PostgreSQL database, through a small thread-safe connection pool.

    `queries` counts data statements executed (transaction control and schema set-up excluded) and
    `round_trips` the batches sent and awaited (a pipelined transaction counts once), so a bench can
    check that a pass costs the same whatever the number of names. `name` is the store without its password.
    """

    def __init__(self, dsn: str, *, readonly: bool = False, statement_timeout_s: float = 30.0,
                 connect_timeout_s: float = 5.0, pool_max: int = 4) -> None:
        self.name = describe(dsn)
        self.readonly = readonly
        self.statement_timeout_s = statement_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.pool_max = pool_max
        self.queries = 0
        self.round_trips = 0
        self._secrets = _secrets(dsn)
        self._counter_lock = threading.Lock()
        self._present: frozenset[str] = frozenset()  # tables known to exist (they are never dropped)
        self._upgraded: set[str] = set()  # tables known to have sql.ADDED_COLUMNS (a reader may see a database without)
        try:
            self._conninfo = self._session_conninfo(dsn)
        except psycopg.ProgrammingError as error:
            raise StoreUnavailable(f"store {self.name}: not a valid PostgreSQL URL: {self._scrub(_first_line(error))}"
                                   " (expected postgresql://user[:password]@host[:port]/database)") from None
        # A writable store sets the schema up on one direct connection first: a server that is down or refuses
        # us fails here within connect_timeout_s, with libpq's own reason (a pool would only say it timed out).
        # A read-only store opens lazily, like SQLite's: a server that is down fails its reads (cells Unknown,
        # with the reason), not its opening.
        if not readonly:
            try:
                with psycopg.connect(self._conninfo, autocommit=True, prepare_threshold=None) as conn:
                    self._set_up(conn)
            except psycopg.Error as error:
                raise StoreUnavailable(self._line(error)) from None
        self._pool: ConnectionPool[Connection] = ConnectionPool(
            self._conninfo,
            # prepare_threshold=None: no server-side prepared statements, which poolers (pgbouncer, Supabase's
            # transaction pooler) cannot keep across connections.
            kwargs={"autocommit": True, "prepare_threshold": None},
            min_size=1,
            max_size=max(1, pool_max),
            open=True,
            name=f"evalctl {self.name}",
            timeout=connect_timeout_s,
            # Give up reconnecting after this long: the next operation starts a fresh attempt at once instead
            # of waiting out an exponential backoff grown during a long outage.
            reconnect_timeout=max(connect_timeout_s, 1.0),
        )

    # ----------------------------------------------------------------------- results DB: reads

    def read_results(self, model_names: list[str] | None, benchmark_names: list[str] | None) -> ResultsSnapshot:
        """Two statements (families, rows) in one read-only snapshot and one round trip, whatever the number of names.

        A database without the OT-Agent tables (seen read-only) has no results yet.
        """
        named = {
            "all_models": model_names is None, "models": list(model_names or ()),
            "all_benchmarks": benchmark_names is None, "benchmarks": list(benchmark_names or ()),
        }
        with self._reading() as conn:
            if not self._have(conn, sql.OT_AGENT_TABLES):
                return NO_RESULTS
            _, families, rows, _ = self._round(
                conn, (BEGIN_READ, None), (sql.FAMILIES, named), (sql.ROWS_IN_FAMILIES, named), (COMMIT, None))
            family_records, row_records = families.fetchall(), _dicts(rows)
        models, benchmarks = decode_families(family_records)
        decoded, undecodable = decode_rows(row_records)
        return ResultsSnapshot(models=models, benchmarks=benchmarks, rows=decoded, undecodable=undecodable)

    def read_models(self) -> tuple[RegisteredModel, ...]:
        with self._reading() as conn:
            if not self._have(conn, ("models",)):
                return ()
            (cursor,) = self._round(conn, (sql.REGISTERED_MODELS, None))
            return registered_models(_dicts(cursor))

    def read_row(self, row_id: str) -> SandboxJobRow | None:
        with self._reading() as conn:
            if not self._have(conn, ("sandbox_jobs",)):
                return None
            try:
                (cursor,) = self._round(conn, (sql.ROW_BY_ID, (row_id,)))
            except errors.InvalidTextRepresentation:  # not a uuid, in a table of uuids: no such row
                return None
            records = _dicts(cursor)
            try:
                return sandbox_job_row(records[0]) if records else None
            except ValueError as error:
                raise ObservationError(f"store {self.name}: {error}") from None

    # ----------------------------------------------------------------------- results DB: writes

    def create_row(self, row: NewRow) -> None:
        """Look up or register the model and benchmark, then insert the row unless its id exists: one transaction."""
        params = {
            "id": row.id, "job_name": row.job_name, "username": row.username,
            "submitted_at": row.submitted_at, "started_at": row.started_at,
            "n_trials": row.n_trials, "n_rep_eval": row.n_rep_eval, "config": Jsonb(row.config),
            "job_status": row.job_status.value, "slurm_job_id": row.slurm_job_id,
            "model_name": row.model_name, "new_model_id": str(uuid.uuid4()),
            "benchmark_name": row.benchmark_name, "new_benchmark_id": str(uuid.uuid4()),
        }
        with self._writing() as conn:
            self._round(conn, (BEGIN, None), (sql.TAKE_SCHEMA_LOCK, (sql.REGISTRY_LOCK,)), (sql.CREATE_ROW, params),
                        (COMMIT, None))

    def update_row(self, row_id: str, *, owner: str, status: RowStatus | None = None,
                   started_at: datetime | None = None, slurm_job_id: str | None = None) -> None:
        """One statement: the guarded UPDATE, and the row as it was, to tell "not ours" from "already further"."""
        params = {"id": row_id, "owner": owner, "status": None if status is None else status.value,
                  "started_at": started_at, "slurm_job_id": slurm_job_id}
        with self._writing() as conn:
            try:
                (cursor,) = self._round(conn, (sql.UPDATE_ROW, params))
            except errors.InvalidTextRepresentation:
                raise LookupError(f"sandbox_jobs row {row_id} does not exist (not a uuid)") from None
            changed, found, username, _ = _one(cursor)
        if changed:
            return
        if not found:
            raise LookupError(f"sandbox_jobs row {row_id} does not exist")
        check_owner(row_id, username, owner)  # ours and already further along: nothing to do

    def upload_result(self, row_id: str, result: ResultUpload, *, owner: str) -> bool:
        """Lock the row, compare, write: the exactly-once check and the write see the same row."""
        with self._writing() as conn:
            try:
                _, cursor = self._round(conn, (BEGIN, None), (sql.ROW_FOR_UPLOAD, (row_id,)))
                found = cursor.fetchone()
            except errors.InvalidTextRepresentation:
                found = None
            if found is None:
                raise LookupError(f"sandbox_jobs row {row_id} does not exist")
            username, status, metrics, is_overlong = found
            check_owner(row_id, username, owner)
            if already_uploaded(status, metrics, is_overlong, result):
                self._round(conn, (COMMIT, None))
                return False
            self._round(conn, (sql.SET_ROW_RESULT, {
                "id": row_id, "owner": owner, "n_trials": result.n_trials, "ended_at": result.ended_at,
                "is_overlong": result.is_overlong,
                "metrics": Jsonb([{"name": metric.name, "value": metric.value} for metric in result.metrics]),
                "stats": Jsonb(result.stats),
            }), (COMMIT, None))
            return True

    # ----------------------------------------------------------------------- row audit marks (`evalctl db audit`)

    def read_audit_marks(self, row_ids: Sequence[str]) -> dict[str, RowAuditMark]:
        """One statement; a database migration 0006 has not reached (a reader's) has no marks."""
        if not row_ids:
            return {}
        with self._reading() as conn:
            if not self._have(conn, ("evalrun_row_audit",)):
                return {}
            (cursor,) = self._round(conn, (sql.ROW_AUDITS, (list(row_ids),)))
            records = _dicts(cursor)
        try:
            return audit_marks(records)
        except ValueError as error:
            raise ObservationError(f"store {self.name}: row audit marks: {_first_line(error)}") from None

    def mark_rows(self, marks: Sequence[RowAuditMark]) -> None:
        """One statement, whatever the number of rows; our own table only, never `sandbox_jobs`."""
        if not marks:
            return
        with self._writing() as conn:
            self._round(conn, (sql.PUT_ROW_AUDITS, {
                "row_ids": [m.row_id for m in marks], "gates": [m.gate for m in marks],
                "verdicts": [m.verdict.value for m in marks], "refusals": [m.refusal for m in marks],
                "reasons": [m.reason for m in marks]}))

    # ----------------------------------------------------------------------- controller state

    def read_state(self, evalrun: EvalRunRef, cell_keys: list[str], owner_ttl_s: float,
                   benchmarks: Sequence[str] = ()) -> StateSnapshot:
        """Up to six statements in one read-only snapshot and one round trip; a table not created yet is empty."""
        named = {"evalrun": str(evalrun), "cell_keys": list(cell_keys), "owner_ttl_s": float(owner_ttl_s),
                 "benchmarks": list(benchmarks), "history_max": GPU_HISTORY_MAX}
        wanted = {
            "evalrun_submissions": sql.SUBMISSIONS_OF_EVALRUN_AND_CELLS,
            "evalrun_cell_owners": sql.LIVE_OWNERS_OF_CELLS,
            "evalrun_tunnel_leases": sql.TUNNEL_LEASES,
            "evalrun_cell_memory": sql.MEMORY_OF_CELLS,
            "evalrun_quarantine": sql.LIVE_QUARANTINES,
        }
        with self._reading() as conn:
            self._have(conn, tuple(wanted))
            tables = [table for table in wanted if table in self._present]
            if "evalrun_quarantine" in tables and not self._has_added_columns(conn, "evalrun_quarantine"):
                wanted["evalrun_quarantine"] = sql.LEGACY_LIVE_QUARANTINES
            if "evalrun_submissions" in tables and not self._has_added_columns(conn, "evalrun_submissions"):
                wanted["evalrun_submissions"] = sql.LEGACY_SUBMISSIONS_OF_EVALRUN_AND_CELLS
            elif "evalrun_submissions" in tables and benchmarks:
                wanted["gpu_history"] = sql.GPU_HISTORY
                tables.append("gpu_history")
            if not tables:
                return StateSnapshot()
            cursors = self._round(conn, (BEGIN_READ, None),
                                  *((wanted[table], named) for table in tables), (COMMIT, None))[1:-1]
            found = {table: _dicts(cursor) for table, cursor in zip(tables, cursors, strict=True)}
            try:
                return state_snapshot(found)
            except ValueError as error:
                raise ObservationError(f"store {self.name}: controller state: {_first_line(error)}") from None

    def live_quarantines(self) -> tuple[Quarantined, ...]:
        with self._reading() as conn:
            if not self._have(conn, ("evalrun_quarantine",)):
                return ()
            statement = sql.LIVE_QUARANTINES if self._has_added_columns(conn, "evalrun_quarantine") \
                else sql.LEGACY_LIVE_QUARANTINES
            (cursor,) = self._round(conn, (statement, None))
            records = _dicts(cursor)
        try:
            return state_snapshot({"evalrun_quarantine": records}).quarantined
        except ValueError as error:
            raise ObservationError(f"store {self.name}: quarantines: {_first_line(error)}") from None

    def read_selections(self, evalrun: EvalRunRef) -> tuple[Selection, ...]:
        with self._reading() as conn:
            if not self._have(conn, ("evalrun_model_selections",)):
                return ()
            (cursor,) = self._round(conn, (sql.MODEL_SELECTIONS, (str(evalrun),)))
            records = _dicts(cursor)
        try:
            return model_selections(records)
        except ValueError as error:
            raise ObservationError(f"store {self.name}: model selections: {_first_line(error)}") from None

    def record_selections(self, evalrun: EvalRunRef, selections: Sequence[Selection]) -> None:
        """One statement, whatever the number of models."""
        with self._writing() as conn:
            self._round(conn, (sql.RECORD_SELECTION, {
                "evalrun": str(evalrun), "models": [s.model for s in selections],
                "rules": [s.rule for s in selections], "times": [s.selected_at for s in selections]}))

    def record_submission(self, submission: Submission) -> None:
        with self._writing() as conn:
            self._round(conn, (sql.INSERT_SUBMISSION, submission.model_dump()))

    def record_job_id(self, submission_name: str, job_id: str) -> None:
        with self._writing() as conn:
            self._round(conn, (sql.SET_SUBMISSION_JOB_ID, (job_id, submission_name)))

    def record_gpu_hours(self, submission_name: str, gpu_hours: float) -> None:
        with self._writing() as conn:
            self._round(conn, (sql.SET_SUBMISSION_GPU_HOURS, (gpu_hours, submission_name)))

    def finish_attempt(self, run_tag: str) -> None:
        """Its finish time is the server's clock, like every time the state decides by."""
        with self._writing() as conn:
            self._round(conn, (sql.FINISH_ATTEMPT, (run_tag,)))

    def remember(self, cell_key: str, memory: CellMemory) -> None:
        with self._writing() as conn:
            self._round(conn, (sql.PUT_MEMORY, (cell_key, Jsonb(memory.stored()))))

    def quarantine(self, kind: QuarantineKind, scope: str, name: str, reason: str, ttl_s: float,
                   owner: str = "") -> bool:
        """One upsert; its start and end are the server's clock, so skewed clients agree on them."""
        with self._writing() as conn:
            (cursor,) = self._round(conn, (sql.PUT_QUARANTINE, {
                "kind": QuarantineKind(kind).value, "scope": scope, "name": name, "reason": reason,
                "ttl_s": float(ttl_s), "owner": owner}))
            return cursor.fetchone() is not None

    def release_quarantine(self, kind: QuarantineKind, scope: str, name: str) -> bool:
        with self._writing() as conn:
            (cursor,) = self._round(conn, (sql.RELEASE_QUARANTINE, {"kind": QuarantineKind(kind).value,
                                                                    "scope": scope, "name": name}))
            return cursor.fetchone() is not None

    def claim_cells(self, evalrun: EvalRunRef, cell_keys: list[str], ttl_s: float) -> dict[str, EvalRunRef]:
        """Claim, drop the claims no longer named, read the owners back: one transaction, one round trip."""
        named = {"evalrun": str(evalrun), "cell_keys": list(cell_keys), "ttl_s": float(ttl_s)}
        with self._writing() as conn:
            owners = self._round(conn, (BEGIN, None), (sql.CLAIM_CELLS, named), (sql.DROP_UNNAMED_CLAIMS, named),
                                 (sql.OWNERS_OF_CELLS, named), (COMMIT, None))[3].fetchall()
        return {cell_key: EvalRunRef.parse(owner) for cell_key, owner in owners}

    # ----------------------------------------------------------------------- act-leases (the server's clock)

    def try_lease(self, name: str, holder: str, ttl_s: float) -> bool:
        """One upsert that only takes a free or expired lease, or renews our own."""
        with self._writing() as conn:
            (cursor,) = self._round(conn, (sql.TRY_LEASE, {"name": name, "holder": holder, "ttl_s": float(ttl_s)}))
            return cursor.fetchone() is not None

    def lease_holder(self, name: str) -> str | None:
        """A read (ObservationError when the server cannot be read); an unrecorded table means no holder."""
        with self._reading() as conn:
            if not self._have(conn, ("evalrun_leases",)):
                return None
            (cursor,) = self._round(conn, (sql.LEASE_HOLDER, (name,)))
            found = cursor.fetchone()
        return None if found is None else str(found[0])

    def release_lease(self, name: str, holder: str) -> None:
        """Only the holder's own lease is dropped; releasing twice is a no-op."""
        with self._writing() as conn:
            self._round(conn, (sql.DELETE_LEASE, (name, holder)))

    # ----------------------------------------------------------------------- pinggy tunnel leases

    def take_tunnel(self, lease: TunnelLease) -> bool:
        """Insert-if-free, then read the holder back (a fresh snapshot sees a rival's committed lease)."""
        with self._writing() as conn:
            holder = self._round(conn, (BEGIN, None),
                                 (sql.TAKE_TUNNEL, (lease.pair, lease.holder, str(lease.evalrun), lease.leased_at)),
                                 (sql.TUNNEL_HOLDER, (lease.pair,)), (COMMIT, None))[2].fetchone()
        return holder is not None and holder[0] == lease.holder

    def release_tunnel(self, pair: str, holder: str) -> None:
        with self._writing() as conn:
            self._round(conn, (sql.DELETE_TUNNEL, (pair, holder)))

    # ----------------------------------------------------------------------- notifications (the server's clock)

    def record_transitions(self, evalrun: EvalRunRef, facts: Sequence[Fact],
                           webhooks: Mapping[NotifyEvent, Sequence[str]]) -> tuple[Notification, ...]:
        """Two round trips in one transaction, under the EvalRun's advisory lock: read the episodes; then write the
        changes, queue the messages and read the undelivered ones back."""
        name = str(evalrun)
        with self._writing() as conn:
            recorded = self._round(conn, (BEGIN, None), (sql.LOCK_EVALRUN_NOTIFICATIONS, (sql.NOTIFY_LOCK, name)),
                                   (sql.EPISODES_OF_EVALRUN, (name,)))[2]
            changed, queued = transitions(evalrun, episodes(_dicts(recorded)), facts, webhooks)
            statements: list[Statement] = []
            if changed:
                statements.append((sql.PUT_EPISODES, {
                    "evalrun": name, "subjects": [e.subject for e in changed],
                    "events": [e.event.value for e in changed], "episodes": [e.episode for e in changed],
                    "active": [e.active for e in changed]}))
            if queued:
                statements.append((sql.QUEUE_NOTIFICATIONS, {
                    "evalrun": name, "ids": [q.id for q in queued], "webhooks": [q.webhook for q in queued],
                    "subjects": [q.fact.subject for q in queued], "labels": [q.fact.label for q in queued],
                    "events": [q.fact.event.value for q in queued], "episodes": [q.episode for q in queued],
                    "details": [q.fact.detail for q in queued]}))
            undelivered = self._round(conn, *statements, (sql.UNDELIVERED_NOTIFICATIONS, (name,)),
                                      (COMMIT, None))[-2]
            return self._notifications(_dicts(undelivered))

    def read_notifications(self, evalrun: EvalRunRef) -> tuple[Notification, ...]:
        with self._reading() as conn:
            if not self._have(conn, ("evalrun_notifications",)):
                return ()
            (cursor,) = self._round(conn, (sql.UNDELIVERED_NOTIFICATIONS, (str(evalrun),)))
            return self._notifications(_dicts(cursor))

    def claim_notification(self, notification_id: str, holder: str, claim_s: float, *,
                           take_from: str | None = None) -> bool:
        with self._writing() as conn:
            (cursor,) = self._round(conn, (sql.CLAIM_NOTIFICATION, {
                "id": notification_id, "holder": holder, "claim_s": float(claim_s), "take_from": take_from}))
            return cursor.fetchone() is not None

    def finish_notification(self, notification_id: str, holder: str, *, delivered: bool, error: str = "",
                            retry_in_s: float | None = None) -> None:
        with self._writing() as conn:
            if delivered:
                self._round(conn, (sql.NOTIFICATION_DELIVERED, {"id": notification_id, "holder": holder}))
            else:
                self._round(conn, (sql.NOTIFICATION_FAILED, {
                    "id": notification_id, "holder": holder, "error": error, "give_up": retry_in_s is None,
                    "retry_s": float(retry_in_s or 0)}))

    def _notifications(self, records: list[dict[str, Any]]) -> tuple[Notification, ...]:
        try:
            return notifications(records)
        except ValueError as error:
            raise ObservationError(f"store {self.name}: notifications: {_first_line(error)}") from None

    def close(self) -> None:
        self._pool.close()

    # ----------------------------------------------------------------------- internals: sessions and errors

    @contextmanager
    def _reading(self) -> Iterator[Connection]:
        """A pooled connection for a read; any database error becomes ObservationError (one line)."""
        try:
            with self._connection() as conn:
                yield conn
        except psycopg.Error as error:
            raise ObservationError(self._line(error)) from None

    @contextmanager
    def _writing(self) -> Iterator[Connection]:
        """A pooled connection for a write; any database error becomes StoreUnavailable (one line)."""
        if self.readonly:
            raise WriteRefused(f"store {self.name} is open read-only")
        try:
            with self._connection() as conn:
                yield conn
        except psycopg.Error as error:
            raise StoreUnavailable(self._line(error)) from None

    @contextmanager
    def _connection(self) -> Iterator[Connection]:
        """A live pooled connection, rolled back if the caller fails mid-transaction (before the pool sees it)."""
        conn = self._live_connection()
        try:
            yield conn
        except BaseException:
            if conn.info.transaction_status in (TransactionStatus.INTRANS, TransactionStatus.INERROR):
                with suppress(psycopg.Error):
                    conn.rollback()
            raise
        finally:
            self._pool.putconn(conn)

    def _live_connection(self) -> Connection:
        """Skip idle connections the server has closed (restart, idle timeout), without a round trip.

        An idle connection has nothing to read; a readable socket means the server said goodbye or hung up.
        Such a connection is closed and handed back (the pool replaces it), so the caller's first statement
        after a server restart does not fail on a dead connection.
        """
        for _ in range(self.pool_max + 1):
            conn = self._pool.getconn()
            if _usable(conn):
                return conn
            with suppress(psycopg.Error, OSError):
                conn.close()
            self._pool.putconn(conn)
        return self._pool.getconn()

    def _round(self, conn: Connection, *statements: Statement) -> list[psycopg.Cursor[tuple[Any, ...]]]:
        """Send the statements together and wait once (a pipeline); their cursors hold the results."""
        with self._counter_lock:
            self.queries += sum(1 for text, _ in statements if text not in _CONTROL)
            self.round_trips += 1
        if len(statements) == 1:
            text, params = statements[0]
            return [conn.execute(text, params)]
        with conn.pipeline():
            return [conn.execute(text, params) for text, params in statements]

    def _have(self, conn: Connection, tables: Sequence[str]) -> bool:
        """Do these tables exist? Only asked of the database while some are missing (a read-only store)."""
        if self._present.issuperset(tables):
            return True
        (cursor,) = self._round(conn, (sql.EXISTING_TABLES, (list(sql.OT_AGENT_TABLES + sql.OWN_TABLES),)))
        self._present = frozenset(name for (name,) in cursor)
        return self._present.issuperset(tables)

    def _has_added_columns(self, conn: Connection, table: str) -> bool:
        """Have the migrations that add columns to `table` (sql.ADDED_COLUMNS) reached this database? Asked only
        until they have (columns are never dropped)."""
        if table not in self._upgraded:
            (cursor,) = self._round(conn, (sql.HAS_COLUMNS, {"table": table, "columns": list(sql.ADDED_COLUMNS[table])}))
            if _one(cursor)[0]:
                self._upgraded.add(table)
        return table in self._upgraded

    def _set_up(self, conn: Connection) -> None:
        """Create the missing OT-Agent tables and apply the missing migrations, under an advisory lock.

        Two processes opening a fresh database at once queue on the lock; the second finds everything done.
        Existing tables are not even named in a CREATE: the lab's user may lack CREATE on their schema.
        """
        with conn.transaction():
            conn.execute(sql.TAKE_SCHEMA_LOCK, (sql.SCHEMA_LOCK,))
            asked = [*sql.OT_AGENT_TABLES, sql.MIGRATIONS]
            tables = {name for (name,) in conn.execute(sql.EXISTING_TABLES, (asked,))}
            for table in sql.OT_AGENT_TABLES:
                if table not in tables:
                    conn.execute(sql.OT_AGENT_DDL[table])
            if sql.MIGRATIONS not in tables:
                conn.execute(sql.MIGRATIONS_TABLE)
            applied = {version for (version,) in conn.execute(sql.APPLIED_MIGRATIONS)}
            for version, name, text in migrations():
                if version not in applied:
                    conn.execute(text)
                    conn.execute(sql.RECORD_MIGRATION, (version, name))
        self._present = frozenset(sql.OT_AGENT_TABLES + sql.OWN_TABLES)
        self._upgraded = set(sql.ADDED_COLUMNS)

    def _session_conninfo(self, dsn: str) -> str:
        """The DSN plus our session settings: timeouts, UTC (timestamps read as text), read-only if asked."""
        given = conninfo_to_dict(dsn)
        # A client that hangs inside a transaction must not hold row locks for ever (but a slow one between two
        # round trips of one operation is not killed: at least 10 s).
        idle_s = max(self.statement_timeout_s, 10.0) if self.statement_timeout_s > 0 else 0.0
        settings = [f"-c statement_timeout={_ms(self.statement_timeout_s)}",
                    f"-c idle_in_transaction_session_timeout={_ms(idle_s)}", "-c TimeZone=UTC"]
        if self.readonly:
            settings.append("-c default_transaction_read_only=on")
        options = " ".join(settings)
        if given.get("options"):  # the user's own settings come first; ours win where they overlap
            options = f"{given['options']} {options}"
        # libpq counts whole seconds (and at least 2)
        return make_conninfo(dsn, options=options, connect_timeout=max(1, math.ceil(self.connect_timeout_s)),
                             application_name=str(given.get("application_name") or "evalctl"))

    def _line(self, error: BaseException) -> str:
        """One line naming the store (no password), what went wrong, and what to check."""
        if isinstance(error, PoolTimeout):
            error = self._why_no_connection(error)
        text = self._scrub(_first_line(error))
        return f"store {self.name}: {text} ({_hint(error, text, self.pool_max)})"

    def _why_no_connection(self, timeout: PoolTimeout) -> BaseException:
        """The pool only says it waited; one direct attempt tells "server down" from "every connection busy"."""
        try:
            with psycopg.connect(self._conninfo, autocommit=True):
                return timeout
        except psycopg.Error as error:
            return error

    def _scrub(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text


# --------------------------------------------------------------------------- helpers


def migrations() -> list[tuple[int, str, str]]:
    """(version, name, SQL) of every `migrations/NNNN_name.sql`, in version order."""
    found: dict[int, tuple[int, str, str]] = {}
    for entry in (resources.files("controller.adapters.store") / "migrations").iterdir():
        if match := MIGRATION_FILE.fullmatch(entry.name):
            version = int(match[1])
            if version in found:
                raise RuntimeError(f"two migrations with version {version}: {found[version][1]}, {match[2]}")
            found[version] = (version, match[2], entry.read_text(encoding="utf-8"))
    return [found[version] for version in sorted(found)]


def describe(dsn: str) -> str:
    """The store as a URL without its password, for messages and logs (URL or key=value DSN alike)."""
    try:
        given = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "postgresql://(unparsable URL)"
    user = f"{given['user']}@" if given.get("user") else ""
    port = f":{given['port']}" if given.get("port") else ""
    return f"postgresql://{user}{given.get('host') or given.get('hostaddr') or 'localhost'}{port}/{given.get('dbname') or ''}"


def _secrets(dsn: str) -> list[str]:
    """Every spelling of the DSN's password, longest first, to scrub from any message."""
    found = set()
    with suppress(psycopg.ProgrammingError):
        if password := conninfo_to_dict(dsn).get("password"):
            found.add(str(password))
    if match := re.search(r"://[^/@]*?:([^/@]*)@", dsn):
        found.update((match[1], unquote(match[1])))
    if match := re.search(r"\bpassword\s*=\s*('(?:[^'\\]|\\.)*'|\S+)", dsn):
        found.update((match[1], match[1].strip("'")))
    return sorted((secret for secret in found if secret), key=len, reverse=True)


def _usable(conn: Connection) -> bool:
    if conn.closed or conn.info.transaction_status != TransactionStatus.IDLE:
        return False
    try:
        poller = select.poll()  # not select.select: a busy process may have descriptors above FD_SETSIZE
        poller.register(conn.fileno(), select.POLLIN | select.POLLPRI)
        return not poller.poll(0)
    except (OSError, ValueError, psycopg.Error):
        return False


def _hint(error: BaseException, text: str, pool_max: int) -> str:
    lowered = text.lower()
    if isinstance(error, PoolTimeout):
        return f"all {pool_max} pooled connections stayed busy; retried next pass"
    if isinstance(error, errors.QueryCanceled):
        return "a statement ran past statement_timeout_s, e.g. waiting for a lock another session holds; retried next pass"
    if isinstance(error, errors.DeadlockDetected | errors.LockNotAvailable | errors.SerializationFailure):
        return "contention with another writer; retried next pass"
    if isinstance(error, errors.InsufficientPrivilege):
        return "the user lacks a privilege on these tables; creating the controller's tables needs CREATE on the schema"
    if isinstance(error, psycopg.DataError):
        return "a value does not fit its column (ids of the OT-Agent tables are uuids in Supabase)"
    if isinstance(error, errors.UndefinedTable):
        return "a table is missing: open the store once without read-only to create the controller's tables"
    if "password" in lowered or "pg_hba.conf" in lowered or ("role" in lowered and "does not exist" in lowered):
        return "check the user and password (in the URL or ~/.pgpass) and the server's pg_hba.conf"
    if "database" in lowered and "does not exist" in lowered:
        return "create the database or fix its name in the URL"
    if isinstance(error, errors.AdminShutdown | errors.CrashShutdown | errors.CannotConnectNow) \
            or "terminating connection" in lowered or "closed the connection" in lowered or "shutting down" in lowered:
        return "the server went away (restart or shutdown); the store reconnects on a later pass"
    if isinstance(error, psycopg.OperationalError):
        return "is the server running and reachable? check host and port in the URL, and the network"
    return "check the server log"


def _first_line(error: BaseException | str) -> str:
    text = str(error).strip()
    return text.splitlines()[0].strip() if text else type(error).__name__


def _ms(seconds: float) -> int:
    return max(0, round(seconds * 1000))


def _one(cursor: psycopg.Cursor[tuple[Any, ...]]) -> tuple[Any, ...]:
    record = cursor.fetchone()
    if record is None:
        raise psycopg.InterfaceError("the statement returned no row")
    return record


def _dicts(cursor: psycopg.Cursor[tuple[Any, ...]]) -> list[dict[str, Any]]:
    names = [column.name for column in cursor.description or ()]
    return [dict(zip(names, record, strict=True)) for record in cursor.fetchall()]
