"""The Supabase store's request layer: PostgREST requests paged until complete and retried with backoff, and every
failure as one line naming the project, never its key.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, Protocol
from urllib.parse import urlsplit

import httpx
from postgrest import APIError, APIResponse, CountMethod, ReturnMethod, SyncRequestBuilder, SyncSelectRequestBuilder
from supabase import ClientOptions, create_client

KEY_VARIABLES = ("SUPABASE_SERVICE_KEY", "SUPABASE_KEY")
MAX_BACKOFF_S = 30.0
# 429 is retried although it is a 4xx: it is the server saying "not now", not "never" — the request was not
# processed, so repeating it is safe, and failing the whole pass (every cell Unknown) for a throttle would be
# worse than waiting as asked (`Retry-After`, capped). Every other 4xx is a property of the request itself
# (bad filter, bad key, missing table, conflict) and repeating it cannot help.
RETRIED_4XX = frozenset({429})
NO_SUCH_VALUE = "22P02"  # invalid_text_representation: an id that is not a uuid names no row


class Query(Protocol):
    def execute(self) -> APIResponse: ...


class RequestFailed(Exception):
    """A request that failed for good (after retries); `str()` is the one line the caller's error carries."""

    def __init__(self, line: str, *, status: int | None = None, code: str | None = None) -> None:
        super().__init__(line)
        self.status = status
        self.code = code


