"""The SQLite store's writes of a results row: the row, and the model and benchmark rows it names (reused by name,
as ResultsDB.create_row does, or registered when new)."""

from __future__ import annotations

import json
import sqlite3
import uuid
from datetime import datetime

from controller.adapters.store import sqlite_sql as sql
from controller.adapters.store.codec import format_timestamp, reused_id
from controller.adapters.store.sqlite_session import SqliteSession
from controller.core.records import NewRow


def insert_row(db: SqliteSession, conn: sqlite3.Connection, row: NewRow, at: datetime) -> None:
    """A new results row, naming its model and benchmark rows (made first where they are new)."""
    db.run(conn, sql.INSERT_ROW, {
        "id": row.id, "created_at": format_timestamp(at), "job_name": row.job_name, "username": row.username,
        "submitted_at": format_timestamp(row.submitted_at), "started_at": format_timestamp(row.started_at),
        "n_trials": row.n_trials, "n_rep_eval": row.n_rep_eval, "config": json.dumps(row.config),
        "model_id": _model_id(db, conn, row.model_name, row.username, at),
        "benchmark_id": _benchmark_id(db, conn, row.benchmark_name),
        "job_status": row.job_status.value, "slurm_job_id": row.slurm_job_id,
    })


def _model_id(db: SqliteSession, conn: sqlite3.Connection, name: str, created_by: str, at: datetime) -> str:
    """Reuse the model row of that name (ResultsDB.create_row says which); register the model if it is new."""
    found = reused_id(dict(record) for record in db.run(conn, sql.MODELS_NAMED, (name,)))
    if found is not None:
        return found
    model_id = str(uuid.uuid4())
    db.run(conn, sql.INSERT_MODEL, (model_id, name, created_by, format_timestamp(at)))
    return model_id


def _benchmark_id(db: SqliteSession, conn: sqlite3.Connection, name: str) -> str:
    found = reused_id(dict(record) for record in db.run(conn, sql.BENCHMARKS_NAMED, (name,)))
    if found is not None:
        return found
    benchmark_id = str(uuid.uuid4())
    db.run(conn, sql.INSERT_BENCHMARK, (benchmark_id, name))
    return benchmark_id
