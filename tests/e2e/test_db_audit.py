"""`evalctl db audit` on a legacy-shaped results DB (several users, rows that predate the reconciler) whose run dirs
are on disk: it lists exactly the planted bad rows and the provisional ones, `--apply` marks them beside the lab's
tables (sandbox_jobs byte for byte unchanged), a rerun is clean, and bad input writes nothing. SQLite and
PostgreSQL, as a real `evalctl` subprocess."""

from __future__ import annotations

import getpass
import json
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest

from controller.adapters.store import open_store
from controller.api.catalog import load_catalog
from controller.api.loader import load_specs
from controller.core.admission import GATE_VERSION
from controller.entry.wiring import targets_for
from tests.e2e.conftest import Cluster
from tests.fixtures.evalctl import run_evalctl
from tests.fixtures.harbor_dirs import write_config, write_job_result, write_meta_env, write_trial
from tests.fixtures.legacy_db import LegacyDB, LegacyTables, terminus_config
from tests.store.contract.postgres_backend import PostgresTables

MODEL = "lab/Qwen3-8B"
OLD = datetime(2025, 2, 1, 9, tzinfo=UTC)  # before the reconciler existed
SCORE = [{"name": "accuracy", "value": 0.5}, {"name": "n_valid_trials", "value": 20.0}]
# row → (verdict, refusal) that the gate gives it today; every other Finished row of the cell is fine
EXPECTED = {"dead": ("refused", "InfraShare"), "other-model": ("refused", "IdentityMismatch"),
            "reward-7": ("refused", "InvalidReward"), "half": ("refused", "Incomplete"),
            "small": ("provisional", None), "inflated": ("refused", "ScoreDiffers")}
GOOD = {"good", "good-dup-names"}


def write_run(jobs: Path, name: str, *, total: int = 20, trials: int = 20, model: str = MODEL,
              benchmark: str = "tiny", outcome: Callable[[int], dict[str, Any]] = lambda i: {}) -> None:
    """A finished Harbor run dir: `trials` trials of their own task, genuine (the model answered, reward 0 or 1)
    unless `outcome(i)` says otherwise."""
    run = jobs / name
    write_config(run, model=f"hosted_vllm/{model}", dataset=f"DCAgent/{benchmark}")
    write_meta_env(run, MODEL=model, REPO_ID=f"DCAgent/{benchmark}", BENCHMARK_NAME=benchmark,
                   AGENT_NAME="terminus-2", TIMEOUT_MULTIPLIER=2.0)
    for i in range(trials):
        write_trial(run, f"task-{i:03d}__{i:07d}", **({"reward": float(i % 2), "output_tokens": 200} | outcome(i)))
    write_job_result(run, total, n_completed=trials)


def dead_trial(i: int) -> dict[str, Any]:
    """19 of 20 trials: APIConnectionError with no token, in under a second."""
    return {} if i == 0 else {"reward": None, "exception": "APIConnectionError", "output_tokens": 0,
                              "agent_seconds": 0.4}


@dataclass
class Lab:
    cluster: Cluster
    ids: dict[str, str]
    dump: Callable[[], list[Any]]  # every sandbox_jobs row, every column, as stored
    marks: Callable[[], dict[str, tuple[Any, ...]]]  # evalrun_row_audit: row id → (gate, verdict, refusal)


