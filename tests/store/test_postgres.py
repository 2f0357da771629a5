"""What only the PostgreSQL backend has to prove: its schema handling, its pool under threads and outages, its
timeouts, its constant statement count, and expiry by the server's clock. (The rules every backend keeps are
proven by the shared contract suite.)

Every test gets a throwaway database on the lab server; tests that stop the server use a private one.
Synchronisation is on barriers and observable state, never on sleeps.
"""

from __future__ import annotations

import multiprocessing
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, TypeVar

import psycopg
import pytest

from controller.adapters.store import postgres_session
from controller.adapters.store.postgres import PostgresStore
from controller.adapters.store.postgres_session import describe
from controller.core.observed import Metric, RowStatus, Submission, TunnelLease
from controller.core.ports import ObservationError, StoreUnavailable, WriteRefused
from controller.core.records import NewRow, ResultUpload
from controller.core.remedies import CellMemory, QuarantineKind
from controller.core.types import EvalRunRef
from tests.fixtures.evalctl import wait_until
from tests.fixtures.postgres import PgServer, pg_start, pg_stop, throwaway_database

pytestmark = pytest.mark.postgres

T = TypeVar("T")
T0 = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
MODEL = "laion/Qwen3-8B-sft-v3"
BENCHMARK = "dev_set_v2"
PASSWORD = "hunter2-very-secret"
OWN_TABLES = {"evalrun_submissions", "evalrun_leases", "evalrun_cell_owners", "evalrun_tunnel_leases",
              "evalrun_cell_memory", "evalrun_quarantine", "evalrun_model_selections", "evalrun_notify_episodes",
              "evalrun_notifications", "evalrun_row_audit", "evalrun_retry_requests", "evalrun_schema_migrations"}
QWEN = EvalRunRef(name="qwen-evals")
# (version, name) of migrations/*.sql
SHIPPED = [(1, "controller_tables"), (2, "quarantine"), (3, "model_selections"), (4, "gpu_hours"), (5, "notifications"),
           (6, "row_audit"), (7, "quarantine_owner"), (8, "retry_requests"), (9, "submission_cluster"),
           (10, "walltime_learning"), (11, "attempt_size")]
OT_AGENT_TABLES = {"models", "benchmarks", "sandbox_jobs"}
RESULT = ResultUpload(metrics=(Metric(name="accuracy", value=0.42), Metric(name="accuracy_stderr", value=0.03)),
                      stats={"n_trials": 290, "n_infra_errors": 10}, n_trials=300, ended_at=T0)


@pytest.fixture
def pg(pg_url: str) -> Iterator[PostgresStore]:
    store = PostgresStore(pg_url)
    yield store
    store.close()


@contextmanager
def opened(url: str, **options: Any) -> Iterator[PostgresStore]:
    store = PostgresStore(url, **options)
    try:
        yield store
    finally:
        store.close()


def run_sql(url: str, text: str, params: Any = None) -> list[tuple[Any, ...]]:
    """One statement on a connection of its own (not the store's), committed."""
    with psycopg.connect(url, autocommit=True) as conn:
        cursor = conn.execute(text, params)
        return cursor.fetchall() if cursor.description else []


def tables(url: str) -> set[str]:
    return {name for (name,) in run_sql(url, "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")}


def new_row(row_id: str | None = None, *, model: str = MODEL, benchmark: str = BENCHMARK, username: str = "alice",
            status: RowStatus = RowStatus.PENDING) -> NewRow:
    return NewRow(id=row_id or str(uuid.uuid4()), job_name="ev_run", username=username, model_name=model,
                  benchmark_name=benchmark, job_status=status, submitted_at=T0,
                  config={"agent": "terminus-2", "timeout_multiplier": 2.0})


def submission(name: str, evalrun: str = "qwen-evals", cell_key: str = "cell-1") -> Submission:
    return Submission(name=name, run_tag=name, evalrun=evalrun, cell_key=cell_key, attempt=1, fire=1, created_at=T0)


def all_at_once(n: int, job: Callable[[int], T]) -> list[T]:
    """Run job(0..n-1) on n threads released together by a barrier; results in index order."""
    barrier = threading.Barrier(n)

    def released(i: int) -> T:
        barrier.wait(timeout=60)
        return job(i)

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(released, range(n)))


