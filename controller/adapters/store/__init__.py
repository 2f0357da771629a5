"""Store backends behind URLs: the results DB (`--store`) and, optionally elsewhere, the controller state (`--state`).

- `sqlite:///rel.db`, `sqlite:////abs.db`, `sqlite:///:memory:`: both halves in one embedded file;
- `postgresql://user:pass@host:port/db` (or `postgres://`): both halves in one PostgreSQL database;
- `supabase://project.supabase.co` (`supabase+http://host:port` for a local stand-in): the results DB only,
  through PostgREST with the key from `$SUPABASE_SERVICE_KEY`; the controller state then lives at `--state`
  (default `sqlite:///.evalctl/state.db`). Supabase users may also point `postgresql://` at their project's
  direct connection and keep everything in one place.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from controller.adapters.store.sqlite import BUSY_TIMEOUT_S, SqliteStore
from controller.core.ports import ResultsDB, SqlBackend
from controller.core.store import Store

SQLITE_PREFIX = "sqlite:///"
POSTGRES_SCHEMES = ("postgresql://", "postgres://")
SUPABASE_SCHEMES = ("supabase://", "supabase+http://")
DEFAULT_STATE_FOR_SUPABASE = "sqlite:///.evalctl/state.db"


class UnsupportedStoreURL(ValueError):
    """The store URL names no backend, or one that cannot hold what is asked of it; the CLI exits 2."""


def open_store(url: str, *, state_url: str | None = None, readonly: bool = False,
               busy_timeout_s: float = BUSY_TIMEOUT_S, env: Mapping[str, str] | None = None) -> Store:
    """Open the results DB at `url` and the controller state at `state_url` (default: the same place, or
    a local SQLite file when `url` is Supabase, which holds only the lab's tables).

    `busy_timeout_s`: how long a SQLite write waits for another process's lock before the store counts as
    unavailable.
    """
    env = os.environ if env is None else env
    if url.startswith(SUPABASE_SCHEMES):
        from controller.adapters.store.supabase import supabase_from_url  # supabase's client loads only when used

        try:
            results: ResultsDB = supabase_from_url(url, env, readonly=readonly)
        except ValueError as error:
            raise UnsupportedStoreURL(str(error)) from None
        state_url = state_url or DEFAULT_STATE_FOR_SUPABASE
    elif state_url is None or state_url == url:
        both = _open_sql(url, readonly=readonly, busy_timeout_s=busy_timeout_s)
        return Store(both, both)
    else:
        results = _open_sql(url, readonly=readonly, busy_timeout_s=busy_timeout_s)
    if state_url.startswith(SUPABASE_SCHEMES):
        results.close()
        raise UnsupportedStoreURL(f"--state {redact(state_url)!r}: Supabase holds the lab's results only; "
                                  "use sqlite:///PATH or postgresql://… for the controller state")
    try:
        return Store(results, _open_sql(state_url, readonly=readonly, busy_timeout_s=busy_timeout_s))
    except BaseException:
        results.close()
        raise


def _open_sql(url: str, *, readonly: bool, busy_timeout_s: float) -> SqlBackend:
    if url.startswith(SQLITE_PREFIX) and len(url) > len(SQLITE_PREFIX):
        return SqliteStore(url.removeprefix(SQLITE_PREFIX), readonly=readonly, busy_timeout_s=busy_timeout_s)
    if url.startswith(POSTGRES_SCHEMES):
        from controller.adapters.store.postgres import PostgresStore  # psycopg loads only when used

        return PostgresStore(url, readonly=readonly)
    raise UnsupportedStoreURL(
        f"store URL {redact(url)!r} is not supported; expected sqlite:///relative.db, sqlite:////abs.db, "
        "sqlite:///:memory:, postgresql://user@host:port/db or supabase://project.supabase.co"
    )


def shareable_across_threads(store: Store) -> bool:
    """No half is a SQLite file, whose connection belongs to the thread that opened it (both halves of a
    `supabase://` store with its default state, or of a PostgreSQL store with `--state sqlite:///…`, count)."""
    return not any(isinstance(half, SqliteStore) for half in (store.results, store.state))


def redact(url: str) -> str:
    """Drop a password from user:password@host so error messages can be logged."""
    scheme, sep, rest = url.partition("://")
    credentials, at, host = rest.rpartition("@")
    if not at or ":" not in credentials:
        return url
    return f"{scheme}{sep}{credentials.split(':', 1)[0]}:***@{host}"
