"""The reconciler on a real PostgreSQL store: it converges, two loops never double-submit, a lease left by a
reconciler on another host is taken over when the database's clock says it expired, and a database that stops
mid-pass costs nothing but that pass."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from controller.adapters.store import open_store
from controller.api.catalog import load_catalog
from controller.api.loader import load_specs
from controller.core.reconcile import reconcile_pass
from controller.core.store import Store
from controller.core.vocabulary import Phase
from controller.entry.wiring import cluster_ports, targets_for, utc_now
from tests.e2e.conftest import Cluster
from tests.e2e.test_converge import assert_admitted_with_evidence
from tests.fixtures.evalctl import wait_until
from tests.fixtures.postgres import PgServer, pg_start, pg_stop, throwaway_database

pytestmark = pytest.mark.postgres
MODELS = ["org/m1-8B", "org/m2-8B", "org/m3-8B"]
DATASETS = ["DCAgent/tiny"]
FAST = {"FAKE_HARBOR_TASKS": "3"}
HANG = {"FAKE_HARBOR_HANG_AFTER": "1", "FAKE_HARBOR_TASKS": "4"}


def query(url: str, sql: str) -> list[tuple]:
    with psycopg.connect(url, autocommit=True) as conn:
        cursor = conn.execute(sql)
        return cursor.fetchall() if cursor.description else []


@pytest.fixture
def pg_cluster(cluster: Cluster, pg_private_server: PgServer) -> Iterator[Cluster]:
    """On this session's own server: tests here stop it, and the shared one serves the tests running beside them."""
    with throwaway_database(pg_private_server) as url:
        cluster.store = url
        yield cluster


def test_the_demo_converges_on_postgres(pg_cluster: Cluster) -> None:
    pg_cluster.write(models=MODELS[:2], datasets=DATASETS, env=FAST)

    result = pg_cluster.evalctl("reconcile", "--loop", "--interval", "0.3", "--until-done")

    assert "converged after" in result.stdout
    rows = query(pg_cluster.store, "SELECT job_status, jsonb_typeof(metrics), username FROM sandbox_jobs")
    assert sorted(rows) == [("Finished", "array", os.environ.get("USER") or rows[0][2])] * 2
    for metrics, stats in query(pg_cluster.store, "SELECT metrics, stats FROM sandbox_jobs"):
        assert_admitted_with_evidence(metrics, stats, expected=3 * 3)
    again = pg_cluster.evalctl("reconcile", "--once")
    assert "0 action(s) done" in again.stdout, "a converged store gives a pass with nothing to do"


