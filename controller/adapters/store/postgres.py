"""The shared store: both halves (`ResultsDB` and `ControllerState`) in one PostgreSQL database.

A lab server, or a Supabase project's direct connection. Many reconcilers (CLI runs, the kopf operator's
threads) use it at once, so every rule is kept by the database: ownership and forward-only status are part
of each UPDATE, expiry of leases and claims is decided by the server's clock, and each operation is one
transaction. Statements of one operation go out in one pipeline (one round trip), whatever the number
of names. The OT-Agent tables are the lab's: created only where absent, never altered; the reconciler's
own tables come from versioned migrations applied under an advisory lock.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from psycopg import errors
from psycopg.types.json import Jsonb

from controller.adapters.store import postgres_schema as schema
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
from controller.adapters.store.postgres_session import (
    BEGIN,
    BEGIN_READ,
    COMMIT,
    NO_RESULTS,
    PostgresSession,
    Statement,
    dicts,
    first_line,
    one,
)
from controller.core.intake import RegisteredModel, Selection
from controller.core.notify import Fact, Notification, NotifyEvent, transitions
from controller.core.observed import RowStatus, Submission, TunnelLease
from controller.core.ports import GPU_HISTORY_MAX, ObservationError
from controller.core.records import NewRow, ResultsSnapshot, ResultUpload, RowAuditMark, SandboxJobRow, StateSnapshot
from controller.core.remedies import CellMemory, Quarantined, QuarantineKind
from controller.core.retry import RetryRequest
from controller.core.types import EvalRunRef


class PostgresStore:
    """Both halves of the store in one PostgreSQL database (the connections: `PostgresSession`).

    `queries` counts data statements executed (transaction control and schema set-up excluded) and
    `round_trips` the batches sent and awaited (a pipelined transaction counts once), so a bench can
    check that a pass costs the same whatever the number of names. `name` is the store without its password.
    """

    def __init__(self, dsn: str, *, readonly: bool = False, statement_timeout_s: float = 30.0,
                 connect_timeout_s: float = 5.0, pool_max: int = 4) -> None:
        self._db = PostgresSession(dsn, readonly=readonly, statement_timeout_s=statement_timeout_s,
                                   connect_timeout_s=connect_timeout_s, pool_max=pool_max)
        self.name, self.readonly = self._db.name, readonly

    @property
    def queries(self) -> int:
        return self._db.queries

    @property
    def round_trips(self) -> int:
        return self._db.round_trips

    # ----------------------------------------------------------------------- results DB: reads

    def read_results(self, model_names: list[str] | None, benchmark_names: list[str] | None) -> ResultsSnapshot:
        """Two statements (families, rows) in one read-only snapshot and one round trip, whatever the number of names.

        A database without the OT-Agent tables (seen read-only) has no results yet.
        """
        named = {
            "all_models": model_names is None, "models": list(model_names or ()),
            "all_benchmarks": benchmark_names is None, "benchmarks": list(benchmark_names or ()),
        }
        with self._db.reading() as conn:
            if not self._db.have(conn, schema.OT_AGENT_TABLES):
                return NO_RESULTS
            _, families, rows, _ = self._db.round(
                conn, (BEGIN_READ, None), (sql.FAMILIES, named), (sql.ROWS_IN_FAMILIES, named), (COMMIT, None))
            family_records, row_records = families.fetchall(), dicts(rows)
        models, benchmarks = decode_families(family_records)
        decoded, undecodable = decode_rows(row_records)
        return ResultsSnapshot(models=models, benchmarks=benchmarks, rows=decoded, undecodable=undecodable)

    def read_models(self) -> tuple[RegisteredModel, ...]:
        with self._db.reading() as conn:
            if not self._db.have(conn, ("models",)):
                return ()
            (cursor,) = self._db.round(conn, (sql.REGISTERED_MODELS, None))
            return registered_models(dicts(cursor))

    def read_row(self, row_id: str) -> SandboxJobRow | None:
        with self._db.reading() as conn:
            if not self._db.have(conn, ("sandbox_jobs",)):
                return None
            try:
                (cursor,) = self._db.round(conn, (sql.ROW_BY_ID, (row_id,)))
            except errors.InvalidTextRepresentation:  # not a uuid, in a table of uuids: no such row
                return None
            records = dicts(cursor)
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
        with self._db.writing() as conn:
            self._db.round(conn, (BEGIN, None), (schema.TAKE_SCHEMA_LOCK, (sql.REGISTRY_LOCK,)), (sql.CREATE_ROW, params),
                        (COMMIT, None))

    def update_row(self, row_id: str, *, owner: str, status: RowStatus | None = None,
                   started_at: datetime | None = None, slurm_job_id: str | None = None) -> None:
        """One statement: the guarded UPDATE, and the row as it was, to tell "not ours" from "already further"."""
        params = {"id": row_id, "owner": owner, "status": None if status is None else status.value,
                  "started_at": started_at, "slurm_job_id": slurm_job_id}
        with self._db.writing() as conn:
            try:
                (cursor,) = self._db.round(conn, (sql.UPDATE_ROW, params))
            except errors.InvalidTextRepresentation:
                raise LookupError(f"sandbox_jobs row {row_id} does not exist (not a uuid)") from None
            changed, found, username, _ = one(cursor)
        if changed:
            return
        if not found:
            raise LookupError(f"sandbox_jobs row {row_id} does not exist")
        check_owner(row_id, username, owner)  # ours and already further along: nothing to do

    def upload_result(self, row_id: str, result: ResultUpload, *, owner: str) -> bool:
        """Lock the row, compare, write: the exactly-once check and the write see the same row."""
        with self._db.writing() as conn:
            try:
                _, cursor = self._db.round(conn, (BEGIN, None), (sql.ROW_FOR_UPLOAD, (row_id,)))
                found = cursor.fetchone()
            except errors.InvalidTextRepresentation:
                found = None
            if found is None:
                raise LookupError(f"sandbox_jobs row {row_id} does not exist")
            username, status, metrics, is_overlong = found
            check_owner(row_id, username, owner)
            if already_uploaded(status, metrics, is_overlong, result):
                self._db.round(conn, (COMMIT, None))
                return False
            self._db.round(conn, (sql.SET_ROW_RESULT, {
                "id": row_id, "owner": owner, "n_trials": result.n_trials, "ended_at": result.ended_at,
                "is_overlong": result.is_overlong, "env": result.env,
                "metrics": Jsonb([{"name": metric.name, "value": metric.value} for metric in result.metrics]),
                "stats": Jsonb(result.stats),
            }), (COMMIT, None))
            return True

    # ----------------------------------------------------------------------- row audit marks (`evalctl db audit`)

    def read_audit_marks(self, row_ids: Sequence[str]) -> dict[str, RowAuditMark]:
        """One statement; a database migration 0006 has not reached (a reader's) has no marks."""
        if not row_ids:
            return {}
        with self._db.reading() as conn:
            if not self._db.have(conn, ("evalrun_row_audit",)):
                return {}
            (cursor,) = self._db.round(conn, (sql.ROW_AUDITS, (list(row_ids),)))
            records = dicts(cursor)
        try:
            return audit_marks(records)
        except ValueError as error:
            raise ObservationError(f"store {self.name}: row audit marks: {first_line(error)}") from None

    def mark_rows(self, marks: Sequence[RowAuditMark]) -> None:
        """One statement, whatever the number of rows; our own table only, never `sandbox_jobs`."""
        if not marks:
            return
        with self._db.writing() as conn:
            self._db.round(conn, (sql.PUT_ROW_AUDITS, {
                "row_ids": [m.row_id for m in marks], "gates": [m.gate for m in marks],
                "verdicts": [m.verdict.value for m in marks], "refusals": [m.refusal for m in marks],
                "reasons": [m.reason for m in marks]}))

    # ----------------------------------------------------------------------- controller state

    def read_state(self, evalrun: EvalRunRef, cell_keys: list[str], owner_ttl_s: float,
                   benchmarks: Sequence[str] = ()) -> StateSnapshot:
        """Up to seven statements in one read-only snapshot and one round trip; a table not created yet is empty."""
        named = {"evalrun": str(evalrun), "cell_keys": list(cell_keys), "owner_ttl_s": float(owner_ttl_s),
                 "benchmarks": list(benchmarks), "history_max": GPU_HISTORY_MAX}
        wanted = {
            "evalrun_submissions": sql.SUBMISSIONS_OF.format(columns=sql.SUBMISSION_COLUMNS),
            "evalrun_cell_owners": sql.LIVE_OWNERS_OF_CELLS,
            "evalrun_tunnel_leases": sql.TUNNEL_LEASES,
            "evalrun_cell_memory": sql.MEMORY_OF_CELLS,
            "evalrun_quarantine": sql.LIVE_QUARANTINES,
            "evalrun_retry_requests": sql.RETRIES_OF_CELLS,
        }
        with self._db.reading() as conn:
            self._db.have(conn, tuple(wanted))
            tables = [table for table in wanted if table in self._db.present]
            if "evalrun_quarantine" in tables and self._db.lacking_columns(conn, "evalrun_quarantine"):
                wanted["evalrun_quarantine"] = sql.LEGACY_LIVE_QUARANTINES
            if "evalrun_submissions" in tables:
                lacking = self._db.lacking_columns(conn, "evalrun_submissions")
                wanted["evalrun_submissions"] = sql.SUBMISSIONS_OF.format(columns=sql.submission_columns(lacking))
                if benchmarks and sql.GPU_HISTORY_COLUMNS.isdisjoint(lacking):
                    wanted["gpu_history"] = sql.gpu_history(lacking)
                    tables.append("gpu_history")
            if not tables:
                return StateSnapshot()
            cursors = self._db.round(conn, (BEGIN_READ, None),
                                  *((wanted[table], named) for table in tables), (COMMIT, None))[1:-1]
            found = {table: dicts(cursor) for table, cursor in zip(tables, cursors, strict=True)}
            try:
                return state_snapshot(found)
            except ValueError as error:
                raise ObservationError(f"store {self.name}: controller state: {first_line(error)}") from None

    def read_inventory(self) -> StateSnapshot | None:
        with self._db.reading() as conn:
            self._db.have(conn, ("evalrun_submissions", "evalrun_cell_memory"))
            if "evalrun_submissions" not in self._db.present:
                return None
            lacking = self._db.lacking_columns(conn, "evalrun_submissions")
            wanted = {"evalrun_submissions": sql.EVERY_SUBMISSION.format(columns=sql.submission_columns(lacking)),
                      "evalrun_cell_memory": sql.EVERY_MEMORY}
            tables = [table for table in wanted if table in self._db.present]
            cursors = self._db.round(conn, (BEGIN_READ, None), *((wanted[table], None) for table in tables),
                                     (COMMIT, None))[1:-1]
            found = {table: dicts(cursor) for table, cursor in zip(tables, cursors, strict=True)}
        try:
            return state_snapshot(found)
        except ValueError as error:
            raise ObservationError(f"store {self.name}: controller state: {first_line(error)}") from None

    def live_quarantines(self) -> tuple[Quarantined, ...]:
        with self._db.reading() as conn:
            if not self._db.have(conn, ("evalrun_quarantine",)):
                return ()
            statement = sql.LEGACY_LIVE_QUARANTINES if self._db.lacking_columns(conn, "evalrun_quarantine") \
                else sql.LIVE_QUARANTINES
            (cursor,) = self._db.round(conn, (statement, None))
            records = dicts(cursor)
        try:
            return state_snapshot({"evalrun_quarantine": records}).quarantined
        except ValueError as error:
            raise ObservationError(f"store {self.name}: quarantines: {first_line(error)}") from None

    def read_memories(self, cell_keys: Sequence[str]) -> dict[str, CellMemory]:
        with self._db.reading() as conn:
            if not self._db.have(conn, ("evalrun_cell_memory",)):
                return {}
            (cursor,) = self._db.round(conn, (sql.MEMORY_OF_CELLS, {"cell_keys": list(cell_keys)}))
            records = dicts(cursor)
        try:
            return state_snapshot({"evalrun_cell_memory": records}).cell_memory
        except ValueError as error:
            raise ObservationError(f"store {self.name}: cell memory: {first_line(error)}") from None

    def read_selections(self, evalrun: EvalRunRef) -> tuple[Selection, ...]:
        with self._db.reading() as conn:
            if not self._db.have(conn, ("evalrun_model_selections",)):
                return ()
            (cursor,) = self._db.round(conn, (sql.MODEL_SELECTIONS, (str(evalrun),)))
            records = dicts(cursor)
        try:
            return model_selections(records)
        except ValueError as error:
            raise ObservationError(f"store {self.name}: model selections: {first_line(error)}") from None

    def record_selections(self, evalrun: EvalRunRef, selections: Sequence[Selection]) -> None:
        """One statement, whatever the number of models."""
        with self._db.writing() as conn:
            self._db.round(conn, (sql.RECORD_SELECTION, {
                "evalrun": str(evalrun), "models": [s.model for s in selections],
                "rules": [s.rule for s in selections], "times": [s.selected_at for s in selections]}))

    def record_submission(self, submission: Submission) -> None:
        """One statement: the intent, and the retry requests a new attempt consumes (RULES §13)."""
        with self._db.writing() as conn:
            self._db.round(conn, (sql.INSERT_SUBMISSION_CONSUMING_RETRIES, submission.model_dump()))

    def request_retry(self, request: RetryRequest) -> bool:
        with self._db.writing() as conn:
            (cursor,) = self._db.round(conn, (sql.INSERT_RETRY, {**request.model_dump(include={
                "id", "cell_key", "requested_by", "requested_at", "reason"}), "evalrun": str(request.evalrun)}))
            return cursor.rowcount > 0

    def record_job_id(self, submission_name: str, job_id: str) -> None:
        with self._db.writing() as conn:
            self._db.round(conn, (sql.SET_SUBMISSION_JOB_ID, (job_id, submission_name)))

    def record_job_end(self, submission_name: str, gpu_hours: float | None, elapsed_hours: float | None) -> None:
        with self._db.writing() as conn:
            self._db.round(conn, (sql.SET_SUBMISSION_JOB_END, (gpu_hours, elapsed_hours, submission_name)))

    def finish_attempt(self, run_tag: str) -> None:
        """Its finish time is the server's clock, like every time the state decides by."""
        with self._db.writing() as conn:
            self._db.round(conn, (sql.FINISH_ATTEMPT, (run_tag,)))

    def remember(self, cell_key: str, memory: CellMemory) -> None:
        with self._db.writing() as conn:
            self._db.round(conn, (sql.PUT_MEMORY, (cell_key, Jsonb(memory.stored()))))

    def quarantine(self, kind: QuarantineKind, scope: str, name: str, reason: str, ttl_s: float,
                   owner: str = "") -> bool:
        """One upsert; its start and end are the server's clock, so skewed clients agree on them."""
        with self._db.writing() as conn:
            (cursor,) = self._db.round(conn, (sql.PUT_QUARANTINE, {
                "kind": QuarantineKind(kind).value, "scope": scope, "name": name, "reason": reason,
                "ttl_s": float(ttl_s), "owner": owner}))
            return cursor.fetchone() is not None

    def release_quarantine(self, kind: QuarantineKind, scope: str, name: str) -> bool:
        with self._db.writing() as conn:
            (cursor,) = self._db.round(conn, (sql.RELEASE_QUARANTINE, {"kind": QuarantineKind(kind).value,
                                                                    "scope": scope, "name": name}))
            return cursor.fetchone() is not None

    def claim_cells(self, evalrun: EvalRunRef, cell_keys: list[str], ttl_s: float) -> dict[str, EvalRunRef]:
        """Claim, drop the claims no longer named, read the owners back: one transaction, one round trip."""
        named = {"evalrun": str(evalrun), "cell_keys": list(cell_keys), "ttl_s": float(ttl_s)}
        with self._db.writing() as conn:
            owners = self._db.round(conn, (BEGIN, None), (sql.CLAIM_CELLS, named), (sql.DROP_UNNAMED_CLAIMS, named),
                                 (sql.OWNERS_OF_CELLS, named), (COMMIT, None))[3].fetchall()
        return {cell_key: EvalRunRef.parse(owner) for cell_key, owner in owners}

    # ----------------------------------------------------------------------- act-leases (the server's clock)

    def try_lease(self, name: str, holder: str, ttl_s: float) -> bool:
        """One upsert that only takes a free or expired lease, or renews our own."""
        with self._db.writing() as conn:
            (cursor,) = self._db.round(conn, (sql.TRY_LEASE, {"name": name, "holder": holder, "ttl_s": float(ttl_s)}))
            return cursor.fetchone() is not None

    def lease_holder(self, name: str) -> str | None:
        """A read (ObservationError when the server cannot be read); an unrecorded table means no holder."""
        with self._db.reading() as conn:
            if not self._db.have(conn, ("evalrun_leases",)):
                return None
            (cursor,) = self._db.round(conn, (sql.LEASE_HOLDER, (name,)))
            found = cursor.fetchone()
        return None if found is None else str(found[0])

    def release_lease(self, name: str, holder: str) -> None:
        """Only the holder's own lease is dropped; releasing twice is a no-op."""
        with self._db.writing() as conn:
            self._db.round(conn, (sql.DELETE_LEASE, (name, holder)))

    # ----------------------------------------------------------------------- pinggy tunnel leases

    def take_tunnel(self, lease: TunnelLease) -> bool:
        """Insert-if-free, then read the holder back (a fresh snapshot sees a rival's committed lease)."""
        with self._db.writing() as conn:
            holder = self._db.round(conn, (BEGIN, None),
                                 (sql.TAKE_TUNNEL, (lease.pair, lease.holder, str(lease.evalrun), lease.leased_at)),
                                 (sql.TUNNEL_HOLDER, (lease.pair,)), (COMMIT, None))[2].fetchone()
        return holder is not None and holder[0] == lease.holder

    def release_tunnel(self, pair: str, holder: str) -> None:
        with self._db.writing() as conn:
            self._db.round(conn, (sql.DELETE_TUNNEL, (pair, holder)))

    # ----------------------------------------------------------------------- notifications (the server's clock)

    def record_transitions(self, evalrun: EvalRunRef, facts: Sequence[Fact],
                           webhooks: Mapping[NotifyEvent, Sequence[str]]) -> tuple[Notification, ...]:
        """Two round trips in one transaction, under the EvalRun's advisory lock: read the episodes; then write the
        changes, queue the messages and read the undelivered ones back."""
        name = str(evalrun)
        with self._db.writing() as conn:
            recorded = self._db.round(conn, (BEGIN, None), (sql.LOCK_EVALRUN_NOTIFICATIONS, (sql.NOTIFY_LOCK, name)),
                                   (sql.EPISODES_OF_EVALRUN, (name,)))[2]
            changed, queued = transitions(evalrun, episodes(dicts(recorded)), facts, webhooks)
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
            undelivered = self._db.round(conn, *statements, (sql.UNDELIVERED_NOTIFICATIONS, (name,)),
                                      (COMMIT, None))[-2]
            return self._notifications(dicts(undelivered))

    def read_notifications(self, evalrun: EvalRunRef) -> tuple[Notification, ...]:
        with self._db.reading() as conn:
            if not self._db.have(conn, ("evalrun_notifications",)):
                return ()
            (cursor,) = self._db.round(conn, (sql.UNDELIVERED_NOTIFICATIONS, (str(evalrun),)))
            return self._notifications(dicts(cursor))

    def claim_notification(self, notification_id: str, holder: str, claim_s: float, *,
                           take_from: str | None = None) -> bool:
        with self._db.writing() as conn:
            (cursor,) = self._db.round(conn, (sql.CLAIM_NOTIFICATION, {
                "id": notification_id, "holder": holder, "claim_s": float(claim_s), "take_from": take_from}))
            return cursor.fetchone() is not None

    def finish_notification(self, notification_id: str, holder: str, *, delivered: bool, error: str = "",
                            retry_in_s: float | None = None) -> None:
        with self._db.writing() as conn:
            if delivered:
                self._db.round(conn, (sql.NOTIFICATION_DELIVERED, {"id": notification_id, "holder": holder}))
            else:
                self._db.round(conn, (sql.NOTIFICATION_FAILED, {
                    "id": notification_id, "holder": holder, "error": error, "give_up": retry_in_s is None,
                    "retry_s": float(retry_in_s or 0)}))

    def _notifications(self, records: list[dict[str, Any]]) -> tuple[Notification, ...]:
        try:
            return notifications(records)
        except ValueError as error:
            raise ObservationError(f"store {self.name}: notifications: {first_line(error)}") from None

    def close(self) -> None:
        self._db.close()
