"""The Supabase backend on the wire: what it asks PostgREST, and what it makes of every kind of answer.

The server is the loopback stand-in (tests/fixtures/postgrest.py); sleeps between retries are recorded, never slept.
"""

from __future__ import annotations

import math
import re
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from controller.adapters.store.supabase import ROW_COLUMNS, SupabaseResults, supabase_from_url
from controller.core.observed import Metric, RowStatus
from controller.core.ports import ObservationError, StoreUnavailable, WriteRefused
from controller.core.records import NewRow, ResultUpload
from tests.fixtures.legacy_db import Families, LegacyTables

if TYPE_CHECKING:  # the root conftest loads it as a plugin (so pytest rewrites its asserts)
    from tests.fixtures.postgrest import FakePostgrest, Recorded


MODEL = "laion/Qwen3-8B-sft-v3"
T0 = datetime(2025, 6, 1, 12, tzinfo=UTC)
RESULT = ResultUpload(metrics=(Metric(name="accuracy", value=0.42),), stats={"n_trials": 290}, n_trials=300,
                      ended_at=datetime(2025, 6, 2, 8, tzinfo=UTC))


class Planted(LegacyTables):
    """Legacy rows put straight into the fake's tables, as the old listener left them."""

    def __init__(self, fake: FakePostgrest) -> None:
        self.fake = fake

    def insert(self, table: str, record: dict[str, Any]) -> None:
        self.fake.insert(table, record)


@pytest.fixture
def sleeps() -> list[float]:
    return []


@pytest.fixture
def results(postgrest: FakePostgrest, sleeps: list[float]) -> Iterator[SupabaseResults]:
    opened = SupabaseResults(postgrest.url, postgrest.key, sleep=sleeps.append)
    yield opened
    opened.close()


@pytest.fixture
def planted(postgrest: FakePostgrest) -> Planted:
    return Planted(postgrest)


@pytest.fixture
def fam(planted: Planted) -> Families:
    return Families(planted)


def pending_row(row_id: str | None = None, *, username: str = "alice", model: str = MODEL,
                benchmark: str = "dev_set_v2") -> NewRow:
    return NewRow(id=row_id or str(uuid.uuid4()), job_name="ev_run", username=username, model_name=model,
                  benchmark_name=benchmark, job_status=RowStatus.PENDING, submitted_at=T0,
                  config={"agent": "terminus-2", "run_tag": "ev_run"})


def in_values(value: str) -> list[str]:
    assert value.startswith("in.(") and value.endswith(")"), value
    return value[4:-1].split(",")


# --------------------------------------------------------------------------- reads: what is asked


def test_reads_ask_for_the_families_then_their_rows_with_the_key_in_both_headers(
    results: SupabaseResults, postgrest: FakePostgrest, planted: Planted, fam: Families
) -> None:
    planted.add_row(fam.qwen_dup, fam.v2_dcagent)

    snapshot = results.read_results([MODEL], ["dev_set_v2"])

    assert len(snapshot.rows) == 1
    assert [(r.method, r.table) for r in postgrest.requests] == [
        ("GET", "models"), ("GET", "models"), ("GET", "benchmarks"), ("GET", "benchmarks"), ("GET", "sandbox_jobs")]
    for request in postgrest.requests:
        assert request.path.startswith("/rest/v1/")
        assert request.headers["apikey"] == postgrest.key
        assert request.headers["authorization"] == f"Bearer {postgrest.key}"
        assert "count=exact" in request.headers["prefer"]
        assert (request.params["order"], request.params["offset"], request.params["limit"]) == ("id.asc", "0", "1000")
    names, family = postgrest.requests_to("models")
    assert (names.params["select"], names.params["name"]) == ("id,duplicate_of", f"in.({MODEL})")
    assert family.params["or"] == f"(id.in.({fam.qwen}),duplicate_of.in.({fam.qwen}))"
    rows = postgrest.requests_to("sandbox_jobs")[0]
    assert rows.params["select"] == ",".join(ROW_COLUMNS)  # the needed columns only, never `*`
    assert sorted(in_values(rows.params["model_id"])) == sorted([fam.qwen, fam.qwen_dup])
    assert sorted(in_values(rows.params["benchmark_id"])) == sorted([fam.v2, fam.v2_dcagent, fam.v2_2x])


