"""forceEval on every backend: a real pass adds a row of ours next to another user's Finished row and leaves
theirs byte for byte as it was (RULES §1: own rows only; §2: forceEval adds a NEW row)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from controller.adapters.scheduler.local import LocalScheduler
from controller.adapters.store.sqlite import SqliteStore
from controller.api.catalog import load_catalog
from controller.api.loader import load_specs
from controller.core.reconcile import reconcile_pass
from controller.core.store import Store
from controller.entry.wiring import cluster_ports, targets_for
from tests.fixtures.evalctl import cancel_live_jobs
from tests.fixtures.legacy_db import terminus_config
from tests.store.contract.conftest import Backend

FAKE_HARBOR = Path(__file__).resolve().parents[3] / "specs" / "demo" / "fake_harbor.py"


def test_force_eval_never_touches_another_users_row(results_backend: Backend, tmp_path: Path) -> None:
    db = results_backend.legacy
    model = db.add_model("org/m1-8B")
    bench = db.add_benchmark("tiny")
    bobs = db.add_row(model, bench, username="bob", metrics=[{"name": "accuracy", "value": 0.9}],
                      config=terminus_config())
    before = results_backend.raw_row(bobs)
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"""
apiVersion: evalrun.io/v1alpha1
kind: EvalCluster
metadata: {{name: local}}
spec: {{scheduler: {{type: local}}, jobsDir: {tmp_path}/jobs, logsDir: {tmp_path}/logs, jobScript: {FAKE_HARBOR},
        username: alice, env: {{FAKE_HARBOR_HANG_AFTER: "0"}}}}
---
apiVersion: evalrun.io/v1alpha1
kind: EvalRun
metadata: {{name: forced}}
spec: {{cluster: local, models: [org/m1-8B], datasets: [DCAgent/tiny], forceEval: true}}
""")
    catalog = load_catalog()
    specs = load_specs([spec], catalog)
    state = results_backend.state or SqliteStore(tmp_path / "state.db")
    store = Store(results_backend.results, state)
    try:
        [result] = reconcile_pass(targets_for(specs, catalog), store, cluster_ports(specs, store, catalog),
                                  datetime.now(UTC), act=True, holder="test")
        rows = results_backend.results.read_results(["org/m1-8B"], ["tiny"]).rows
    finally:
        cancel_live_jobs(LocalScheduler(tmp_path / "logs" / ".local-scheduler"))
        if state is not results_backend.state:
            state.close()
    assert [o.action for o in result.outcomes if o.ok] == ["submit"], result.outcomes
    assert sorted((r.username, r.job_status) for r in rows) == [("alice", "Pending"), ("bob", "Finished")]
    assert results_backend.raw_row(bobs) == before