def plant(db: LegacyTables, cluster: Cluster) -> dict[str, str]:
    """The lab's rows and their run dirs; returns the row ids by name."""
    jobs = cluster.root / "jobs"
    qwen = db.add_model(MODEL)
    qwen_copy = db.add_model(f"{MODEL}-copy", duplicate_of=qwen)
    unrelated = db.add_model("lab/Elsewhere-8B")
    tiny = db.add_benchmark("tiny")
    tiny_legacy = db.add_benchmark("tiny_legacy", duplicate_of=tiny)
    [cell] = targets_for(load_specs([cluster.spec], load_catalog()), load_catalog())[0].cells
    ids = {}

    def row(name: str, job_name: str, *, user: str, model: str = qwen, bench: str = tiny, **changes: Any) -> None:
        ids[name] = db.add_row(model, bench, username=user, job_name=job_name, config=terminus_config(job_name),
                               **({"metrics": SCORE, "created_at": OLD, "ended_at": OLD} | changes))

    write_run(jobs, "legacy_good")
    row("good", "legacy_good", user="alice")
    write_run(jobs, "legacy_good_dup", model=f"{MODEL}-copy", benchmark="tiny_legacy")
    row("good-dup-names", "legacy_good_dup", user="bob", model=qwen_copy, bench=tiny_legacy)
    write_run(jobs, "legacy_dead", outcome=dead_trial)
    row("dead", "legacy_dead", user="bob")
    write_run(jobs, cell.run_tag(1), model="org/Other-70B")  # our tag, another model's run
    row("other-model", cell.run_tag(1), user=getpass.getuser())
    write_run(jobs, "legacy_seven", outcome=lambda i: {"reward": 7.0} if i == 3 else {})
    row("reward-7", "legacy_seven", user="carol")
    write_run(jobs, "legacy_half", total=20, trials=10)
    row("half", "legacy_half", user="alice")
    write_run(jobs, "legacy_small", total=5, trials=5)  # 2 of 5 solved
    row("small", "legacy_small", user="bob", metrics=[{"name": "accuracy", "value": 0.4},
                                                      {"name": "n_valid_trials", "value": 5.0}])
    write_run(jobs, "legacy_inflated", total=5, trials=5)
    row("inflated", "legacy_inflated", user="carol")  # 0.5 of 20 trials stored; the gate gives 0.4 of 5
    row("gone", "legacy_deleted_long_ago", user="alice")  # its run dir is gone: not auditable
    write_run(jobs, "legacy_running", total=20, trials=10)
    row("started", "legacy_running", user="alice", job_status="Started", metrics=None)  # not a result yet
    write_run(jobs, "legacy_elsewhere", model="lab/Elsewhere-8B", trials=3)
    row("elsewhere", "legacy_elsewhere", user="alice", model=unrelated)  # no cell of the spec: not audited
    return ids


def write_spec(cluster: Cluster) -> None:
    cluster.write(models=[MODEL], datasets=["DCAgent/tiny"],  # its runs ran each task once, as Harbor's config says
                  extra_run="  nAttempts: 1\n  report: {trustThreshold: 10}")