@pytest.mark.parametrize("asked", [MODEL, "laion/Qwen3-8B-sft-v3-copy"])
def test_a_family_is_found_from_its_canonical_row_or_any_duplicate(
    results: SupabaseResults, fam: Families, asked: str
) -> None:
    snapshot = results.read_results([asked], ["DCAgent_dev_set_v2"])

    assert {(m.id, m.duplicate_of) for m in snapshot.models} == {(fam.qwen, None), (fam.qwen_dup, fam.qwen)}
    assert {b.id for b in snapshot.benchmarks} == {fam.v2, fam.v2_dcagent, fam.v2_2x}


def test_none_reads_whole_tables_without_filters(
    results: SupabaseResults, postgrest: FakePostgrest, planted: Planted, fam: Families
) -> None:
    ids = {planted.add_row(fam.qwen, fam.tb2), planted.add_row(fam.other_model, fam.v2)}
    postgrest.insert("sandbox_jobs", {"id": str(uuid.uuid4()), "username": "legacy"})  # no model, no benchmark
    ids.add(postgrest.tables["sandbox_jobs"][-1]["id"])

    snapshot = results.read_results(None, None)

    assert {r.id for r in snapshot.rows} == ids
    assert (len(snapshot.models), len(snapshot.benchmarks)) == (3, 4)
    assert len(postgrest.requests) == 3
    for request in postgrest.requests:
        assert set(request.params) == {"select", "order", "offset", "limit"}


def test_unknown_names_read_no_rows_at_all(results: SupabaseResults, postgrest: FakePostgrest, fam: Families) -> None:
    snapshot = results.read_results(["nobody/Nothing-1B"], ["dev_set_v2"])

    assert snapshot.models == () and snapshot.rows == ()
    assert not postgrest.requests_to("sandbox_jobs")


# --------------------------------------------------------------------------- reads: paging and chunking


def plant_rows(planted: Planted, fam: Families, count: int) -> set[str]:
    return {planted.add_row(fam.qwen, fam.v2, job_status="Pending") for _ in range(count)}


@pytest.mark.parametrize(("max_rows", "page_size"), [(1000, 1000), (1000, 5000), (300, 1000), (None, 1000)])
def test_every_row_is_read_when_the_server_caps_pages(
    postgrest: FakePostgrest, planted: Planted, fam: Families, max_rows: int | None, page_size: int
) -> None:
    ids = plant_rows(planted, fam, 2500)
    postgrest.max_rows = max_rows
    with SupabaseResults(postgrest.url, postgrest.key, page_size=page_size) as results:
        snapshot = results.read_results([MODEL], ["dev_set_v2"])

    pages = postgrest.requests_to("sandbox_jobs")
    assert {r.id for r in snapshot.rows} == ids
    assert len(pages) == math.ceil(2500 / min(page_size, max_rows or page_size))
    assert [int(r.params["offset"]) for r in pages] == [i * min(page_size, max_rows or page_size) for i in range(len(pages))]
    assert {r.status for r in pages} == {206}  # each a part of a larger total


def test_without_a_total_pages_are_read_until_an_empty_one(
    results: SupabaseResults, postgrest: FakePostgrest, planted: Planted, fam: Families
) -> None:
    ids = plant_rows(planted, fam, 2500)
    postgrest.count_totals = False  # answers say `0-999/*`: a short page may be the cap, not the end

    snapshot = results.read_results([MODEL], ["dev_set_v2"])

    assert {r.id for r in snapshot.rows} == ids
    assert len(postgrest.requests_to("sandbox_jobs")) == 4


