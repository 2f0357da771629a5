"""An EvalRun is `namespace/name` everywhere, and an EvalCluster is looked up in the EvalRun's own namespace.

Two bugs of one root (issue 15): a namespaced EvalRun with one pinggy pair deadlocked after its first
installed-agent cell (its lease carried the bare name, so it was never released), and two EvalClusters named
`hpc` in two namespaces collapsed into the last one read. Real evalctl processes, local scheduler, SQLite.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from controller.adapters.store.sqlite import SqliteStore
from tests.e2e.conftest import FAKE_HARBOR, Cluster

LEGACY_STORE = Path(__file__).parents[1] / "fixtures" / "stores" / "namespaced-pinggy-98fe988.sql"


def write_agents_spec(cluster: Cluster) -> None:
    """The spec the legacy store was made with: two openhands cells, one pinggy pair, namespace `lab`."""
    cluster.write(models=["org/agent-a-8B", "org/agent-b-8B"], datasets=["DCAgent/demo_tiny_a"], name="agents",
                  namespace="lab", env={"FAKE_HARBOR_TASKS": "4", "FAKE_HARBOR_TRIAL_SECONDS": "0.05"},
                  extra_run="""  agent: openhands
  pinggy:
    pairs: [{name: pair-1, url: "https://pair-1.a.pinggy.link", secretRef: {name: pinggy-1, key: token}}]""")


def converge(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> dict:
    monkeypatch.setenv("EVALCTL_SECRET_PINGGY_1_TOKEN", "tok-pair-1")
    result = cluster.evalctl("reconcile", "--loop", "--interval", "0.3", "--until-done")
    assert "converged after" in result.stdout, result.stdout
    [status] = json.loads(cluster.evalctl("status", "-o", "json").stdout)["evalruns"]
    return status


def state(cluster: Cluster, query: str) -> list[tuple]:
    with sqlite3.connect(cluster.root / "store.db") as conn:
        return conn.execute(query).fetchall()


def test_a_namespaced_evalrun_with_one_pinggy_pair_runs_its_installed_agent_cells_one_after_the_other(cluster, monkeypatch):
    write_agents_spec(cluster)

    status = converge(cluster, monkeypatch)

    assert status["name"] == "lab/agents" and status["counts"] == {"Completed": 2}
    assert state(cluster, "SELECT DISTINCT evalrun FROM evalrun_submissions") == [("lab/agents",)]
    assert state(cluster, "SELECT DISTINCT cluster FROM evalrun_submissions") == [("lab/local",)], \
        "each intent names the cluster it went to, namespaced like the EvalRun"
    first, second = sorted(cluster.scheduler.observe(), key=lambda job: int(job.job_id))
    assert first.ended_at is not None and second.submitted_at is not None
    assert second.submitted_at >= first.ended_at, "one pair serves one job at a time"


def test_a_store_written_before_evalrun_refs_releases_the_bare_named_lease_and_converges(cluster, monkeypatch):
    SqliteStore(cluster.root / "store.db").close()  # today's schema; the dump names the columns it had
    with sqlite3.connect(cluster.root / "store.db") as conn:
        conn.executescript(LEGACY_STORE.read_text())
    assert state(cluster, "SELECT evalrun FROM evalrun_tunnel_leases") == [("agents",)], "the stuck lease"
    write_agents_spec(cluster)

    status = converge(cluster, monkeypatch)

    assert status["counts"] == {"Completed": 2}
    assert ("agents",) not in state(cluster, "SELECT evalrun FROM evalrun_tunnel_leases")
    assert state(cluster, "SELECT evalrun FROM evalrun_submissions ORDER BY created_at") == [
        ("agents",), ("lab/agents",)], "the old submission read as this EvalRun's, the new one under its full name"


def test_same_named_clusters_in_two_namespaces_each_run_their_own_evalrun(cluster):
    specs = cluster.root / "specs"
    specs.mkdir()
    for namespace, model in (("north", "org/north-8B"), ("south", "org/south-8B")):
        (specs / f"{namespace}.yaml").write_text(f"""
