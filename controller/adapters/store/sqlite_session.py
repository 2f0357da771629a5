"""The SQLite store's connection layer: the file opened (WAL, schema, columns a file made by an earlier version
lacks), transactions, and every error as one line naming the file and what to check.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from controller.adapters.store import sqlite_schema as schema
from controller.adapters.store.errors import StoreUnavailable, WriteRefused
from controller.core.ports import ObservationError

MEMORY = ":memory:"


class SqliteSession:
    """One SQLite file: a writable store opens (and brings up to date) at once, a read-only one lazily.

    `queries` counts data statements executed (transaction control excluded).
    """

    def __init__(self, path: str, *, readonly: bool, busy_timeout_s: float) -> None:
        self.path = path
        self.readonly = readonly
        self.busy_timeout_s = busy_timeout_s
        self.queries = 0
        self._conn: sqlite3.Connection | None = None
        if not readonly:
            try:
                self._conn = _open_writable(path, busy_timeout_s)
            except (sqlite3.Error, OSError) as error:
                raise StoreUnavailable(self.line(error)) from None

    def connection(self) -> sqlite3.Connection | None:
        """Read-only connections open lazily: a missing file is an empty store until someone creates it."""
        if self._conn is None and self.readonly and self.path != MEMORY and Path(self.path).exists():
            if not Path(self.path).is_file():
                raise ObservationError(self.line(sqlite3.OperationalError("not a regular file")))
            try:
                self._conn = _connect(Path(self.path).absolute().as_uri() + "?mode=ro", self.busy_timeout_s, uri=True)
            except sqlite3.Error as error:
                raise ObservationError(self.line(error)) from None
        return self._conn

    @contextmanager
    def writing(self) -> Iterator[sqlite3.Connection]:
        """One write transaction; a database error becomes StoreUnavailable (one line, no traceback)."""
        if self.readonly or self._conn is None:
            raise WriteRefused(f"store {self.path} is open read-only")
        try:
            with transaction(self._conn, "IMMEDIATE"):
                yield self._conn
        except sqlite3.Error as error:
            raise StoreUnavailable(self.line(error)) from None

    def run(self, conn: sqlite3.Connection, statement: str, params: Any = ()) -> sqlite3.Cursor:
        self.queries += 1
        return conn.execute(statement, params)

    def tables(self, conn: sqlite3.Connection) -> set[str]:
        all_tables = as_json(schema.OT_AGENT_TABLES + schema.OWN_TABLES)
        return {name for (name,) in self.run(conn, schema.EXISTING_TABLES, (all_tables,))}

    def line(self, error: Exception) -> str:
        """One line that says what is wrong with the store file and what to check."""
        text = str(error)
        if "locked" in text or "busy" in text:
            hint = "another process holds a write lock; it is retried next pass"
        elif "not a database" in text or "malformed" in text:
            hint = "the file is not an evalctl/OT-Agent SQLite store; point --store at the right file"
        elif "readonly" in text or "unable to open" in text or "regular file" in text or isinstance(error, OSError):
            hint = "check that the file and its directory exist and are writable by this user"
        else:
            hint = "check the store file"
        return f"store {self.path}: {text} ({hint})"

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


@contextmanager
def transaction(conn: sqlite3.Connection, mode: str) -> Iterator[None]:
    conn.execute(f"BEGIN {mode}")
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def missing_columns(conn: sqlite3.Connection) -> dict[str, dict[str, str]]:
    """Table → the columns of ADDED_COLUMNS (name → type) it lacks: a file made by an earlier version."""
    missing = {}
    for table, columns in schema.ADDED_COLUMNS.items():
        present = {name for (name,) in conn.execute(schema.TABLE_COLUMNS, (table,))}
        if lacking := {name: kind for name, kind in columns.items() if name not in present}:
            missing[table] = lacking
    return missing


def as_json(values: Any) -> str:
    return json.dumps(list(values))


def _connect(target: str, busy_timeout_s: float, *, uri: bool = False) -> sqlite3.Connection:
    # isolation_level=None: we issue BEGIN/COMMIT ourselves; timeout is SQLite's busy_timeout.
    conn = sqlite3.connect(target, uri=uri, timeout=busy_timeout_s, isolation_level=None)
    conn.row_factory = sqlite3.Row
    return conn


def _open_writable(path: str, busy_timeout_s: float) -> sqlite3.Connection:
    """Open (creating the file and its directory), switch to WAL, and add missing tables idempotently."""
    if path != MEMORY:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        if Path(path).exists() and not Path(path).is_file():  # a FIFO would block the open for ever
            raise sqlite3.OperationalError("not a regular file")
    conn = _connect(path, busy_timeout_s)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.executescript(f"BEGIN IMMEDIATE;{schema.SCHEMA}COMMIT;")
        _add_columns(conn)
    except BaseException:
        conn.close()
        raise
    return conn


def _add_columns(conn: sqlite3.Connection) -> None:
    """Bring a file made by an earlier version up to date, in one write transaction: two processes opening it at
    once queue on the write lock, and the second finds nothing missing (ALTER TABLE has no IF NOT EXISTS)."""
    with transaction(conn, "IMMEDIATE"):
        for table, columns in missing_columns(conn).items():
            for name, kind in columns.items():
                conn.execute(f"ALTER TABLE {table} ADD COLUMN {name} {kind}")  # names from schema.ADDED_COLUMNS only
        conn.execute(schema.GPU_HISTORY_INDEX)