def test_the_fake_answers_content_range_like_postgrest(postgrest: FakePostgrest, planted: Planted, fam: Families) -> None:
    plant_rows(planted, fam, 5)
    auth = {"apikey": postgrest.key, "Authorization": f"Bearer {postgrest.key}"}

    def get(headers: dict[str, str], **params: str) -> httpx.Response:
        return httpx.get(f"{postgrest.url}/rest/v1/sandbox_jobs", params={"select": "id", **params},
                         headers={**auth, **headers})

    counted = {"Prefer": "count=exact"}
    assert (get(counted, limit="2").status_code, get(counted, limit="2").headers["content-range"]) == (206, "0-1/5")
    assert get({}, limit="2").headers["content-range"] == "0-1/*"
    assert get({**counted, "Range": "3-9", "Range-Unit": "items"}).headers["content-range"] == "3-4/5"
    assert (get(counted).status_code, get(counted, offset="5").headers["content-range"]) == (200, "*/5")
    past = get(counted, offset="6")
    assert (past.status_code, past.json()["code"]) == (416, "PGRST103")


def test_long_name_lists_are_chunked_and_odd_names_are_quoted(
    postgrest: FakePostgrest, planted: Planted, fam: Families
) -> None:
    odd = 'org/model (v2), "best"\\final'
    odd_id = planted.add_model(odd)
    planted.add_row(odd_id, fam.v2)
    names = [f"org/model-{i}" for i in range(449)] + [odd]
    for name in names[:449]:
        planted.add_row(planted.add_model(name), fam.v2)

    with SupabaseResults(postgrest.url, postgrest.key, max_in_list=200) as results:
        snapshot = results.read_results(names, ["dev_set_v2"])

    assert len(snapshot.rows) == 450 and odd in {m.name for m in snapshot.models}
    by_name, by_family = [r for r in postgrest.requests_to("models") if "name" in r.params], \
        [r for r in postgrest.requests_to("models") if "or" in r.params]
    assert (len(by_name), len(by_family), len(postgrest.requests_to("sandbox_jobs"))) == (3, 5, 3)
    for request in postgrest.requests:
        values = sum(re.sub(r'"(\\.|[^"\\])*"', "x", v).count(",") + 1
                     for k, v in request.query if k in {"name", "model_id", "benchmark_id", "or"})
        assert values <= 200  # `(id.in.(a,b),duplicate_of.in.(a,b))`: 3 commas, 4 values


# --------------------------------------------------------------------------- failures and retries


def test_a_503_is_retried_after_a_backoff_and_the_read_succeeds(
    results: SupabaseResults, postgrest: FakePostgrest, fam: Families, sleeps: list[float]
) -> None:
    postgrest.fail_next(503)
    postgrest.drop_next()  # then a dropped connection

    snapshot = results.read_results([MODEL], ["dev_set_v2"])

    assert len(snapshot.models) == 2
    assert sleeps == [0.5, 1.0]
    assert [r.status for r in postgrest.requests[:3]] == [503, 0, 200]


def test_a_429_waits_as_long_as_the_server_asks(
    results: SupabaseResults, postgrest: FakePostgrest, fam: Families, sleeps: list[float]
) -> None:
    postgrest.fail_next(429, {"message": "Too many requests"}, headers={"Retry-After": "7"})

    results.read_results([MODEL], ["dev_set_v2"])

    assert sleeps == [7.0]


def test_a_server_that_keeps_failing_fails_reads_as_observation_errors_and_writes_as_unavailable(
    results: SupabaseResults, postgrest: FakePostgrest, sleeps: list[float]
) -> None:
    postgrest.fail_next(500, {"code": "XX000", "message": "internal error"}, times=10)

    with pytest.raises(ObservationError, match=r"HTTP 500 XX000: internal error .*after 5 attempts") as read:
        results.read_results([MODEL], None)
    with pytest.raises(StoreUnavailable, match="HTTP 500"):
        results.update_row(str(uuid.uuid4()), owner="alice", status=RowStatus.STARTED)

    assert len(postgrest.requests) == 10 and sleeps == [0.5, 1.0, 2.0, 4.0] * 2
    assert "\n" not in str(read.value) and str(read.value).startswith(f"supabase {postgrest.url.removeprefix('http://')}: ")


