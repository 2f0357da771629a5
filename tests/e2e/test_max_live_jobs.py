"""`maxLiveJobs` on an EvalCluster: a ceiling on our queued + running jobs there, counted from the queue every pass,
so it holds across EvalRuns and passes; and launches on a cluster are one pass's at a time (its launch lease,
taken before the queue is read), so it holds across processes too (issue 20). The jobs hang: they stay live."""

from __future__ import annotations

import json

from controller.adapters.process import process_identity
from controller.adapters.store.sqlite import SqliteStore
from controller.api.catalog import load_catalog
from controller.api.loader import load_specs
from controller.core.reconcile import reconcile_pass
from controller.core.store import Store
from controller.entry.wiring import cluster_ports, targets_for, utc_now

HANGING = {"FAKE_HARBOR_HANG_AFTER": "1", "FAKE_HARBOR_TASKS": "4"}


def _two_evalruns(cluster, max_live: int) -> None:
    cluster.write(models=["org/a-8B", "org/b-8B", "org/c-8B"], datasets=["DCAgent/tiny_a"], max_live=max_live,
                  env=HANGING)
    first = cluster.spec.read_text()
    second = first[first.index("kind: EvalRun"):].replace("name: e2e", "name: e2e-second").replace("org/", "lab/")
    cluster.spec.write_text(f"{first}\n---\napiVersion: evalrun.io/v1alpha1\n{second}")


def _live(cluster) -> list[str]:
    return [job.job_id for job in cluster.scheduler.observe() if job.state.active]


def _waiting_reasons(cluster) -> list[str]:
    plan = json.loads(cluster.evalctl("plan", "-o", "json").stdout)
    return [a["reason"] for run in plan["evalruns"] for c in run["cells"] for a in c["actions"] if a["kind"] == "wait"]


def test_the_ceiling_holds_across_evalruns_and_passes_and_a_freed_slot_is_used(cluster) -> None:
    _two_evalruns(cluster, max_live=2)
    for _ in range(3):
        cluster.evalctl("reconcile", "--once")
        assert len(_live(cluster)) == 2, "at most maxLiveJobs of our jobs queued or running"
    assert _waiting_reasons(cluster).count("cluster at maxLiveJobs (2 live)") == 4, "six cells, two live"

    cluster.scheduler.cancel(_live(cluster)[0])
    out = cluster.evalctl("reconcile", "--once").stdout
    assert out.count("submitted job") == 1, out
    assert len(_live(cluster)) == 2


def test_a_pass_of_another_process_launching_on_the_cluster_makes_this_one_launch_nothing(cluster) -> None:
    """What keeps two processes from both seeing room: the cluster's launch lease, held here by a live holder."""
    _two_evalruns(cluster, max_live=10)
    store = SqliteStore(cluster.root / "store.db")
    other = f"{process_identity()}#another-pass"  # this test's own process: alive
    assert store.try_lease("launch/local", other, 600)
    try:
        out = cluster.evalctl("reconcile", "--once").stdout
        assert "submitted job" not in out and _live(cluster) == [], out
        assert out.count("3 × wait: another pass is launching on this cluster; next pass") == 2, out
    finally:
        store.release_lease("launch/local", other)
        store.close()
    out = cluster.evalctl("reconcile", "--once").stdout
    assert out.count("submitted job") == 6, out
    assert SqliteStore(cluster.root / "store.db").lease_holder("launch/local") is None, "released after the pass"


def test_a_launch_lease_an_ended_pass_of_this_process_left_is_taken_over(cluster) -> None:
    """Its release failed (the store was down): the same process's next pass must not wait out the TTL."""
    _two_evalruns(cluster, max_live=10)
    store = SqliteStore(cluster.root / "store.db")
    assert store.try_lease("launch/local", "this-process#an-ended-pass", 600)
    catalog = load_catalog()
    specs = load_specs([cluster.spec], catalog)
    both = Store(store, store)
    try:
        results = reconcile_pass(targets_for(specs, catalog), both, cluster_ports(specs, both, catalog), utc_now(),
                                 act=True, holder="this-process")
    finally:
        both.close()
    assert sum(o.ok for r in results for o in r.outcomes if o.action == "submit") == 6, results
