"""A multi-cluster EvalRun's target (issue 30): one lane per cluster, spec order, each with its resolution of the
cells it may run and why it may not run the others; a single-cluster EvalRun's target is what it always was."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from controller.api.catalog import CATALOG_DIR_ENV, load_catalog
from controller.api.loader import SpecSet, load_specs
from controller.core.placement import PlacementPolicy
from controller.core.run_target import RunTarget
from controller.core.types import ClusterRef
from controller.entry.explaining import specs_holding
from controller.entry.wiring import targets_for

A, B = ClusterRef(name="a"), ClusterRef(name="b")


def target(tmp_path: Path, run: str, *, b: str = "") -> RunTarget:
    """The target of EvalRun `run` (its spec's body) over EvalClusters a (maxTimeLimit 72 h) and b (24 h)."""
    clusters = "".join(f"""
apiVersion: evalrun.io/v1alpha1
kind: EvalCluster
metadata: {{name: {name}}}
spec: {{scheduler: {{type: local}}, jobsDir: {tmp_path}/{name}, logsDir: {tmp_path}/logs, jobScript: /bin/true,
        {extra}}}
---""" for name, extra in (("a", "maxTimeLimit: '72:00:00', maxSubmissionsPerPass: 3"),
                          ("b", b or "maxLiveJobs: 5")))
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"{clusters}\napiVersion: evalrun.io/v1alpha1\nkind: EvalRun\nmetadata: {{name: r}}\nspec:\n"
                    f"{run}")
    [found] = targets_for(load_specs([spec]), load_catalog())
    return found


def test_one_lane_per_cluster_in_spec_order_each_with_its_own_policy(tmp_path: Path) -> None:
    found = target(tmp_path, "  clusters: [b, a]\n  models: [org/m1-8B, org/m2-8B]\n  presets: [tb2]\n")

    assert [lane.cluster for lane in found.lanes] == [B, A]
    assert (found.cluster, found.policy) == (B, found.lanes[0].policy), "the first lane's"
    assert [lane.policy.cluster for lane in found.lanes] == ["b", "a"]
    assert [lane.policy.max_live_jobs for lane in found.lanes] == [5, 50]
    assert [lane.policy.max_submissions_per_pass for lane in found.lanes] == [6, 3]
    assert [[c.cluster for c in lane.cells] for lane in found.lanes] == [["b", "b"], ["a", "a"]]
    assert [c.key for c in found.lanes[0].cells] == [c.key for c in found.lanes[1].cells], "one cell everywhere"
    assert found.cells == found.lanes[0].cells
    assert found.placement == PlacementPolicy(strategy="soonest", spill_after=timedelta(hours=1)), "the defaults"
    assert all(lane.ineligible == {} for lane in found.lanes)


def test_a_cluster_that_cannot_give_the_whole_walltime_does_not_run_the_cell(tmp_path: Path) -> None:
    found = target(tmp_path, "  clusters: [b, a]\n  models: [org/m1-8B]\n  presets: [tb2, swebench_full]\n"
                             "  placement: {strategy: ordered}\n")
    tb2, swebench = found.cells

    b_lane, a_lane = found.lanes
    assert [c.benchmark for c in b_lane.cells] == ["tb2"], "b allows 24 h: swebench_full needs 48"
    assert b_lane.ineligible == {swebench.key: "needs 48:00:00; b allows at most 24:00:00"}
    assert b_lane.too_long == {swebench.key}, "the walltime is what keeps it off b: its maxTimeLimit is the fix"
    assert [(c.benchmark, c.time_limit) for c in a_lane.cells] == [("tb2", "24:00:00"), ("swebench_full", "48:00:00")]
    assert a_lane.ineligible == {}
    assert [(c.cluster, c.time_limit) for c in found.cells] == [("b", "24:00:00"), ("a", "48:00:00")], \
        "each cell as the first lane that lists it resolves it"
    assert tb2.key == b_lane.cells[0].key
    assert found.placement == PlacementPolicy(strategy="ordered", spill_after=timedelta(hours=1))