@pytest.mark.parametrize(("break_it", "status", "code"), [
    (lambda fake: fake.fail_next(400, {"code": "PGRST100", "message": '"failed to parse filter (x)"'}), 400, "PGRST100"),
    (lambda fake: setattr(fake, "key", "another-key"), 401, None),
    (lambda fake: fake.tables.pop("models"), 404, "PGRST205"),
])
def test_client_errors_fail_at_once_with_one_line_naming_the_code_and_never_the_key(
    results: SupabaseResults, postgrest: FakePostgrest, sleeps: list[float], break_it: Any, status: int, code: str | None
) -> None:
    key = postgrest.key
    break_it(postgrest)

    with pytest.raises(ObservationError) as raised:
        results.read_results([MODEL], ["dev_set_v2"])

    message = str(raised.value)
    assert len(postgrest.requests) == 1 and sleeps == []
    assert f"HTTP {status}" in message and (code is None or code in message)
    assert key not in message and "\n" not in message
    assert repr(results) == f"SupabaseResults(host='{postgrest.url.removeprefix('http://')}', readonly=False)"


def test_a_wrong_bearer_token_is_pgrst301(postgrest: FakePostgrest) -> None:
    response = httpx.get(f"{postgrest.url}/rest/v1/models", headers={"apikey": postgrest.key,
                                                                     "Authorization": "Bearer nope"})
    assert (response.status_code, response.json()["code"]) == (401, "PGRST301")


def test_a_server_echoing_the_key_does_not_leak_it(results: SupabaseResults, postgrest: FakePostgrest) -> None:
    postgrest.fail_next(401, {"code": "PGRST301", "message": f"JWT {postgrest.key} is not valid"})

    with pytest.raises(ObservationError) as raised:
        results.read_row(str(uuid.uuid4()))

    assert postgrest.key not in str(raised.value) and "***" in str(raised.value)


# --------------------------------------------------------------------------- writes


def test_create_row_registers_what_is_new_and_inserts_ignoring_duplicates(
    results: SupabaseResults, postgrest: FakePostgrest
) -> None:
    row = pending_row()

    results.create_row(row)
    results.create_row(row)

    posts = [r for r in postgrest.requests if r.method == "POST"]
    assert [r.table for r in posts] == ["models", "benchmarks", "sandbox_jobs", "sandbox_jobs"]  # registered once
    for post in posts:
        assert post.params["on_conflict"] == "id"
        assert post.headers["prefer"] == "return=representation,resolution=ignore-duplicates"
    (stored,) = postgrest.tables["sandbox_jobs"]
    (model,) = postgrest.tables["models"]
    assert (stored["username"], stored["job_status"], stored["model_id"]) == ("alice", "Pending", model["id"])
    assert stored["config"] == row.config and uuid.UUID(model["id"]).version == 4


def test_create_row_reuses_the_canonical_model_and_leaves_an_existing_row_alone(
    results: SupabaseResults, postgrest: FakePostgrest, planted: Planted, fam: Families
) -> None:
    planted.add_model(MODEL, duplicate_of=fam.qwen)  # a later duplicate with the same name
    bobs = planted.add_row(fam.qwen, fam.v2, username="bob", job_status="Started")
    before = [dict(row) for row in postgrest.tables["sandbox_jobs"]]

    results.create_row(pending_row(bobs))
    results.create_row(pending_row(benchmark="DCAgent_dev_set_v2"))

    assert postgrest.tables["sandbox_jobs"][0] == before[0]
    assert (postgrest.tables["sandbox_jobs"][1]["model_id"], postgrest.tables["sandbox_jobs"][1]["benchmark_id"]) == (
        fam.qwen, fam.v2_dcagent)
    assert not [r for r in postgrest.requests if r.method == "POST" and r.table != "sandbox_jobs"]


def test_a_benchmark_registered_meanwhile_by_someone_else_is_used(
    results: SupabaseResults, postgrest: FakePostgrest, fam: Families
) -> None:
    def they_win_the_race(request: Recorded) -> None:
        if (request.method, request.table) == ("POST", "benchmarks"):
            postgrest.insert("benchmarks", {"id": "theirs", "name": "new_bench"})

    postgrest.before_each = they_win_the_race
    results.create_row(pending_row(benchmark="new_bench"))

    assert [r.status for r in postgrest.requests_to("benchmarks", "POST")] == [409]  # unique name: 23505
    assert postgrest.tables["sandbox_jobs"][0]["benchmark_id"] == "theirs"


