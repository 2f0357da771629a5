"""Opening a writable store creates what is missing and nothing else, however often it happens."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from controller.adapters.store.sqlite import SqliteStore
from controller.core.ports import ObservationError
from controller.core.remedies import QuarantineKind
from controller.core.types import EvalRunRef
from tests.fixtures.legacy_db import Families, LegacyDB
from tests.store.builders import submission

ALL_TABLES = {"models", "benchmarks", "sandbox_jobs", "evalrun_submissions", "evalrun_leases",
              "evalrun_tunnel_leases", "evalrun_cell_owners", "evalrun_cell_memory", "evalrun_quarantine",
              "evalrun_model_selections", "evalrun_notify_episodes", "evalrun_notifications",
              "evalrun_row_audit", "evalrun_retry_requests"}


def schema(path: Path) -> list[tuple]:
    with sqlite3.connect(path) as conn:
        return conn.execute("SELECT type, name, sql FROM sqlite_master ORDER BY name").fetchall()


def test_open_creates_every_table_and_reopening_changes_nothing(db_path: Path) -> None:
    SqliteStore(db_path).close()
    first = schema(db_path)
    SqliteStore(db_path).close()
    SqliteStore(db_path).close()

    assert {name for kind, name, _ in first if kind == "table"} == ALL_TABLES
    assert schema(db_path) == first


def test_store_uses_wal_for_two_processes(db_path: Path) -> None:
    SqliteStore(db_path).close()

    with sqlite3.connect(db_path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)


def test_writable_open_of_a_legacy_db_adds_own_tables_and_keeps_rows(
    legacy: tuple[LegacyDB, Families], db_path: Path
) -> None:
    db, fam = legacy
    row = db.add_row(fam.qwen, fam.v2, metrics=[{"name": "accuracy", "value": 0.5}])

    store = SqliteStore(db_path)
    snapshot = store.read_results(["laion/Qwen3-8B-sft-v3"], ["dev_set_v2"])
    store.close()

    assert {name for kind, name, _ in schema(db_path) if kind == "table"} == ALL_TABLES
    assert [r.id for r in snapshot.rows] == [row]


def test_parent_directories_are_created(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "store.db"

    SqliteStore(path).close()

    assert path.exists()


def test_a_store_made_before_quarantines_reads_none_read_only_and_gets_the_table_when_opened_writable(
    db_path: Path,
) -> None:
    SqliteStore(db_path).close()
    with sqlite3.connect(db_path) as conn:
        conn.execute("DROP TABLE evalrun_quarantine")

    reader = SqliteStore(db_path, readonly=True)
    before = reader.read_state(EvalRunRef(name="any"), [], 60).quarantined
    writer = SqliteStore(db_path)
    writer.quarantine(QuarantineKind.NODE, "cluster-a", "node-7", "ECC errors", 3600)
    after = reader.read_state(EvalRunRef(name="any"), [], 60).quarantined
    reader.close()
    writer.close()

    assert before == ()
    assert [q.name for q in after] == ["node-7"]


PRE_OWNER_QUARANTINE = """
CREATE TABLE evalrun_quarantine (kind TEXT NOT NULL, scope TEXT NOT NULL, name TEXT NOT NULL, reason TEXT NOT NULL,
                                 until TEXT NOT NULL, PRIMARY KEY (kind, scope, name));
INSERT INTO evalrun_quarantine VALUES ('node', 'lab', 'gpu[01-16]', 'nccl-timeout', '2999-01-01T00:00:00.000000+00:00');
"""


def test_a_store_made_before_quarantine_owners_is_read_as_it_is_and_gets_the_columns_when_opened_writable(
    db_path: Path,
) -> None:
    with sqlite3.connect(db_path) as conn:
        conn.executescript(PRE_OWNER_QUARANTINE)
    reader = SqliteStore(db_path, readonly=True)
    (old,) = reader.live_quarantines()
    assert reader.read_state(EvalRunRef(name="any"), [], 60).quarantined == (old,)
    assert (old.name, old.since, old.owner) == ("gpu[01-16]", None, ""), "a reader never alters the file"

    writer = SqliteStore(db_path)
    assert writer.release_quarantine(QuarantineKind.NODE, "lab", "gpu[01-16]"), "a legacy record can be lifted"
    writer.quarantine(QuarantineKind.NODE, "lab", "gpu03", "nccl-timeout", 3600, "sweep")
    SqliteStore(db_path).close()  # a second writable open finds nothing left to add
    (new,) = reader.live_quarantines()
    reader.close()
    writer.close()

    assert (new.name, new.owner) == ("gpu03", "sweep") and new.since is not None
    with sqlite3.connect(db_path) as conn:
        columns = [name for (name,) in conn.execute("SELECT name FROM pragma_table_info('evalrun_quarantine')")]
    assert columns[-3:] == ["since", "owner", "released_at"]


@pytest.mark.parametrize(("column", "value"), [("kind", "gremlin"), ("until", "next tuesday")])
def test_an_undecodable_quarantine_fails_the_state_read(db_path: Path, column: str, value: str) -> None:
    store = SqliteStore(db_path)
    store.quarantine(QuarantineKind.NODE, "cluster-a", "node-7", "ECC errors", 3600)
    with sqlite3.connect(db_path) as conn:
        conn.execute(f"UPDATE evalrun_quarantine SET {column} = ?", (value,))

    with pytest.raises(ObservationError, match=db_path.name):
        store.read_state(EvalRunRef(name="any"), [], 60)
    store.close()


PRE_GPU_SUBMISSIONS = """
CREATE TABLE evalrun_submissions (
    name TEXT PRIMARY KEY, run_tag TEXT NOT NULL, evalrun TEXT NOT NULL, cell_key TEXT NOT NULL,
    attempt INTEGER NOT NULL, fire INTEGER NOT NULL, row_id TEXT, job_id TEXT, created_at TEXT NOT NULL);