def one_line_without_password(error: BaseException, where: str) -> str:
    message = str(error)
    assert "\n" not in message, message
    assert PASSWORD not in message, message
    assert where in message, message
    return message


# --------------------------------------------------------------------------- schema and migrations


def migration_rows(url: str) -> list[tuple[Any, ...]]:
    return run_sql(url, "SELECT version, name, applied_at FROM evalrun_schema_migrations ORDER BY version")


def test_a_fresh_database_gets_supabase_types_and_each_migration_once(pg_url: str) -> None:
    with opened(pg_url):
        first = migration_rows(pg_url)
    with opened(pg_url):
        again = migration_rows(pg_url)

    assert tables(pg_url) == OT_AGENT_TABLES | OWN_TABLES
    assert [(version, name) for version, name, _ in first] == SHIPPED
    assert again == first, "reopening applies nothing twice"
    types = dict(((table, column), kind) for table, column, kind in run_sql(
        pg_url, "SELECT table_name, column_name, data_type FROM information_schema.columns"
                " WHERE table_schema = current_schema()"))
    assert types["sandbox_jobs", "id"] == types["models", "id"] == types["sandbox_jobs", "model_id"] == "uuid"
    assert types["sandbox_jobs", "metrics"] == types["sandbox_jobs", "config"] == types["sandbox_jobs", "stats"] == "jsonb"
    assert types["sandbox_jobs", "created_at"] == "timestamp with time zone"
    assert types["evalrun_cell_memory", "memory"] == "jsonb"