@pytest.fixture
def sqlite_lab(cluster: Cluster) -> Iterator[Lab]:
    write_spec(cluster)
    path = Path(cluster.store.removeprefix("sqlite:///"))
    db = LegacyDB(path)  # only the old listener's three tables
    ids = plant(db, cluster)
    db.close()

    def query(sql: str) -> list[Any]:
        with sqlite3.connect(path) as conn:
            return conn.execute(sql).fetchall()

    def marks() -> dict[str, tuple[Any, ...]]:
        tables = {name for (name,) in query("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "evalrun_row_audit" not in tables:
            return {}
        return {r[0]: r[1:] for r in query("SELECT row_id, gate, verdict, refusal FROM evalrun_row_audit")}

    yield Lab(cluster, ids, lambda: query("SELECT * FROM sandbox_jobs ORDER BY id"), marks)


@pytest.fixture
def postgres_lab(cluster: Cluster, pg_url: str) -> Iterator[Lab]:
    write_spec(cluster)
    open_store(pg_url).close()  # the lab's tables as Supabase types them (uuid, jsonb, timestamptz), and ours
    tables = PostgresTables(pg_url)
    ids = plant(tables, cluster)
    cluster.store = pg_url

    def query(sql: str) -> list[Any]:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            return conn.execute(sql).fetchall()

    def marks() -> dict[str, tuple[Any, ...]]:
        return {r[0]: r[1:] for r in query("SELECT row_id, gate, verdict, refusal FROM evalrun_row_audit")}

    yield Lab(cluster, ids, lambda: query("SELECT to_jsonb(t)::text FROM sandbox_jobs t ORDER BY id"), marks)
    tables.close()


def audit(lab: Lab, *args: str, spec: Path | None = None) -> tuple[int, str, str]:
    result = run_evalctl(("db", "audit", "-f", str(spec or lab.cluster.spec), "--store", lab.cluster.store, *args),
                         spec=lab.cluster.spec, store=lab.cluster.store, env={"PATH": "/usr/bin:/bin"},
                         check=False, timeout=120)
    return result.returncode, result.stdout, result.stderr


def by_name(lab: Lab, rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    names = {row_id: name for name, row_id in lab.ids.items()}
    return {names[r["row"]]: r for r in rows}


def check_audit_apply_rerun(lab: Lab) -> None:
    before = lab.dump()

    code, out, err = audit(lab, "-o", "json")
    assert code == 1, err
    report = json.loads(out)
    rows = by_name(lab, report["rows"])
    findings = {name: (r["verdict"], r["refusal"]) for name, r in rows.items() if r["verdict"] != "ok"}
    assert findings == EXPECTED, "exactly the planted rows"
    assert {name for name, r in rows.items() if r["verdict"] == "ok"} == GOOD
    assert rows["small"]["n_scored"] == 5 and rows["dead"]["username"] == "bob" and rows["dead"]["accuracy"] == 0.5
    assert "19 of 20 trials are infra" in rows["dead"]["reason"]
    assert "org/Other-70B" in rows["other-model"]["reason"]
    assert "10 of 20 expected trials" in rows["half"]["reason"]
    assert rows["inflated"]["reason"] == "the gate gives 0.4000 (n=5) where the row holds 0.5"
    assert (report["new"], report["already_marked"], report["not_auditable"]) == (6, 0, 1)
    assert [u["row_id"] for u in report["not_auditable_rows"]] == [lab.ids["gone"]]

    code, table, err = audit(lab)
    assert code == 1, err
    for name in EXPECTED:
        assert lab.ids[name] in table, f"{name} is listed"
    for name in (*GOOD, "gone", "started", "elsewhere"):
        assert lab.ids[name] not in table, f"{name} is not listed"
    assert "provisional, n=5" in table and "InfraShare" in table and "--apply marks them" in table
    assert lab.marks() == {} and lab.dump() == before, "without --apply nothing is written"

    code, out, err = audit(lab, "--apply")
    assert code == 0, out + err
    assert "marked 6 row(s) in evalrun_row_audit" in out
    assert lab.marks() == {lab.ids[name]: (GATE_VERSION, verdict, refusal) for name, (verdict, refusal) in EXPECTED.items()}
    assert lab.dump() == before, "sandbox_jobs unchanged, other users' rows included"

    code, out, err = audit(lab, "-o", "json")
    assert code == 0, out + err
    again = json.loads(out)
    assert (again["new"], again["already_marked"]) == (0, 6), "a rerun is clean"
    code, table, err = audit(lab, "--apply")
    assert code == 0 and "marked 0 row(s)" in table and "6 already marked" in table, table + err
    assert lab.dump() == before


def check_bad_input_writes_nothing(lab: Lab) -> None:
    before, marks = lab.dump(), lab.marks()
    broken = lab.cluster.root / "broken.yaml"
    broken.write_text(lab.cluster.spec.read_text().replace("datasets:", "datasetz:"))

    code, _, err = audit(lab, "--apply", spec=broken)
    missing_file, _, missing_err = audit(lab, "--apply", spec=lab.cluster.root / "nope.yaml")

    assert code == 2 and "broken.yaml:" in err and "Traceback" not in err, err
    assert missing_file == 2, missing_err
    assert lab.dump() == before and lab.marks() == marks


def test_db_audit_on_a_legacy_sqlite_db(sqlite_lab: Lab) -> None:
    check_bad_input_writes_nothing(sqlite_lab)
    path = sqlite_lab.cluster.store.removeprefix("sqlite:///")
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT count(*) FROM sqlite_master WHERE name LIKE 'evalrun_%'").fetchone() == (0,), \
            "bad input did not even open the store for writing"
    check_audit_apply_rerun(sqlite_lab)


@pytest.mark.postgres
def test_db_audit_on_a_legacy_postgres_db(postgres_lab: Lab) -> None:
    check_bad_input_writes_nothing(postgres_lab)
    check_audit_apply_rerun(postgres_lab)


def test_apply_through_supabase_is_refused_before_anything_is_read(cluster: Cluster) -> None:
    write_spec(cluster)
    result = run_evalctl(("db", "audit", "-f", str(cluster.spec), "--store", "supabase://example.supabase.co",
                          "--apply"), spec=cluster.spec, store=cluster.store, env={"PATH": "/usr/bin:/bin"},
                         check=False)
    assert result.returncode == 2 and "postgresql://" in result.stderr, result.stderr