INSERT INTO evalrun_submissions VALUES ('ev_x__a1', 'ev_x__a1', 'qwen-evals', 'cell-x', 1, 1, NULL, '77',
                                        '2025-06-01T12:00:00+00:00');
"""


def test_a_store_made_before_gpu_hours_is_read_as_it_is_and_gets_the_columns_when_opened_writable(
    db_path: Path,
) -> None:
    with sqlite3.connect(db_path) as conn:
        conn.executescript(PRE_GPU_SUBMISSIONS)
    reader = SqliteStore(db_path, readonly=True)
    (old,) = reader.read_state(EvalRunRef(name="qwen-evals"), [], 60, ["tb2"]).submissions
    assert (old.job_id, old.gpu_hours) == ("77", None), "a reader never alters the file, and reads what is there"

    writer = SqliteStore(db_path)
    writer.record_job_end("ev_x__a1", 1.25, None)
    SqliteStore(db_path).close()  # a second writable open finds nothing left to add
    (upgraded,) = reader.read_state(EvalRunRef(name="qwen-evals"), [], 60, ["tb2"]).submissions
    reader.close()
    writer.close()

    assert (upgraded.job_id, upgraded.gpu_hours) == ("77", 1.25)
    with sqlite3.connect(db_path) as conn:
        columns = [name for (name,) in conn.execute("SELECT name FROM pragma_table_info('evalrun_submissions')")]
    assert columns[-9:] == ["model", "benchmark", "gpu_hours", "finished_at", "cluster", "estimated_hours",
                            "elapsed_hours", "trials", "concurrency"]


PRE_CLUSTER_SUBMISSIONS = """
CREATE TABLE evalrun_submissions (
    name TEXT PRIMARY KEY, run_tag TEXT NOT NULL, evalrun TEXT NOT NULL, cell_key TEXT NOT NULL,
    attempt INTEGER NOT NULL, fire INTEGER NOT NULL, row_id TEXT, job_id TEXT, created_at TEXT NOT NULL,
    model TEXT, benchmark TEXT, gpu_hours REAL, finished_at TEXT);
INSERT INTO evalrun_submissions VALUES ('ev_x__a1', 'ev_x__a1', 'qwen-evals', 'cell-x', 1, 1, NULL, '77',
                                        '2025-06-01T12:00:00+00:00', 'org/x-8B', 'tb2', 2.5,
                                        '2025-06-01T14:00:00+00:00');
"""


def test_a_store_made_before_submission_clusters_is_read_as_it_is_and_gets_the_column_when_opened_writable(
    db_path: Path,
) -> None:
    with sqlite3.connect(db_path) as conn:
        conn.executescript(PRE_CLUSTER_SUBMISSIONS)
    reader = SqliteStore(db_path, readonly=True)
    before = reader.read_state(EvalRunRef(name="qwen-evals"), [], 60, ["tb2"])
    (old,) = before.submissions
    assert (old.job_id, old.gpu_hours, old.cluster) == ("77", 2.5, None), "what the file has, and no cluster"
    assert [a.run_tag for a in before.gpu_history] == ["ev_x__a1"], "a column the file lacks costs no GPU history"
    inventory = reader.read_inventory()
    assert inventory is not None and [s.cluster for s in inventory.submissions] == [None]

    writer = SqliteStore(db_path)
    writer.record_submission(submission("ev_y__a1").model_copy(update={"cluster": "lab/hpc"}))
    SqliteStore(db_path).close()  # a second writable open finds nothing left to add
    after = {s.name: s.cluster for s in reader.read_state(EvalRunRef(name="qwen-evals"), [], 60).submissions}
    reader.close()
    writer.close()

    assert after == {"ev_x__a1": None, "ev_y__a1": "lab/hpc"}
    with sqlite3.connect(db_path) as conn:
        columns = [name for (name,) in conn.execute("SELECT name FROM pragma_table_info('evalrun_submissions')")]
    assert columns[-5:] == ["cluster", "estimated_hours", "elapsed_hours", "trials", "concurrency"]