apiVersion: evalrun.io/v1alpha1
kind: EvalCluster
metadata: {{name: hpc, namespace: {namespace}}}
spec:
  scheduler: {{type: local}}
  jobsDir: {cluster.root}/{namespace}/jobs
  logsDir: {cluster.root}/{namespace}/logs
  jobScript: {FAKE_HARBOR}
  timeLimit: "01:00:00"
  env: {{FAKE_HARBOR_TASKS: "3", FAKE_HARBOR_TRIAL_SECONDS: "0.01"}}
---
apiVersion: evalrun.io/v1alpha1
kind: EvalRun
metadata: {{name: nightly, namespace: {namespace}}}
spec: {{cluster: hpc, models: [{model}], datasets: [DCAgent/demo_tiny_a]}}
""")
    cluster.spec = specs

    validated = cluster.evalctl("validate", "-f", str(specs))
    result = cluster.evalctl("reconcile", "--loop", "--interval", "0.3", "--until-done")

    assert "2 EvalRun(s), 2 EvalCluster(s), 2 cell(s)" in validated.stdout
    assert "converged after" in result.stdout
    for namespace in ("north", "south"):
        [run_dir] = (cluster.root / namespace / "jobs").iterdir()
        assert run_dir.name.startswith(f"ev_org__{namespace}-8B__"), "each EvalRun ran on its own namespace's cluster"


def test_two_tenants_on_one_login_node_and_username_never_act_on_each_others_row(cluster):
    """Tenants of a shared cluster have one username (RULES §2 "ours"): team-b's cell sees team-a's row of the same
    model and benchmark as their evidence. It waits on it, then takes its score; it never resumes team-a's run tag
    with team-a's row id, and never submits a job of its own while team-a's row says one is running."""
    specs = cluster.root / "specs"
    specs.mkdir()

    def tenant(namespace: str) -> None:
        (specs / f"{namespace}.yaml").write_text(f"""
apiVersion: evalrun.io/v1alpha1
kind: EvalCluster
metadata: {{name: shared, namespace: {namespace}}}
spec:
  scheduler: {{type: local}}
  username: evalbot
  jobsDir: {cluster.root}/jobs
  logsDir: {cluster.root}/logs
  jobScript: {FAKE_HARBOR}
  timeLimit: "01:00:00"
  env: {{FAKE_HARBOR_TASKS: "4", FAKE_HARBOR_TRIAL_SECONDS: "0.3", FAKE_HARBOR_INFRA_ERRORS: "0"}}
---
apiVersion: evalrun.io/v1alpha1
kind: EvalRun
metadata: {{name: nightly, namespace: {namespace}}}
spec: {{cluster: shared, models: [org/shared-8B], datasets: [DCAgent/demo_tiny_a]}}
""")
    cluster.spec = specs
    tenant("team-a")
    cluster.evalctl("reconcile", "--once")
    [first] = cluster.scheduler.observe()
    tenant("team-b")

    second_pass = cluster.evalctl("plan", "-o", "json")
    converged = cluster.evalctl("reconcile", "--loop", "--interval", "0.3", "--until-done")

    plans = {p["name"]: p for p in json.loads(second_pass.stdout)["evalruns"]}
    [b_cell] = plans["team-b/nightly"]["cells"]
    assert [a["kind"] for a in b_cell["actions"]] == ["skip"] and "row of evalbot" in b_cell["reason"], b_cell
    assert "converged after" in converged.stdout, converged.stdout
    assert [j.name for j in cluster.scheduler.observe()] == [first.name], "one job in all: team-a's"
    [status_b] = [s for s in json.loads(cluster.evalctl("status", "-o", "json").stdout)["evalruns"]
                  if s["name"] == "team-b/nightly"]
    assert status_b["counts"] == {"Completed": 1}, status_b
    assert state(cluster, "SELECT DISTINCT evalrun FROM evalrun_submissions") == [("team-a/nightly",)]