def _loop(cluster: Cluster, log: Path) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "controller.entry.cli", "reconcile", "--loop", "--interval", "0.2",
               "-f", str(cluster.spec), "--store", cluster.store]
    return subprocess.Popen(command, stdout=log.open("wb"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env={**os.environ, "COLUMNS": "250"})


def _passes(log: Path) -> int:
    return log.read_text(errors="replace").count("e2e:")


def test_two_loops_on_one_store_never_double_submit_and_take_over_a_lease(pg_cluster: Cluster) -> None:
    pg_cluster.write(models=MODELS, datasets=DATASETS, env=HANG)
    open_store(pg_cluster.store).close()  # a writable open migrates: the controller tables exist
    # a reconciler on another host held the EvalRun's lease and died: only the database's clock can free it
    query(pg_cluster.store, "INSERT INTO evalrun_leases (name, holder, expires_at) "
                            "VALUES ('evalrun/e2e', 'elsewhere:1:1', now() + interval '8 seconds')")
    logs = [pg_cluster.root / "loop-a.log", pg_cluster.root / "loop-b.log"]
    loops = [_loop(pg_cluster, log) for log in logs]
    try:
        wait_until(lambda: len(pg_cluster.scheduler.observe()) >= len(MODELS), "the lease to expire and a loop to act",
                   timeout_s=120)
        taken_over = [_passes(log) for log in logs]
        wait_until(lambda: all(_passes(log) >= n + 20 for log, n in zip(logs, taken_over, strict=True)),
                   "20 more passes of each loop", timeout_s=180)
        # kill -9 whichever loop holds the lease right now, in the middle of its pass
        pids = {str(loop.pid): loop for loop in loops}
        holder = wait_until(lambda: next((pids[h.split(":")[1]] for (h,) in query(
            pg_cluster.store, "SELECT holder FROM evalrun_leases WHERE name = 'evalrun/e2e'")
            if h.split(":")[1] in pids), None), "a loop to hold the lease", timeout_s=60, step_s=0.01)
        assert isinstance(holder, subprocess.Popen)
        holder.kill()
        survivor_log = logs[1 - loops.index(holder)]
        before = _passes(survivor_log)
        wait_until(lambda: _passes(survivor_log) >= before + 10, "10 passes of the survivor", timeout_s=120)
        last = survivor_log.read_text().split("e2e:")[-3:]
        assert not any("holds the lease" in text for text in last), "the survivor acts again (the holder is dead)"
    finally:
        for loop in loops:
            if loop.poll() is None:
                loop.send_signal(signal.SIGTERM)
        codes = sorted(loop.wait(timeout=60) for loop in loops)
    assert codes == [-signal.SIGKILL, 143], [log.read_text()[-2000:] for log in logs]
    output = "".join(log.read_text() for log in logs)
    assert "another reconciler holds the lease; planned only" in output, "the foreign lease was respected first"
    submissions = query(pg_cluster.store, "SELECT cell_key, count(*) FROM evalrun_submissions GROUP BY cell_key")
    assert sorted(n for _, n in submissions) == [1, 1, 1], submissions
    jobs = pg_cluster.scheduler.observe()
    assert len(jobs) == len(MODELS) and len({j.name for j in jobs}) == len(MODELS), "one job per cell, ever"
    assert "cancel" not in output.lower().replace("cancelled", ""), "no duplicate had to be cancelled"


def _in_process_pass(cluster: Cluster, store: Store) -> list:
    catalog = load_catalog()
    specs = load_specs([cluster.spec], catalog)
    return reconcile_pass(targets_for(specs, catalog), store, cluster_ports(specs, store, catalog), utc_now(),
                          act=True, holder="test")


class _StopsTheDatabaseAfter:
    """Wraps one store method: the database goes down right after it returns, in the middle of the pass."""

    def __init__(self, target: object, method: str, server: PgServer) -> None:
        self.target, self.method, self.server = target, method, server

    def __getattr__(self, name: str) -> object:
        attribute = getattr(self.target, name)
        if name != self.method:
            return attribute

        def then_stop(*args: object, **kwargs: object) -> object:
            result = attribute(*args, **kwargs)
            pg_stop(server=self.server)
            return result

        return then_stop


@pytest.mark.parametrize(("half", "method"), [("results", "read_results"), ("state", "record_submission")],
                         ids=["after-observe", "after-intent"])
def test_the_database_stopping_mid_pass_submits_nothing_and_the_next_pass_converges(
        pg_cluster: Cluster, pg_private_server: PgServer, half: str, method: str) -> None:
    pg_cluster.write(models=MODELS[:2], datasets=DATASETS, env=HANG)
    store = open_store(pg_cluster.store)
    try:
        wrapped = Store(*(_StopsTheDatabaseAfter(part, method, pg_private_server) if name == half else part
                          for name, part in (("results", store.results), ("state", store.state))))
        try:
            [result] = _in_process_pass(pg_cluster, wrapped)  # type: ignore[arg-type]
        finally:
            pg_start(pg_private_server)
        assert pg_cluster.scheduler.observe() == (), "nothing was submitted"
        failed = [o for o in result.outcomes if not o.ok]
        assert result.blocked or failed, "the pass says it could not finish"
        for message in [result.note, *(o.message for o in failed)]:
            assert "\n" not in message and "Traceback" not in message
        [after] = _in_process_pass(pg_cluster, store)
        [settled] = _in_process_pass(pg_cluster, store)
    finally:
        store.close()
    assert all(o.ok for o in after.outcomes), after.outcomes
    jobs = pg_cluster.scheduler.observe()
    assert len(jobs) == 2 and len({j.name for j in jobs}) == 2, "one job per cell after the outage"
    assert {c.phase for c in settled.plan.cells} <= {Phase.SUBMITTED, Phase.RUNNING}
    assert query(pg_cluster.store, "SELECT count(*) FROM evalrun_submissions") == [(2,)]


def test_a_pass_while_the_database_is_down_makes_cells_unknown_with_the_reason(
        pg_cluster: Cluster, pg_private_server: PgServer) -> None:
    pg_cluster.write(models=MODELS[:1], datasets=DATASETS, env=HANG)
    pg_stop(server=pg_private_server)
    try:
        result = pg_cluster.evalctl("reconcile", "--once", check=False)
        plan = pg_cluster.evalctl("plan", check=False)
    finally:
        pg_start(pg_private_server)
    assert result.returncode == 3 and "Traceback" not in result.stderr + result.stdout, "the store was not observed"
    assert pg_cluster.scheduler.observe() == ()
    assert "Unknown" in plan.stdout and "127.0.0.1" in plan.stdout, plan.stdout