def test_a_cell_no_cluster_can_run_stays_a_cell_with_every_lanes_reason(tmp_path: Path) -> None:
    found = target(tmp_path, "  clusters: [a, b]\n  models: [org/m1-8B]\n  presets: [swebench_full]\n"
                             "  placement: {pin: [{models: ['org/*'], cluster: b}]}\n", b="maxTimeLimit: '30:00:00'")
    [cell] = found.cells

    assert [lane.cells for lane in found.lanes] == [(cell,), ()], "the first lane lists it: the planner holds it there"
    assert [lane.ineligible for lane in found.lanes] == [{cell.key: "pinned to b"},
                                                         {cell.key: "needs 48:00:00; b allows at most 30:00:00"}]
    assert [lane.too_long for lane in found.lanes] == [frozenset(), {cell.key}], "a pin is not a walltime"
    assert (cell.cluster, cell.time_limit) == ("a", "48:00:00"), "the first cluster's resolution, for the planner"


def test_a_pinned_model_runs_only_on_its_cluster(tmp_path: Path) -> None:
    found = target(tmp_path, "  clusters: [a, b]\n  models: [org/m1-8B, big/m2-70B]\n  presets: [tb2]\n"
                             "  placement: {pin: [{models: ['BIG/*'], cluster: b}]}\n")
    small, big = found.cells

    a_lane, b_lane = found.lanes
    assert [c.model for c in a_lane.cells] == ["org/m1-8B"]
    assert a_lane.ineligible == {big.key: "pinned to b"}
    assert [c.model for c in b_lane.cells] == ["org/m1-8B", "big/m2-70B"]
    assert b_lane.ineligible == {}
    assert [(c.model, c.cluster) for c in found.cells] == [("org/m1-8B", "a"), ("big/m2-70B", "b")]
    assert small.key == a_lane.cells[0].key


def test_a_cluster_resolving_the_cell_to_another_configuration_does_not_run_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    catalog = tmp_path / "catalog"
    catalog.mkdir()
    (catalog / "model_registry.yaml").write_text("models:\n  org/m1-8B:\n    variants:\n      h100:\n"
                                                  "        harbor_config: h100.yaml\n")
    monkeypatch.setenv(CATALOG_DIR_ENV, str(catalog))
    found = target(tmp_path, "  clusters: [a, b]\n  models: [org/m1-8B]\n  datasets: [DCAgent/tiny]\n",
                   b="hardwareProfile: h100")
    [cell] = found.cells

    assert found.lanes[0].cells == (cell,)
    assert found.lanes[1].cells == ()
    assert found.lanes[1].ineligible == {cell.key: "resolves to another configuration on b (hardwareProfile h100): "
                                                   "it runs as a resolves it"}


def test_a_single_cluster_evalrun_has_no_lanes_and_clamps_its_walltime(tmp_path: Path) -> None:
    found = target(tmp_path, "  cluster: b\n  models: [org/m1-8B]\n  presets: [swebench_full]\n")

    assert (found.lanes, found.placement, found.cluster) == ((), None, B)
    assert [c.time_limit for c in found.cells] == ["24:00:00"], "clamped, resumed in chunks, as before"


def two_cluster_specs(tmp_path: Path) -> SpecSet:
    spec = tmp_path / "spec.yaml"
    spec.write_text("".join(f"""
apiVersion: evalrun.io/v1alpha1
kind: EvalCluster
metadata: {{name: {name}}}
spec: {{scheduler: {{type: local}}, jobsDir: {tmp_path}/{name}, logsDir: {tmp_path}/logs, jobScript: /bin/true}}
---""" for name in "ab") + """
apiVersion: evalrun.io/v1alpha1
kind: EvalRun
metadata: {name: r}
spec:
  clusters: [a, b]
  models: [org/m1-8B]
  presets: [tb2]
""")
    return load_specs([spec])


def test_explain_keeps_every_cluster_of_the_evalrun_holding_the_cell(tmp_path: Path) -> None:
    specs = two_cluster_specs(tmp_path)

    holding = specs_holding(specs, load_catalog(), "org/m1-8B", "tb2")
    assert set(holding.clusters) == {A, B}
    assert [c.ref for c in holding.clusters_of(holding.evalruns[0])] == [A, B]
