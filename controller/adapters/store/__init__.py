"""Store backends behind one URL: `sqlite:///rel.db`, `sqlite:////abs.db`, `sqlite:///:memory:`.

`postgresql://` and `supabase://` are recognised so a spec or `$EVALCTL_STORE` written for them
fails with a clear message (exit 2) instead of an unknown-scheme error.
"""

from __future__ import annotations

from controller.adapters.store.sqlite import BUSY_TIMEOUT_S, SqliteStore
from controller.core.ports import Store

SQLITE_PREFIX = "sqlite:///"
LATER_SCHEMES = ("postgresql://", "postgres://", "supabase://")


class UnsupportedStoreURL(ValueError):
    """The store URL names no backend this release can open; the CLI maps it to exit code 2."""


def open_store(url: str, *, readonly: bool = False, busy_timeout_s: float = BUSY_TIMEOUT_S) -> Store:
    """Open the backend the URL names; a writable SQLite store creates its file and parent dirs.

    `busy_timeout_s`: how long a write waits for another process's lock before the store counts as unavailable.
    """
    if url.startswith(SQLITE_PREFIX) and len(url) > len(SQLITE_PREFIX):
        return SqliteStore(url.removeprefix(SQLITE_PREFIX), readonly=readonly, busy_timeout_s=busy_timeout_s)
    if url.startswith(LATER_SCHEMES):
        scheme = url.split("://", 1)[0]
        raise UnsupportedStoreURL(
            f"store URL {_redact(url)!r}: the {scheme} backend comes in a later release; use sqlite:///PATH for now"
        )
    raise UnsupportedStoreURL(
        f"store URL {_redact(url)!r} is not supported; expected sqlite:///relative.db, sqlite:////abs.db or sqlite:///:memory:"
    )


def _redact(url: str) -> str:
    """Drop a password from user:password@host so error messages can be logged."""
    scheme, sep, rest = url.partition("://")
    credentials, at, host = rest.rpartition("@")
    if not at or ":" not in credentials:
        return url
    return f"{scheme}{sep}{credentials.split(':', 1)[0]}:***@{host}"
