"""The lab's results DB on Supabase: the `ResultsDB` contract spoken as PostgREST requests (official supabase-py).

PostgREST has no multi-statement transactions, so each rule of the contract rides on the filters of the one
request that writes (`username=eq.<owner>`, a `job_status` filter so a status never moves back,
`on_conflict=id` + `resolution=ignore-duplicates` for inserts), never on a read made before the write.
Reads page with limit/offset until the `Content-Range` total is reached, because PostgREST silently caps a
response at its `max-rows`; long `in.(…)` lists are cut into chunks so URLs stay short. Transient failures
are retried here with exponential backoff (the client's own retry is off, so there is one policy and its
sleeps are injectable). Nothing this module raises, logs or prints contains the key.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

from postgrest import ReturnMethod

from controller.adapters.store.codec import (
    already_uploaded,
    check_owner,
    decode_rows,
    format_timestamp,
    registered_models,
    reused_id,
    sandbox_job_row,
)
from controller.adapters.store.supabase_client import KEY_VARIABLES, PostgrestClient, RequestFailed, host_of
from controller.core.intake import RegisteredModel
from controller.core.observed import RowStatus
from controller.core.ports import ObservationError, StoreUnavailable, WriteRefused
from controller.core.records import NamedRow, NewRow, ResultsSnapshot, ResultUpload, RowAuditMark, SandboxJobRow

SCHEMES = {"supabase": "https", "supabase+http": "http"}
ROW_COLUMNS = ("id", "job_name", "username", "job_status", "created_at", "submitted_at", "started_at", "ended_at",
               "slurm_job_id", "model_id", "benchmark_id", "config", "metrics", "is_overlong", "n_rep_eval")
FAMILY_COLUMNS = "id,name,duplicate_of"
REGISTRY_COLUMNS = {"models": "id,duplicate_of,creation_time", "benchmarks": "id,duplicate_of"}  # what registry_order reads
STATUS_ORDER = (RowStatus.PENDING.value, RowStatus.STARTED.value, RowStatus.FINISHED.value)
UNIQUE_VIOLATION = "23505"  # a benchmark name registered by someone else meanwhile


class SupabaseResults:
    """`ResultsDB` on a Supabase project's REST API (the OT-Agent tables in schema `public`; the requests:
    `PostgrestClient`).

    `page_size` rows are asked per request (the server may return fewer); `max_in_list` bounds the values all
    `in.(…)` filters of one request carry together; `retries` more attempts follow a transient failure, after
    `backoff_s`, ×2 each time (capped at 30 s); `sleep` is injectable so tests never wait.
    """

    def __init__(self, url: str, key: str, *, readonly: bool = False, page_size: int = 1000, retries: int = 4,
                 backoff_s: float = 0.5, timeout_s: float = 30.0, max_in_list: int = 200,
                 sleep: Callable[[float], None] = time.sleep, schema: str = "public") -> None:
        if not key:
            raise ValueError(f"no Supabase key given for {host_of(url)}: set {KEY_VARIABLES[0]}")
        if page_size < 1 or max_in_list < 2 or retries < 0:
            raise ValueError("page_size must be ≥ 1, max_in_list ≥ 2 and retries ≥ 0")
        self._db = PostgrestClient(url, key, page_size=page_size, retries=retries, backoff_s=backoff_s,
                                   timeout_s=timeout_s, sleep=sleep, schema=schema)
        self.host, self.readonly, self.max_in_list = self._db.host, readonly, max_in_list

    def __repr__(self) -> str:
        return f"SupabaseResults(host={self.host!r}, readonly={self.readonly})"

    # ----------------------------------------------------------------------- reads

    def read_results(self, model_names: list[str] | None, benchmark_names: list[str] | None) -> ResultsSnapshot:
        """Families (two requests per table, or one for `None`), then the rows between them, each paged/chunked."""
        with self._db.failing_as(ObservationError):
            models = self._family("models", model_names)
            benchmarks = self._family("benchmarks", benchmark_names)
            model_ids = None if model_names is None else [m.id for m in models]
            benchmark_ids = None if benchmark_names is None else [b.id for b in benchmarks]
            records: list[dict[str, Any]] = []
            if model_ids != [] and benchmark_ids != []:
                for model_chunk, benchmark_chunk in _chunk_pairs(model_ids, benchmark_ids, self.max_in_list):
                    within = {"model_id": model_chunk, "benchmark_id": benchmark_chunk}
                    records += self._db.select("sandbox_jobs", ",".join(ROW_COLUMNS),
                                               within={k: v for k, v in within.items() if v is not None})
        unique = {str(record.get("id")): record for record in records}
        rows, undecodable = decode_rows(unique[row_id] for row_id in sorted(unique))
        return ResultsSnapshot(models=models, benchmarks=benchmarks, rows=rows, undecodable=undecodable)

    def read_models(self) -> tuple[RegisteredModel, ...]:
        """The canonical models, paged (20,000 models: 20 requests at the default page size)."""
        with self._db.failing_as(ObservationError):
            records = self._db.select("models", "id,name,creation_time", any_of="duplicate_of.is.null")
        unique = {str(record.get("id")): record for record in records}
        return registered_models(unique.values())

    def read_row(self, row_id: str) -> SandboxJobRow | None:
        with self._db.failing_as(ObservationError):
            found = self._db.row(row_id, ",".join(ROW_COLUMNS))
        try:
            return None if found is None else sandbox_job_row(found)
        except ValueError as error:
            raise ObservationError(f"supabase {self.host}: {error}") from None

    # ----------------------------------------------------------------------- writes

    def create_row(self, row: NewRow) -> None:
        """Model and benchmark by name (registered if new), then the row; an existing id is left as it is."""
        self._check_writable()
        now = datetime.now(UTC)
        with self._db.failing_as(StoreUnavailable):
            record = {
                "id": row.id, "created_at": format_timestamp(now), "job_name": row.job_name, "username": row.username,
                "submitted_at": format_timestamp(row.submitted_at), "started_at": format_timestamp(row.started_at),
                "n_trials": row.n_trials, "n_rep_eval": row.n_rep_eval, "config": row.config,
                "model_id": self._model_id(row.model_name, row.username, now),
                "benchmark_id": self._benchmark_id(row.benchmark_name),
                "job_status": row.job_status.value, "slurm_job_id": row.slurm_job_id, "is_overlong": False,
            }
            inserted = self._db.insert("sandbox_jobs", record)
            if not inserted and self._db.row(row.id, "id") is None:  # not new, yet not there either
                raise RequestFailed(self._db.line(f"inserting sandbox_jobs row {row.id}", "the server accepted the insert "
                                                  "but did not store it (row-level security? use the service-role key)"))

    def update_row(self, row_id: str, *, owner: str, status: RowStatus | None = None,
                   started_at: datetime | None = None, slurm_job_id: str | None = None) -> None:
        """One PATCH filtered on id, owner and (with a status) the statuses it may move from; if it matched
        nothing, one GET says why: missing, someone else's, already further along — or a swallowed write."""
        self._check_writable()
        changes = {name: value for name, value in {
            "job_status": None if status is None else status.value,
            "started_at": format_timestamp(started_at),
            "slurm_job_id": slurm_job_id,
        }.items() if value is not None}
        with self._db.failing_as(StoreUnavailable):
            if changes:
                query = self._db.table("sandbox_jobs").update(changes, returning=ReturnMethod.representation)
                query = query.eq("id", row_id).eq("username", owner).select("id")
                if status is not None:
                    earlier = STATUS_ORDER[: STATUS_ORDER.index(status.value) + 1]
                    query = query.or_(f"job_status.is.null,job_status.in.({','.join(earlier)})")
                if self._db.execute(f"updating sandbox_jobs row {row_id}", query)[0]:
                    return
            found = self._db.row(row_id, "id,username,job_status")
        if found is None:
            raise LookupError(f"sandbox_jobs row {row_id} does not exist")
        check_owner(row_id, found.get("username"), owner)
        stored = found.get("job_status")
        behind = stored is None or (stored in STATUS_ORDER and (
            status is None or STATUS_ORDER.index(stored) <= STATUS_ORDER.index(status.value)))
        if changes and behind:
            raise WriteRefused(self._db.line(f"updating sandbox_jobs row {row_id}", f"the row is {owner}'s and "
                                             f"{stored!r}, yet the update changed nothing (row-level security or a "
                                          "proxy swallowed it? use the service-role key)"))

    def upload_result(self, row_id: str, result: ResultUpload, *, owner: str) -> bool:
        """GET the row (exactly once: Finished with these metrics → no write), then one PATCH filtered on owner."""
        self._check_writable()
        with self._db.failing_as(StoreUnavailable):
            found = self._db.row(row_id, "id,username,job_status,metrics,is_overlong,config")
            if found is None:
                raise LookupError(f"sandbox_jobs row {row_id} does not exist")
            check_owner(row_id, found.get("username"), owner)
            if already_uploaded(found.get("job_status"), found.get("metrics"), found.get("is_overlong"), result):
                return False
            values = {
                "job_status": RowStatus.FINISHED.value,
                "metrics": [{"name": metric.name, "value": metric.value} for metric in result.metrics],
                "stats": result.stats, "n_trials": result.n_trials, "ended_at": format_timestamp(result.ended_at),
                "is_overlong": result.is_overlong,
            }
            config = found.get("config")
            if result.env is not None and isinstance(config, dict):
                values["config"] = {**config, "env": result.env}
            query = self._db.table("sandbox_jobs").update(values, returning=ReturnMethod.representation)
            if self._db.execute(f"uploading to sandbox_jobs row {row_id}",
                                query.eq("id", row_id).eq("username", owner).select("id"))[0]:
                return True
            again = self._db.row(row_id, "id,username")
        if again is None:
            raise LookupError(f"sandbox_jobs row {row_id} does not exist")
        check_owner(row_id, again.get("username"), owner)  # it changed hands between the read and the write
        raise WriteRefused(self._db.line(f"uploading to sandbox_jobs row {row_id}", f"the row is {owner}'s, yet the "
                                         "update changed nothing (row-level security or a proxy swallowed it? use "
                                      "the service-role key)"))

    # ----------------------------------------------------------------------- row audit marks

    def read_audit_marks(self, row_ids: Sequence[str]) -> dict[str, RowAuditMark]:
        """None through PostgREST: the marks' table is created by the PostgreSQL store's migrations (docs/DECISIONS.md
        "Audit marks"), which this REST client cannot run."""
        return {}

    def mark_rows(self, marks: Sequence[RowAuditMark]) -> None:
        raise WriteRefused(f"supabase {self.host}: audit marks are not written through the REST API; run "
                           "`evalctl db audit --apply` with --store postgresql://… (the project's direct connection), "
                           "whose migrations create evalrun_row_audit")

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> SupabaseResults:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # ----------------------------------------------------------------------- families and registration

    def _family(self, table: str, names: list[str] | None) -> tuple[NamedRow, ...]:
        """Names → canonical ids (duplicate_of, else id) → the canonical rows and every row pointing at them."""
        if names is None:
            records = self._db.select(table, FAMILY_COLUMNS)
        else:
            canonical: set[str] = set()
            for chunk in _chunks(sorted(set(names)), self.max_in_list):
                canonical.update(str(found.get("duplicate_of") or found.get("id"))
                                 for found in self._db.select(table, "id,duplicate_of", within={"name": chunk}))
            records = []
            for chunk in _chunks(sorted(canonical), self.max_in_list // 2):  # the list goes in twice
                listed = _in_list(chunk)
                records += self._db.select(table, FAMILY_COLUMNS, any_of=f"id.in.{listed},duplicate_of.in.{listed}")
        members = {str(found["id"]): found for found in records}
        return tuple(NamedRow(id=member_id, name=str(members[member_id].get("name") or ""),
                              duplicate_of=_text_or_none(members[member_id].get("duplicate_of")))
                     for member_id in sorted(members))

    def _model_id(self, name: str, created_by: str, at: datetime) -> str:
        """Reuse the model row of that name (ResultsDB.create_row says which); register the model if new."""
        found = self._named("models", name)
        if found is not None:
            return found
        model_id = str(uuid.uuid4())
        if self._db.insert("models", {"id": model_id, "name": name, "created_by": created_by,
                                      "creation_time": format_timestamp(at)}):
            return model_id
        return self._registered("models", name)

    def _benchmark_id(self, name: str) -> str:
        found = self._named("benchmarks", name)
        if found is not None:
            return found
        benchmark_id = str(uuid.uuid4())
        try:
            if self._db.insert("benchmarks", {"id": benchmark_id, "name": name}):
                return benchmark_id
        except RequestFailed as failed:
            if failed.code != UNIQUE_VIOLATION:  # someone registered the same name meanwhile: theirs is fine
                raise
        return self._registered("benchmarks", name)

    def _registered(self, table: str, name: str) -> str:
        """The id of a name just registered (by us, a retry of ours, or a concurrent writer)."""
        found = self._named(table, name)
        if found is None:
            raise RequestFailed(self._db.line(f"registering {table} {name!r}", "the server accepted the insert but did not "
                                              "store it (row-level security? use the service-role key)"))
        return found

    def _named(self, table: str, name: str) -> str | None:
        """The row of that name a new row reuses (`codec.reused_id`), if there is one."""
        return reused_id(self._db.select(table, REGISTRY_COLUMNS[table], equal={"name": name}))

    def _check_writable(self) -> None:
        if self.readonly:
            raise WriteRefused(f"supabase {self.host} is open read-only")

def supabase_from_url(url: str, env: Mapping[str, str], **options: Any) -> SupabaseResults:
    """`supabase://<project-host>[:port]` (https) or `supabase+http://host:port` (a local stand-in), with the
    key from `$SUPABASE_SERVICE_KEY` (or `$SUPABASE_KEY`); `options` go to `SupabaseResults`."""
    parts = urlsplit(url)
    if parts.scheme not in SCHEMES or not parts.hostname:
        raise ValueError(f"{url.split('://', 1)[0]}://…: expected supabase://<project>.supabase.co or "
                         "supabase+http://host:port")
    if parts.username or parts.password:
        raise ValueError(f"{parts.scheme}://{parts.hostname}: put the key in ${KEY_VARIABLES[0]}, not in the URL")
    if parts.path.strip("/") or parts.query:
        raise ValueError(f"{parts.scheme}://{parts.netloc}: a Supabase store URL names only the project's host")
    key = next((env[name] for name in KEY_VARIABLES if env.get(name)), None)
    if not key:
        raise ValueError(f"{parts.scheme}://{parts.netloc} needs the project's service-role key: set "
                         f"${KEY_VARIABLES[0]} (or ${KEY_VARIABLES[1]})")
    return SupabaseResults(f"{SCHEMES[parts.scheme]}://{parts.netloc}", key, **options)


def _chunks(values: Sequence[str], size: int) -> list[list[str]]:
    size = max(size, 1)
    return [list(values[start:start + size]) for start in range(0, len(values), size)]


def _chunk_pairs(first: list[str] | None, second: list[str] | None,
                 budget: int) -> list[tuple[list[str] | None, list[str] | None]]:
    """Every pair of chunks of two in-lists (None: no filter), each pair carrying at most `budget` values;
    the shorter list gets what it needs up to half the budget, so a few benchmarks never multiply requests."""
    sizes = [0 if values is None else len(values) for values in (first, second)]
    if sum(sizes) > budget and all(sizes):
        small = min(min(sizes), budget // 2)
        sizes = [small, budget - small] if sizes[0] <= sizes[1] else [budget - small, small]
    else:
        sizes = [budget, budget]
    firsts: list[list[str] | None] = [None] if first is None else list(_chunks(first, sizes[0]))
    seconds: list[list[str] | None] = [None] if second is None else list(_chunks(second, sizes[1]))
    return [(one, other) for one in firsts for other in seconds]


def _in_list(values: Sequence[str]) -> str:
    """`(a,"b,c")`: PostgREST's list syntax; values with reserved characters are quoted, `"` and `\\` escaped."""
    def item(value: str) -> str:
        if value and not any(char in value for char in ',:()"\\') and not value.isspace() and value.strip() == value:
            return value
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'

    return "(" + ",".join(item(value) for value in values) + ")"


def _text_or_none(value: object) -> str | None:
    return None if value is None else str(value)