class PostgrestClient:
    """One Supabase project's REST API through supabase-py, with one retry policy (the client's own is off).

    `page_size` rows are asked per request (the server may return fewer); `retries` more attempts follow a
    transient failure, after `backoff_s`, ×2 each time (capped at 30 s); `sleep` is injectable so tests never wait.
    """

    def __init__(self, url: str, key: str, *, page_size: int, retries: int, backoff_s: float, timeout_s: float,
                 sleep: Callable[[float], None] = time.sleep, schema: str = "public") -> None:
        self.host = host_of(url)
        self.page_size = page_size
        self.retries = retries
        self.backoff_s = backoff_s
        self._key = key  # only to scrub it from anything a server might echo back
        self._sleep = sleep
        self._seen = threading.local()  # the last HTTP status seen by this thread (APIError does not carry it)
        self._http = httpx.Client(timeout=timeout_s, event_hooks={"response": [self._remember]})
        options = ClientOptions(schema=schema, httpx_client=self._http, postgrest_client_retry=False,
                                auto_refresh_token=False, persist_session=False)
        try:
            self._client = create_client(url, key, options)
        except Exception as error:  # SupabaseException: a malformed URL; its text never holds the key
            self._http.close()
            raise ValueError(f"supabase {self.host}: {self.scrub(str(error))}") from None

    def close(self) -> None:
        self._http.close()

    def table(self, table: str) -> SyncRequestBuilder:
        return self._client.table(table)

    def row(self, row_id: str, columns: str) -> dict[str, Any] | None:
        try:
            found = self.select("sandbox_jobs", columns, equal={"id": row_id})
        except RequestFailed as failed:
            if failed.code == NO_SUCH_VALUE:
                return None
            raise
        return found[0] if found else None

    def insert(self, table: str, record: dict[str, Any]) -> bool:
        """POST with `on_conflict=id` + ignore-duplicates, so a retry after a lost answer is harmless; True if new."""
        query = self.table(table).upsert(record, on_conflict="id", ignore_duplicates=True,
                                         returning=ReturnMethod.representation)
        return bool(self.execute(f"inserting into {table}", query)[0])

    def select(self, table: str, columns: str, *, equal: Mapping[str, str] | None = None,
               within: Mapping[str, Sequence[str]] | None = None, any_of: str | None = None) -> list[dict[str, Any]]:
        """Every row of one filtered query, ordered by id, page after page until the Content-Range total is
        reached. A page may be shorter than asked (the server's max-rows) without being the last; only the
        total says when it is done, or an empty page when the server gives no total. Every page asks for the
        count, so a row inserted meanwhile (shifting the pages) extends the read instead of falling off its end;
        the caller drops the row read twice."""
        records: list[dict[str, Any]] = []
        while True:
            query: SyncSelectRequestBuilder = self.table(table).select(columns, count=CountMethod.exact)
            for column, value in (equal or {}).items():
                query = query.eq(column, value)
            for column, values in (within or {}).items():
                query = query.in_(column, list(values))
            if any_of is not None:
                query = query.or_(any_of)
            query = query.order("id").range(len(records), len(records) + self.page_size - 1)
            page, total = self.execute(f"reading {table}", query)
            records += page
            if not page:
                if total is not None and len(records) < total:
                    raise RequestFailed(self.line(f"reading {table}", f"the server counted {total} rows but returned "
                                                  f"only {len(records)}"))
                return records
            if total is not None and len(records) >= total:
                return records

    def execute(self, what: str, query: Query) -> tuple[list[dict[str, Any]], int | None]:
        """Run one request; retry transient failures (5xx, 429, timeouts, dropped connections) with backoff."""
        attempt = 0
        while True:
            self._seen.status, self._seen.retry_after = None, None
            try:
                response = query.execute()
                rows = [item for item in response.data if isinstance(item, dict)] if isinstance(response.data, list) else []
                if not isinstance(response.data, list) or len(rows) != len(response.data):
                    raise RequestFailed(self.line(what, f"HTTP {self._seen.status}: the answer is not a JSON list of rows"),
                                        status=self._seen.status)
                return rows, response.count
            except APIError as error:
                status = self._seen.status
                failed = RequestFailed(self._api_line(what, status, error), status=status, code=error.code)
                transient = status is not None and (status >= 500 or status in RETRIED_4XX)
            except (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError) as error:
                failed = RequestFailed(self.line(what, f"{type(error).__name__}: {error or 'no answer'} (is the server "
                                                 "up and reachable?)"))
                transient = True
            except (httpx.HTTPError, RuntimeError) as error:  # RuntimeError: httpx's "the client has been closed"
                raise RequestFailed(self.line(what, f"{type(error).__name__}: {error}")) from None
            if not transient or attempt >= self.retries:
                if attempt:
                    raise RequestFailed(f"{failed} (after {attempt + 1} attempts)", status=failed.status, code=failed.code)
                raise failed
            delay = min(self.backoff_s * 2 ** attempt, MAX_BACKOFF_S)
            self._sleep(max(delay, min(self._seen.retry_after or 0.0, MAX_BACKOFF_S)))
            attempt += 1

    def _remember(self, response: httpx.Response) -> None:
        """httpx response hook: the status (and Retry-After) of the answer the client is about to parse."""
        self._seen.status = response.status_code
        try:
            self._seen.retry_after = float(response.headers.get("Retry-After", ""))
        except ValueError:
            self._seen.retry_after = None

    @contextmanager
    def failing_as(self, error_type: type[RuntimeError]) -> Iterator[None]:
        """A failed request surfaces as the contract's error for this side: reads observe, writes are unavailable."""
        try:
            yield
        except RequestFailed as failed:
            raise error_type(str(failed)) from None

    def _api_line(self, what: str, status: int | None, error: APIError) -> str:
        message = error.message or (error.details if isinstance(error.details, str) else None) or "no message"
        code = f" {error.code}" if error.code and error.code != str(status) else ""
        return self.line(what, f"HTTP {status}{code}: {message[:300]} ({_hint(status)})")

    def line(self, what: str, why: str) -> str:
        """One line naming the project (never the key): a server may echo what it was sent."""
        return " ".join(self.scrub(f"supabase {self.host}: {what}: {why}").split())

    def scrub(self, text: str) -> str:
        return text.replace(self._key, "***") if self._key else text


def host_of(url: str) -> str:
    parts = urlsplit(url)
    return parts.hostname + (f":{parts.port}" if parts.port else "") if parts.hostname else "?"


def _hint(status: int | None) -> str:
    if status in (401, 403):
        return f"check that ${KEY_VARIABLES[0]} holds this project's service-role key"
    if status == 404:
        return "is this the lab's results project? the OT-Agent tables must be in its API schema"
    if status == 416:
        return "rows disappeared while they were being read; retried next pass"
    if status is not None and (status >= 500 or status in RETRIED_4XX):
        return "the server is down or overloaded; retried next pass"
    return "the request was rejected: do the tables match the OT-Agent schema?"