def test_new_migrations_are_applied_once_each_in_version_order(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with opened(pg_url):
        pass
    shipped = postgres_session.migrations()
    second, third = shipped[-1][0] + 1, shipped[-1][0] + 2
    monkeypatch.setattr(postgres_session, "migrations", lambda: [
        *shipped,
        (second, "second", "CREATE TABLE evalrun_test_second (x integer)"),
        (third, "third", "INSERT INTO evalrun_test_second VALUES (3)"),  # fails unless `second` ran first
    ])

    with opened(pg_url), opened(pg_url):
        pass

    assert [(version, name) for version, name, _ in migration_rows(pg_url)] == [
        *SHIPPED, (second, "second"), (third, "third")]
    assert run_sql(pg_url, "SELECT x FROM evalrun_test_second") == [(3,)]


def test_first_opens_from_several_threads_at_once_all_succeed(pg_url: str) -> None:
    stores = all_at_once(6, lambda _: PostgresStore(pg_url))
    for store in stores:
        store.close()

    assert [(version, name) for version, name, _ in migration_rows(pg_url)] == SHIPPED
    assert tables(pg_url) == OT_AGENT_TABLES | OWN_TABLES


def _open_in_child(url: str, barrier: Any, failures: Any) -> None:
    """A process of its own opening the store (module level: spawned children import it)."""
    barrier.wait(timeout=60)
    try:
        PostgresStore(url).close()
    except Exception as error:
        failures.put(f"{type(error).__name__}: {error}")


def test_first_opens_from_several_processes_at_once_all_succeed(pg_url: str) -> None:
    context = multiprocessing.get_context("spawn")  # no fork of a process that runs pool threads
    barrier, failures = context.Barrier(3), context.Queue()
    children = [context.Process(target=_open_in_child, args=(pg_url, barrier, failures)) for _ in range(3)]
    for child in children:
        child.start()
    for child in children:
        child.join(timeout=120)

    assert [child.exitcode for child in children] == [0, 0, 0]
    assert failures.empty(), failures.get()
    assert [(version, name) for version, name, _ in migration_rows(pg_url)] == SHIPPED


def test_a_readonly_store_creates_nothing_and_reads_empty(pg_url: str) -> None:
    with opened(pg_url, readonly=True) as store:
        results = store.read_results([MODEL], None)
        state = store.read_state("qwen-evals", ["cell-1"], 60)
        holder, row = store.lease_holder("qwen-evals"), store.read_row(str(uuid.uuid4()))
        with pytest.raises(WriteRefused, match="read-only"):
            store.create_row(new_row())
        with pytest.raises(WriteRefused, match="read-only"):
            store.try_lease("qwen-evals", "cli", 60)

    assert (results.rows, results.models, state.submissions, state.cell_owners, holder, row) == ((), (), (), (), None, None)
    assert tables(pg_url) == set()


def test_a_database_migrated_before_quarantines_reads_none_then_gets_the_table_on_a_writable_open(pg_url: str) -> None:
    with opened(pg_url):
        pass
    run_sql(pg_url, "DROP TABLE evalrun_quarantine")
    run_sql(pg_url, "DELETE FROM evalrun_schema_migrations WHERE name IN ('quarantine', 'quarantine_owner')")

    with opened(pg_url, readonly=True) as reader:
        before = reader.read_state(QWEN, [], 60).quarantined
        with opened(pg_url) as writer:
            writer.quarantine(QuarantineKind.NODE, "cluster-a", "node-7", "ECC errors", 3600)
        after = reader.read_state(QWEN, [], 60).quarantined

    assert before == ()
    assert [q.name for q in after] == ["node-7"], "the reader notices the table once it exists"
    assert [(version, name) for version, name, _ in migration_rows(pg_url)] == SHIPPED


def test_a_database_migrated_before_quarantine_owners_is_read_as_it_is_then_gets_the_columns_on_a_writable_open(
        pg_url: str) -> None:
    with opened(pg_url) as store:
        store.quarantine(QuarantineKind.NODE, "lab", "gpu[01-16]", "nccl-timeout", 3600)
    run_sql(pg_url, "ALTER TABLE evalrun_quarantine DROP COLUMN since, DROP COLUMN owner, DROP COLUMN released_at")
    run_sql(pg_url, "DELETE FROM evalrun_schema_migrations WHERE name = 'quarantine_owner'")

    with opened(pg_url, readonly=True) as reader:
        (before,) = reader.live_quarantines()
        assert reader.read_state(QWEN, [], 60).quarantined == (before,)
        with opened(pg_url) as writer:
            assert writer.release_quarantine(QuarantineKind.NODE, "lab", "gpu[01-16]")
            writer.quarantine(QuarantineKind.NODE, "lab", "gpu03", "nccl-timeout", 3600, "sweep")
        (after,) = reader.live_quarantines()

    assert (before.name, before.since, before.owner) == ("gpu[01-16]", None, "")
    assert (after.name, after.owner) == ("gpu03", "sweep") and after.since is not None, \
        "the reader notices the columns once the migration ran"
    assert [(version, name) for version, name, _ in migration_rows(pg_url)] == SHIPPED


def test_a_database_migrated_before_gpu_hours_is_read_as_it_is_then_gets_the_columns_on_a_writable_open(
        pg_url: str) -> None:
    with opened(pg_url) as store:
        store.record_submission(submission("ev_x__a1"))
    run_sql(pg_url, "ALTER TABLE evalrun_submissions DROP COLUMN model, DROP COLUMN benchmark, DROP COLUMN gpu_hours,"
                    " DROP COLUMN finished_at")
    run_sql(pg_url, "DELETE FROM evalrun_schema_migrations WHERE name = 'gpu_hours'")

    with opened(pg_url, readonly=True) as reader:
        (before,) = reader.read_state(QWEN, [], 60, [BENCHMARK]).submissions
        with opened(pg_url) as writer:
            writer.record_job_end(before.name, 1.25, None)
        (after,) = reader.read_state(QWEN, [], 60, [BENCHMARK]).submissions

    assert (before.name, before.gpu_hours) == (after.name, None)
    assert after.gpu_hours == 1.25, "the reader notices the columns once the migration ran"
    assert [(version, name) for version, name, _ in migration_rows(pg_url)] == SHIPPED


def test_a_database_migrated_before_submission_clusters_is_read_as_it_is_then_gets_the_column_on_a_writable_open(
        pg_url: str) -> None:
    with opened(pg_url) as store:
        store.record_submission(submission("ev_x__a1").model_copy(update={"model": MODEL, "benchmark": BENCHMARK}))
        store.record_job_end("ev_x__a1", 2.5, None)
        store.finish_attempt("ev_x__a1")
    run_sql(pg_url, "ALTER TABLE evalrun_submissions DROP COLUMN cluster")
    run_sql(pg_url, "DELETE FROM evalrun_schema_migrations WHERE name = 'submission_cluster'")

    with opened(pg_url, readonly=True) as reader:
        before = reader.read_state(QWEN, [], 60, [BENCHMARK])
        inventory = reader.read_inventory()
        with opened(pg_url) as writer:
            writer.record_submission(submission("ev_y__a1").model_copy(update={"cluster": "lab/hpc"}))
        after = {s.name: s.cluster for s in reader.read_state(QWEN, [], 60).submissions}

    (old,) = before.submissions
    assert (old.gpu_hours, old.cluster) == (2.5, None), "what the database has, and no cluster"
    assert [a.run_tag for a in before.gpu_history] == ["ev_x__a1"], "a column it lacks costs no GPU history"
    assert inventory is not None and [s.cluster for s in inventory.submissions] == [None]
    assert after == {"ev_x__a1": None, "ev_y__a1": "lab/hpc"}, "the reader notices the column once the migration ran"
    assert [(version, name) for version, name, _ in migration_rows(pg_url)] == SHIPPED


# --------------------------------------------------------------------------- the lab's existing tables


LAB_DDL = """
CREATE TABLE models (id {id} PRIMARY KEY, name text NOT NULL, base_model_id {id}, duplicate_of {id} REFERENCES models(id),
                     created_by text, creation_time timestamptz, weights_location text, hf_revision text DEFAULT 'main');
CREATE TABLE benchmarks (id {id} PRIMARY KEY, name text NOT NULL UNIQUE, duplicate_of {id}, suite text);
CREATE TABLE sandbox_jobs (
    id {id} PRIMARY KEY, created_at timestamptz DEFAULT now(), job_name text, username text, submitted_at timestamptz,
    started_at timestamptz, ended_at timestamptz, n_trials integer, n_rep_eval integer, config jsonb, metrics jsonb,
    stats jsonb, model_id {id} REFERENCES models(id), benchmark_id {id} REFERENCES benchmarks(id), agent_id uuid,
    job_status text, slurm_job_id text, hf_traces_link text, is_overlong boolean,
    reviewer_note text NOT NULL DEFAULT '', cost_usd numeric
);
CREATE INDEX lab_jobs_by_user ON sandbox_jobs (username);
"""


def build_lab(url: str, id_type: str, ids: dict[str, str]) -> None:
    """A lab database as another tool made it: extra columns, its own index, a family and two rows."""
    run_sql(url, LAB_DDL.format(id=id_type))
    run_sql(url, "INSERT INTO models (id, name, creation_time) VALUES (%s, %s, %s)", (ids["canon"], MODEL, T0))
    run_sql(url, "INSERT INTO models (id, name, duplicate_of) VALUES (%s, %s, %s)", (ids["dup"], MODEL + "-dup", ids["canon"]))
    run_sql(url, "INSERT INTO benchmarks (id, name) VALUES (%s, %s)", (ids["bench"], BENCHMARK))
    for key, model in (("row1", "canon"), ("row2", "dup")):
        run_sql(url, "INSERT INTO sandbox_jobs (id, username, job_status, model_id, benchmark_id, metrics, reviewer_note,"
                     " cost_usd) VALUES (%s, 'alice', 'Started', %s, %s, '[]', 'checked', 1.5)",
                (ids[key], ids[model], ids["bench"]))


def shape(url: str) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """Columns (name, type, nullability, default) and indexes of the OT-Agent tables."""
    columns = run_sql(url, "SELECT table_name, column_name, data_type, is_nullable, column_default"
                           " FROM information_schema.columns WHERE table_schema = current_schema()"
                           " AND table_name IN ('models', 'benchmarks', 'sandbox_jobs') ORDER BY 1, 2")
    indexes = run_sql(url, "SELECT tablename, indexdef FROM pg_indexes WHERE schemaname = current_schema()"
                           " AND tablename IN ('models', 'benchmarks', 'sandbox_jobs') ORDER BY 1, 2")
    return columns, indexes


@pytest.mark.parametrize("id_type", ["uuid", "text"])
def test_existing_lab_tables_are_used_as_they_are(pg_url: str, id_type: str) -> None:
    """Extra columns, data and indexes stay; text ids (a lab's hand-made copy) work like uuids."""
    ids = {key: str(uuid.uuid4()) if id_type == "uuid" else f"{key}-id" for key in ("canon", "dup", "bench", "row1", "row2")}
    build_lab(pg_url, id_type, ids)
    before = shape(pg_url)

    with opened(pg_url) as store:
        found = store.read_results([MODEL + "-dup"], [BENCHMARK])
        mine = str(uuid.uuid4())
        store.create_row(new_row(mine))
        store.update_row(ids["row1"], owner="alice", status=RowStatus.FINISHED)
        assert store.upload_result(ids["row2"], RESULT, owner="alice")
        row1, created = store.read_row(ids["row1"]), store.read_row(mine)

    assert shape(pg_url) == before
    assert {model.id for model in found.models} == {ids["canon"], ids["dup"]}
    assert sorted(row.id for row in found.rows) == sorted((ids["row1"], ids["row2"]))
    assert row1 is not None and row1.job_status == "Finished"
    assert created is not None and (created.model_id, created.benchmark_id) == (ids["canon"], ids["bench"])
    assert run_sql(pg_url, "SELECT count(*) FROM models") == [(2,)], "the existing canonical model was reused"
    assert run_sql(pg_url, "SELECT reviewer_note, cost_usd FROM sandbox_jobs WHERE id = %s", (ids["row1"],)) == [
        ("checked", 1.5)]


# --------------------------------------------------------------------------- reads


def add_model(url: str, name: str, duplicate_of: str | None = None) -> str:
    model_id = str(uuid.uuid4())
    run_sql(url, "INSERT INTO models (id, name, duplicate_of) VALUES (%s, %s, %s)", (model_id, name, duplicate_of))
    return model_id


def test_families_are_found_from_any_member_and_none_means_everything(pg: PostgresStore, pg_url: str) -> None:
    pg.create_row(new_row(canonical_row := str(uuid.uuid4())))
    (canonical,) = run_sql(pg_url, "SELECT id::text FROM models WHERE name = %s", (MODEL,))[0]
    duplicate, sibling = add_model(pg_url, "dup", canonical), add_model(pg_url, "sibling", canonical)
    pg.create_row(new_row(duplicate_row := str(uuid.uuid4()), model="dup"))
    pg.create_row(new_row(sibling_row := str(uuid.uuid4()), model="sibling"))
    pg.create_row(new_row(other_row := str(uuid.uuid4()), model="someone-else", benchmark="other-bench"))

    via_duplicate = pg.read_results(["dup"], [BENCHMARK])
    everything = pg.read_results(None, None)
    nothing = pg.read_results([], [])

    assert {model.id for model in via_duplicate.models} == {canonical, duplicate, sibling}
    assert {row.id for row in via_duplicate.rows} == {canonical_row, duplicate_row, sibling_row}
    assert {row.id for row in everything.rows} == {canonical_row, duplicate_row, sibling_row, other_row}
    assert (nothing.models, nothing.rows) == ((), ())


def test_rows_that_cannot_be_decoded_are_reported_not_raised(pg: PostgresStore, pg_url: str) -> None:
    good, numeric, garbage, endless = (str(uuid.uuid4()) for _ in range(4))
    for row_id in (good, numeric, garbage, endless):
        pg.create_row(new_row(row_id))
    run_sql(pg_url, "UPDATE sandbox_jobs SET metrics = '42' WHERE id = %s", (numeric,))
    run_sql(pg_url, "UPDATE sandbox_jobs SET metrics = '\"not json\"' WHERE id = %s", (garbage,))
    run_sql(pg_url, "UPDATE sandbox_jobs SET started_at = 'infinity' WHERE id = %s", (endless,))

    snapshot = pg.read_results([MODEL], [BENCHMARK])

    assert [row.id for row in snapshot.rows] == [good]
    assert sorted(reason.split(":")[0] for reason in snapshot.undecodable) == sorted(
        f"row {row_id}" for row_id in (numeric, garbage, endless))


def test_read_results_costs_the_same_statements_for_10_and_2000_names(pg: PostgresStore) -> None:
    pg.create_row(new_row())

    def cost(n: int) -> tuple[int, int, int]:
        names = [MODEL] + [f"org/model-{i}" for i in range(n - 1)]
        queries, round_trips = pg.queries, pg.round_trips
        snapshot = pg.read_results(names, [BENCHMARK, *(f"bench-{i}" for i in range(n - 1))])
        return pg.queries - queries, pg.round_trips - round_trips, len(snapshot.rows)

    few, many = cost(10), cost(2000)
    assert few == many
    assert few == (2, 1, 1), "families and rows: two statements, one round trip"


def test_read_state_is_one_round_trip_of_six_statements_for_10_and_2000_cells(pg: PostgresStore) -> None:
    pg.record_submission(submission("ev_one"))
    pg.quarantine(QuarantineKind.NODE, "cluster-a", "node-7", "ECC errors", 3600)

    def cost(n: int) -> tuple[int, int, int, int]:
        queries, round_trips = pg.queries, pg.round_trips
        state = pg.read_state(QWEN, ["cell-1", *(f"cell-x{i}" for i in range(n - 1))], 3600)
        return pg.queries - queries, pg.round_trips - round_trips, len(state.submissions), len(state.quarantined)

    few, many = cost(10), cost(2000)
    assert few == many
    assert few == (6, 1, 1, 1), "submissions, owners, tunnels, memory, quarantines, retry requests: one round trip"


# --------------------------------------------------------------------------- writes


def test_writes_touch_only_the_owners_rows_forward_and_once(pg: PostgresStore, pg_url: str) -> None:
    row_id = str(uuid.uuid4())
    pg.create_row(new_row(row_id))
    pg.create_row(new_row(row_id, username="bob"))  # an existing id is left as it is

    with pytest.raises(WriteRefused) as refused:
        pg.update_row(row_id, owner="bob", status=RowStatus.STARTED)
    with pytest.raises(WriteRefused):
        pg.upload_result(row_id, RESULT, owner="bob")
    with pytest.raises(LookupError):
        pg.update_row(str(uuid.uuid4()), owner="alice", status=RowStatus.STARTED)
    pg.update_row(row_id, owner="alice", status=RowStatus.STARTED, slurm_job_id="4242")
    pg.update_row(row_id, owner="alice", status=RowStatus.PENDING)  # never back
    first, second = pg.upload_result(row_id, RESULT, owner="alice"), pg.upload_result(row_id, RESULT, owner="alice")

    assert all(word in str(refused.value) for word in (row_id, "'alice'", "'bob'"))
    assert (first, second) == (True, False)
    row = pg.read_row(row_id)
    assert row is not None and (row.username, row.job_status, row.slurm_job_id) == ("alice", "Finished", "4242")
    assert row.metrics == RESULT.metrics
    assert run_sql(pg_url, "SELECT jsonb_typeof(metrics), stats->>'n_infra_errors' FROM sandbox_jobs") == [("array", "10")]


def test_eight_threads_share_one_store_consistently(pg: PostgresStore, pg_url: str) -> None:
    """Leases, claims, row writes and intents from 8 threads at once (more threads than pooled connections).

    Each kind of call is released on all threads together, so they contend for the same rows.
    """
    keys = [f"cell-{i}" for i in range(20)]
    shared_row = str(uuid.uuid4())
    pg.create_row(new_row(shared_row))

    leased = all_at_once(8, lambda i: pg.try_lease("qwen-evals", f"holder-{i}", 3600))
    owner_maps = all_at_once(8, lambda i: pg.claim_cells(f"evalrun-{i}", keys, 3600))
    all_at_once(8, lambda i: pg.create_row(new_row(model="org/brand-new-model", benchmark="brand-new-bench")))
    all_at_once(8, lambda i: pg.record_submission(submission("ev_same_intent")))
    all_at_once(8, lambda i: pg.remember(f"cell-{i}", CellMemory(db_verified=f"seen by {i}")))
    uploaded = all_at_once(8, lambda i: pg.upload_result(shared_row, RESULT, owner="alice"))

    assert leased.count(True) == 1
    assert pg.lease_holder("qwen-evals") == f"holder-{leased.index(True)}"
    assert all(owners == owner_maps[0] for owners in owner_maps) and set(owner_maps[0]) == set(keys)
    assert len(set(owner_maps[0].values())) == 1, "one claim transaction took every free cell"
    state = pg.read_state("qwen-evals", keys, 3600)
    assert {owner.cell_key: owner.evalrun for owner in state.cell_owners} == owner_maps[0]
    assert [s.name for s in state.submissions] == ["ev_same_intent"]
    assert state.cell_memory == {f"cell-{i}": CellMemory(db_verified=f"seen by {i}") for i in range(8)}
    assert uploaded.count(True) == 1, "exactly once"
    assert run_sql(pg_url, "SELECT count(*) FROM models WHERE name = 'org/brand-new-model'") == [(1,)]
    assert run_sql(pg_url, "SELECT count(*) FROM benchmarks WHERE name = 'brand-new-bench'") == [(1,)]
    assert run_sql(pg_url, "SELECT count(*) FROM sandbox_jobs") == [(9,)]


# --------------------------------------------------------------------------- timeouts and outages


def test_a_blocked_statement_times_out_instead_of_hanging(pg_url: str) -> None:
    with opened(pg_url, statement_timeout_s=0.5) as store:
        row_id = str(uuid.uuid4())
        store.create_row(new_row(row_id))
        with psycopg.connect(pg_url) as blocker:  # holds its locks until the end of the block
            blocker.execute("SELECT 1 FROM sandbox_jobs WHERE id = %s FOR UPDATE", (row_id,))
            with pytest.raises(StoreUnavailable, match="statement timeout") as write:
                store.update_row(row_id, owner="alice", status=RowStatus.STARTED)
            blocker.execute("LOCK TABLE sandbox_jobs IN ACCESS EXCLUSIVE MODE")
            with pytest.raises(ObservationError, match="statement timeout") as read:
                store.read_results([MODEL], [BENCHMARK])
            blocker.rollback()
        store.update_row(row_id, owner="alice", status=RowStatus.STARTED)
        row = store.read_row(row_id)

    for error in (write.value, read.value):
        one_line_without_password(error, "127.0.0.1")
    assert row is not None and row.job_status == "Started"


def test_a_stopped_server_fails_reads_and_writes_in_one_line_then_recovers(pg_private_server: PgServer) -> None:
    with throwaway_database(pg_private_server, password=PASSWORD) as url, opened(url, connect_timeout_s=1) as store:
        row_id = str(uuid.uuid4())
        store.create_row(new_row(row_id))
        pg_stop("immediate", pg_private_server)
        try:
            with pytest.raises(ObservationError) as read:
                store.read_results([MODEL], [BENCHMARK])
            with pytest.raises(ObservationError) as state:
                store.read_state("qwen-evals", [], 60)
            with pytest.raises(StoreUnavailable) as write:
                store.update_row(row_id, owner="alice", status=RowStatus.STARTED)
            with pytest.raises(StoreUnavailable) as opening:
                PostgresStore(url, connect_timeout_s=1)
            with opened(url, readonly=True, connect_timeout_s=1) as reader, pytest.raises(ObservationError) as lazy:
                reader.read_results([MODEL], [BENCHMARK])  # a read-only store opens lazily: its reads fail
        finally:
            pg_start(pg_private_server)

        def works() -> bool:
            try:
                store.update_row(row_id, owner="alice", status=RowStatus.STARTED)
            except StoreUnavailable:
                return False
            return True

        wait_until(works, "the store to reconnect after the server restarted", timeout_s=60)
        snapshot = store.read_results([MODEL], [BENCHMARK])

    for error in (read.value, state.value, write.value, opening.value, lazy.value):
        message = one_line_without_password(error, f"postgresql://postgres@127.0.0.1:{pg_private_server.port}/")
        assert "Connection refused" in message or "connect" in message, message
    assert [(row.id, row.job_status) for row in snapshot.rows] == [(row_id, "Started")]


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_a_restart_between_passes_fails_no_operation(pg_private_server: PgServer, mode: str) -> None:
    """The pool's idle connections died with the server: they are skipped, not handed to the next pass."""
    with throwaway_database(pg_private_server) as url, opened(url) as store:
        store.remember("cell-1", CellMemory(db_verified="pass 1"))
        pg_stop("fast" if mode == "fast" else "immediate", pg_private_server)  # (a Literal for the type checker)
        pg_start(pg_private_server)

        store.remember("cell-1", CellMemory(db_verified="pass 2"))
        memory = store.read_state("qwen-evals", ["cell-1"], 60).cell_memory

    assert memory == {"cell-1": CellMemory(db_verified="pass 2")}


def test_messages_name_the_store_without_its_password(pg_server: PgServer) -> None:
    missing = pg_server.url(f"t_missing_{uuid.uuid4().hex[:8]}", PASSWORD)
    with pytest.raises(StoreUnavailable) as no_database:
        PostgresStore(missing, connect_timeout_s=1)
    with pytest.raises(StoreUnavailable) as refused:
        PostgresStore(f"host=127.0.0.1 port=1 user=alice password={PASSWORD} dbname=lab", connect_timeout_s=1)

    assert "does not exist" in one_line_without_password(no_database.value, f"127.0.0.1:{pg_server.port}/t_missing_")
    assert "fix its name" in str(no_database.value)
    one_line_without_password(refused.value, "postgresql://alice@127.0.0.1:1/lab")
    assert describe(f"postgresql://bob:{PASSWORD}@db.example.org:6543/postgres") == "postgresql://bob@db.example.org:6543/postgres"


# --------------------------------------------------------------------------- the server's clock


def test_lease_expiry_is_decided_by_the_database_clock(pg: PostgresStore, pg_url: str) -> None:
    assert pg.try_lease("qwen-evals", "operator", 3600)
    assert not pg.try_lease("qwen-evals", "cli", 3600)
    assert pg.lease_holder("qwen-evals") == "operator"

    assert pg.try_lease("qwen-evals", "operator", 0)  # renewed until the server's now(): already expired
    assert pg.lease_holder("qwen-evals") is None
    assert pg.try_lease("qwen-evals", "cli", 3600)

    # the expiry is compared with the server's now(), whatever time it is on this host
    run_sql(pg_url, "UPDATE evalrun_leases SET expires_at = now() - interval '1 second'")
    assert pg.lease_holder("qwen-evals") is None
    run_sql(pg_url, "UPDATE evalrun_leases SET expires_at = now() + interval '1 hour'")
    assert pg.lease_holder("qwen-evals") == "cli"
    assert not pg.try_lease("qwen-evals", "operator", 3600)


def test_cell_claims_expire_by_the_database_clock(pg: PostgresStore, pg_url: str) -> None:
    qwen, other = EvalRunRef.parse("qwen-evals"), EvalRunRef.parse("other-evals")
    assert pg.claim_cells("qwen-evals", ["cell-1", "cell-2"], 3600) == {"cell-1": qwen, "cell-2": qwen}
    assert pg.claim_cells("other-evals", ["cell-2"], 3600) == {"cell-2": qwen}

    run_sql(pg_url, "UPDATE evalrun_cell_owners SET renewed_at = now() - interval '2 hours' WHERE cell_key = 'cell-2'")
    live = pg.read_state("other-evals", ["cell-1", "cell-2"], 3600).cell_owners
    taken = pg.claim_cells("other-evals", ["cell-2"], 3600)
    renamed = pg.claim_cells("qwen-evals", ["cell-1"], 0)  # its own claim is renewed whatever the TTL

    assert [owner.cell_key for owner in live] == ["cell-1"], "a claim not renewed within the TTL is not live"
    assert taken == {"cell-2": other}
    assert renamed == {"cell-1": qwen}


def test_quarantines_expire_by_the_database_clock(pg: PostgresStore, pg_url: str) -> None:
    pg.quarantine(QuarantineKind.NODE, "cluster-a", "node-7", "ECC errors", 3600)

    run_sql(pg_url, "UPDATE evalrun_quarantine SET until = now() - interval '1 second'")
    expired = pg.read_state(QWEN, [], 60).quarantined
    run_sql(pg_url, "UPDATE evalrun_quarantine SET until = now() + interval '1 hour'")
    live = pg.read_state(QWEN, [], 60).quarantined

    assert expired == ()
    assert [q.name for q in live] == ["node-7"]


def test_an_undecodable_quarantine_fails_the_state_read(pg: PostgresStore, pg_url: str) -> None:
    pg.quarantine(QuarantineKind.NODE, "cluster-a", "node-7", "ECC errors", 3600)
    run_sql(pg_url, "UPDATE evalrun_quarantine SET kind = 'gremlin'")

    with pytest.raises(ObservationError, match="controller state"):
        pg.read_state(QWEN, [], 60)


def test_tunnel_pairs_go_to_one_holder(pg: PostgresStore) -> None:
    lease = TunnelLease(pair="pair-a", holder="ev_job_1", evalrun="qwen-evals", leased_at=T0)
    rival = TunnelLease(pair="pair-a", holder="ev_job_2", evalrun="other-evals", leased_at=T0)
    candidates = [lease if i % 2 else rival for i in range(8)]

    taken = all_at_once(8, lambda i: pg.take_tunnel(candidates[i]))

    (winner,) = pg.read_state("qwen-evals", [], 60).tunnel_leases
    assert taken == [candidate.holder == winner.holder for candidate in candidates]
    assert taken.count(True) == 4, "the winner's own repeats succeed, the rival's all fail"