def test_update_row_is_one_patch_filtered_on_owner_and_earlier_statuses(
    results: SupabaseResults, postgrest: FakePostgrest
) -> None:
    row = pending_row()
    results.create_row(row)
    started = datetime(2025, 6, 1, 13, tzinfo=UTC)

    results.update_row(row.id, owner="alice", status=RowStatus.STARTED, started_at=started)
    results.update_row(row.id, owner="alice", status=RowStatus.PENDING, slurm_job_id="1")  # stale: no effect

    first, second = [r for r in postgrest.requests if r.method == "PATCH"]
    assert (first.params["id"], first.params["username"]) == (f"eq.{row.id}", "eq.alice")
    assert first.params["or"] == "(job_status.is.null,job_status.in.(Pending,Started))"
    assert first.headers["prefer"] == "return=representation" and first.body == {
        "job_status": "Started", "started_at": "2025-06-01T13:00:00.000000+00:00"}
    assert second.params["or"] == "(job_status.is.null,job_status.in.(Pending))"
    stored = postgrest.tables["sandbox_jobs"][0]
    assert (stored["job_status"], stored["slurm_job_id"]) == ("Started", "pending")
    assert postgrest.requests[-1].method == "GET"  # no row came back: looked up, found further along


def test_another_users_row_is_never_patched(
    results: SupabaseResults, postgrest: FakePostgrest, planted: Planted, fam: Families
) -> None:
    bobs = planted.add_row(fam.qwen, fam.v2, username="bob", job_status="Started")
    before = dict(postgrest.tables["sandbox_jobs"][0])

    with pytest.raises(WriteRefused, match=rf"{bobs}.*'bob'.*'alice'"):
        results.update_row(bobs, owner="alice", status=RowStatus.FINISHED)
    with pytest.raises(WriteRefused, match="'bob'"):
        results.upload_result(bobs, RESULT, owner="alice")

    assert postgrest.tables["sandbox_jobs"][0] == before
    assert [r.params["username"] for r in postgrest.requests if r.method == "PATCH"] == ["eq.alice"]


def test_a_row_that_changes_hands_between_the_read_and_the_upload_is_not_written(
    results: SupabaseResults, postgrest: FakePostgrest
) -> None:
    row = pending_row()
    results.create_row(row)

    def bob_takes_it_over(request: Recorded) -> None:
        if request.method == "PATCH":
            postgrest.tables["sandbox_jobs"][0]["username"] = "bob"

    postgrest.before_each = bob_takes_it_over

    with pytest.raises(WriteRefused, match="'bob'"):
        results.upload_result(row.id, RESULT, owner="alice")

    assert postgrest.tables["sandbox_jobs"][0]["metrics"] is None


def test_upload_is_exactly_once_and_writes_metrics_as_a_list(results: SupabaseResults, postgrest: FakePostgrest) -> None:
    row = pending_row()
    results.create_row(row)

    assert results.upload_result(row.id, RESULT, owner="alice") is True
    assert results.upload_result(row.id, RESULT, owner="alice") is False

    (patch,) = [r for r in postgrest.requests if r.method == "PATCH"]
    assert (patch.params["id"], patch.params["username"]) == (f"eq.{row.id}", "eq.alice")
    stored = postgrest.tables["sandbox_jobs"][0]
    assert stored["metrics"] == [{"name": "accuracy", "value": 0.42}] and stored["job_status"] == "Finished"
    assert (stored["stats"], stored["n_trials"], stored["ended_at"]) == (
        {"n_trials": 290}, 300, "2025-06-02T08:00:00.000000+00:00")
    landed = results.read_row(row.id)
    assert landed is not None and landed.metrics == RESULT.metrics


def test_writes_to_a_missing_row_raise_lookup_error(results: SupabaseResults) -> None:
    with pytest.raises(LookupError):
        results.update_row(str(uuid.uuid4()), owner="alice", slurm_job_id="1")
    with pytest.raises(LookupError):
        results.upload_result(str(uuid.uuid4()), RESULT, owner="alice")


