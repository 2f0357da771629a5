"""One EvalRun over two EvalClusters under the real operator (issue 30, RULES §15): the same placement as evalctl,
cells on both clusters, kubectl shows the clusters, and a change to the second cluster re-runs the EvalRun."""

from __future__ import annotations

import pytest

from controller.adapters.scheduler.local import LocalScheduler
from controller.entry.operator import CLUSTER_REVISION
from tests.fixtures.evalctl import cancel_live_jobs
from tests.kube.conftest import Lab, eventually

pytestmark = pytest.mark.kube
MODELS = ["org/a-8B", "org/b-8B", "org/c-8B"]


def test_an_evalrun_over_two_clusters_places_cells_on_both_and_follows_either_cluster(lab: Lab):
    schedulers = {name: LocalScheduler(lab.root / lab.namespace / f"logs-{name}" / ".local-scheduler")
                  for name in ("a", "b")}
    try:
        lab.start_operator()
        lab.apply(*(_cluster(lab, name) for name in schedulers),
                  lab.run_yaml(MODELS, cluster="clusters: [a, b]", extra="  placement: {strategy: ordered}"))
        lab.wait_condition("Ready")

        status = lab.evalrun()["status"]
        assert status["summary"]["phases"]["Completed"] == len(MODELS)
        placed = status["summary"]["clusters"]
        assert set(placed) == {f"{lab.namespace}/a", f"{lab.namespace}/b"}, placed
        assert sum(placed.values()) == len(MODELS), "each cell ran on exactly one of them"
        ran = {name: len(list(s.observe())) for name, s in schedulers.items()}
        assert ran == {"a": placed[f"{lab.namespace}/a"], "b": placed[f"{lab.namespace}/b"]}, "one job per cell"
        assert lab.jobs() == [], "nothing ran on a cluster the EvalRun does not name"
        wide = lab.kube.kubectl("get", "evalruns", "-n", lab.namespace, "-o", "wide").stdout
        assert '["a","b"]' in wide, wide

        before = _revision(lab)
        lab.kube.kubectl("label", "evalcluster/b", "-n", lab.namespace, "touched=yes")
        eventually(lambda: _revision(lab) != before, "the change to cluster b to re-run the EvalRun")
    finally:
        for scheduler in schedulers.values():
            cancel_live_jobs(scheduler)


def _cluster(lab: Lab, name: str) -> str:
    """The lab's local EvalCluster as `name`, with jobs and logs of its own and one live job at a time."""
    return (lab.cluster_yaml().replace("name: local,", f"name: {name},")
            .replace("jobsDir: jobs", f"jobsDir: jobs-{name}").replace("logsDir: logs", f"logsDir: logs-{name}")
            .replace("  env: ", "  maxLiveJobs: 1\n  env: "))


def _revision(lab: Lab) -> str | None:
    """The EvalRun's mark of the last change to one of its clusters (the operator sets it, and a pass follows)."""
    return (lab.evalrun()["metadata"].get("annotations") or {}).get(CLUSTER_REVISION)
