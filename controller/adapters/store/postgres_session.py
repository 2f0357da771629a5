"""The PostgreSQL store's connection layer: a pool of live connections with our session settings (timeouts,
UTC, read-only), the schema set up under an advisory lock, statements pipelined in one round trip, and every
error as one line naming the store (never its password) and what to check.
"""

from __future__ import annotations

import math
import re
import select
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from importlib import resources
from typing import Any
from urllib.parse import unquote

import psycopg
from psycopg import errors
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.pq import TransactionStatus
from psycopg_pool import ConnectionPool, PoolTimeout

from controller.adapters.store import postgres_schema as schema
from controller.adapters.store.errors import StoreUnavailable, WriteRefused
from controller.core.ports import ObservationError
from controller.core.records import ResultsSnapshot

Params = Sequence[Any] | Mapping[str, Any] | None
Statement = tuple[str, Params]
Connection = psycopg.Connection[tuple[Any, ...]]

NO_RESULTS = ResultsSnapshot(models=(), benchmarks=(), rows=())
BEGIN_READ = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"  # one snapshot for every statement of a read
BEGIN = "BEGIN"
COMMIT = "COMMIT"
_CONTROL = frozenset((BEGIN_READ, BEGIN, COMMIT))
MIGRATION_FILE = re.compile(r"(\d{4})_(\w+)\.sql")



class PostgresSession:
    """One PostgreSQL database, through a small thread-safe connection pool: connections that are alive, one
    round trip per operation, the schema set up, every error as one line naming the store.

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
        self.present: frozenset[str] = frozenset()  # tables known to exist (they are never dropped)
        self._upgraded: set[str] = set()  # tables known to have schema.ADDED_COLUMNS (a reader may see a database without)
        try:
            self._conninfo = self._session_conninfo(dsn)
        except psycopg.ProgrammingError as error:
            raise StoreUnavailable(f"store {self.name}: not a valid PostgreSQL URL: {self._scrub(first_line(error))}"
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
                raise StoreUnavailable(self.line(error)) from None
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

    def close(self) -> None:
        self._pool.close()


    @contextmanager
    def reading(self) -> Iterator[Connection]:
        """A pooled connection for a read; any database error becomes ObservationError (one line)."""
        try:
            with self._connection() as conn:
                yield conn
        except psycopg.Error as error:
            raise ObservationError(self.line(error)) from None

    @contextmanager
    def writing(self) -> Iterator[Connection]:
        """A pooled connection for a write; any database error becomes StoreUnavailable (one line)."""
        if self.readonly:
            raise WriteRefused(f"store {self.name} is open read-only")
        try:
            with self._connection() as conn:
                yield conn
        except psycopg.Error as error:
            raise StoreUnavailable(self.line(error)) from None

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

    def round(self, conn: Connection, *statements: Statement) -> list[psycopg.Cursor[tuple[Any, ...]]]:
        """Send the statements together and wait once (a pipeline); their cursors hold the results."""
        with self._counter_lock:
            self.queries += sum(1 for text, _ in statements if text not in _CONTROL)
            self.round_trips += 1
        if len(statements) == 1:
            text, params = statements[0]
            return [conn.execute(text, params)]
        with conn.pipeline():
            return [conn.execute(text, params) for text, params in statements]

    def have(self, conn: Connection, tables: Sequence[str]) -> bool:
        """Do these tables exist? Only asked of the database while some are missing (a read-only store)."""
        if self.present.issuperset(tables):
            return True
        (cursor,) = self.round(conn, (schema.EXISTING_TABLES, (list(schema.OT_AGENT_TABLES + schema.OWN_TABLES),)))
        self.present = frozenset(name for (name,) in cursor)
        return self.present.issuperset(tables)

    def lacking_columns(self, conn: Connection, table: str) -> frozenset[str]:
        """The columns migrations add to `table` (schema.ADDED_COLUMNS) that have not reached this database. Asked
        only until they all have (columns are never dropped)."""
        if table in self._upgraded:
            return frozenset()
        added = schema.ADDED_COLUMNS[table]
        (cursor,) = self.round(conn, (schema.PRESENT_COLUMNS, {"table": table, "columns": list(added)}))
        lacking = frozenset(added) - {name for (name,) in cursor}
        if not lacking:
            self._upgraded.add(table)
        return lacking

    def _set_up(self, conn: Connection) -> None:
        """Create the missing OT-Agent tables and apply the missing migrations, under an advisory lock.

        Two processes opening a fresh database at once queue on the lock; the second finds everything done.
        Existing tables are not even named in a CREATE: the lab's user may lack CREATE on their schema.
        """
        with conn.transaction():
            conn.execute(schema.TAKE_SCHEMA_LOCK, (schema.SCHEMA_LOCK,))
            asked = [*schema.OT_AGENT_TABLES, schema.MIGRATIONS]
            tables = {name for (name,) in conn.execute(schema.EXISTING_TABLES, (asked,))}
            for table in schema.OT_AGENT_TABLES:
                if table not in tables:
                    conn.execute(schema.OT_AGENT_DDL[table])
            if schema.MIGRATIONS not in tables:
                conn.execute(schema.MIGRATIONS_TABLE)
            applied = {version for (version,) in conn.execute(schema.APPLIED_MIGRATIONS)}
            for version, name, text in migrations():
                if version not in applied:
                    conn.execute(text)
                    conn.execute(schema.RECORD_MIGRATION, (version, name))
        self.present = frozenset(schema.OT_AGENT_TABLES + schema.OWN_TABLES)
        self._upgraded = set(schema.ADDED_COLUMNS)

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

    def line(self, error: BaseException) -> str:
        """One line naming the store (no password), what went wrong, and what to check."""
        if isinstance(error, PoolTimeout):
            error = self._why_no_connection(error)
        text = self._scrub(first_line(error))
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


def first_line(error: BaseException | str) -> str:
    text = str(error).strip()
    return text.splitlines()[0].strip() if text else type(error).__name__


def _ms(seconds: float) -> int:
    return max(0, round(seconds * 1000))


def one(cursor: psycopg.Cursor[tuple[Any, ...]]) -> tuple[Any, ...]:
    record = cursor.fetchone()
    if record is None:
        raise psycopg.InterfaceError("the statement returned no row")
    return record


def dicts(cursor: psycopg.Cursor[tuple[Any, ...]]) -> list[dict[str, Any]]:
    names = [column.name for column in cursor.description or ()]
    return [dict(zip(names, record, strict=True)) for record in cursor.fetchall()]