def test_swallowed_writes_are_noticed(results: SupabaseResults, postgrest: FakePostgrest) -> None:
    row = pending_row()
    results.create_row(row)
    postgrest.swallow_writes = True

    with pytest.raises(WriteRefused, match="changed nothing"):
        results.update_row(row.id, owner="alice", status=RowStatus.STARTED)
    with pytest.raises(WriteRefused, match="changed nothing"):
        results.upload_result(row.id, RESULT, owner="alice")
    with pytest.raises(StoreUnavailable, match="did not store"):
        results.create_row(pending_row(model="org/unseen"))

    assert postgrest.tables["sandbox_jobs"][0]["job_status"] == "Pending"


def test_writes_are_retried_and_a_lost_answer_is_harmless(
    results: SupabaseResults, postgrest: FakePostgrest, sleeps: list[float]
) -> None:
    row = pending_row()
    postgrest.fail_next(502, "<html>bad gateway</html>", method="POST")

    results.create_row(row)
    results.update_row(row.id, owner="alice", status=RowStatus.STARTED)

    assert sleeps == [0.5] and len(postgrest.tables["sandbox_jobs"]) == 1


def test_a_readonly_store_refuses_writes_without_a_request(postgrest: FakePostgrest) -> None:
    with SupabaseResults(postgrest.url, postgrest.key, readonly=True) as results:
        for write in (lambda: results.create_row(pending_row()),
                      lambda: results.update_row("x", owner="alice", slurm_job_id="1"),
                      lambda: results.upload_result("x", RESULT, owner="alice")):
            with pytest.raises(WriteRefused, match="read-only"):
                write()
    assert postgrest.requests == []


# --------------------------------------------------------------------------- reading single rows, decoding


def test_read_row_and_undecodable_rows(results: SupabaseResults, postgrest: FakePostgrest, planted: Planted,
                                       fam: Families) -> None:
    good = planted.add_row(fam.qwen, fam.v2, metrics=[{"name": "accuracy", "value": 0.5}])
    bad = planted.add_row(fam.qwen, fam.v2, metrics=[0.5])

    snapshot = results.read_results([MODEL], ["dev_set_v2"])
    postgrest.fail_next(400, {"code": "22P02", "message": 'invalid input syntax for type uuid: "nope"'})

    assert [r.id for r in snapshot.rows] == [good] and snapshot.undecodable[0].startswith(f"row {bad}: ")
    assert results.read_row("nope") is None
    assert results.read_row(str(uuid.uuid4())) is None
    assert postgrest.requests[-1].params["id"].startswith("eq.")
    with pytest.raises(ObservationError, match=bad):
        results.read_row(bad)


# --------------------------------------------------------------------------- URLs, keys, closing


def test_urls_and_keys(postgrest: FakePostgrest) -> None:
    port = postgrest.url.rsplit(":", 1)[1]
    local = supabase_from_url(f"supabase+http://127.0.0.1:{port}", {"SUPABASE_KEY": postgrest.key})
    assert local.read_results(None, None).rows == ()
    local.close()
    remote = supabase_from_url("supabase://project.supabase.co", {"SUPABASE_SERVICE_KEY": "k"}, readonly=True)
    assert (remote.host, remote.readonly) == ("project.supabase.co", True)
    remote.close()

    with pytest.raises(ValueError, match=r"set \$SUPABASE_SERVICE_KEY") as missing:
        supabase_from_url("supabase://project.supabase.co", {"SUPABASE_SERVICE_KEY": ""})
    with pytest.raises(ValueError, match="not in the URL") as inline:
        supabase_from_url("supabase://secret-key@project.supabase.co", {})
    assert "secret-key" not in str(inline.value) and "project.supabase.co" in str(missing.value)
    with pytest.raises(ValueError, match="expected supabase://"):
        supabase_from_url("supabase+ftp://x", {"SUPABASE_KEY": "k"})


def test_close_closes_the_http_client(postgrest: FakePostgrest) -> None:
    results = SupabaseResults(postgrest.url, postgrest.key)
    results.close()

    with pytest.raises(ObservationError, match="closed"):
        results.read_row(str(uuid.uuid4()))
