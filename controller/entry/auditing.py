"""`evalctl db audit`: each EvalRun observed as `plan` observes it (the store, its cluster's queue and run dirs,
joined to its cells), the rows judged by `core.audit`, and the marks the store already holds. Reads only."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime

from controller.api.catalog import Catalog
from controller.api.loader import SpecSet
from controller.core.audit import AuditReport, audit_cells, merge
from controller.core.cluster_view import ClusterView
from controller.core.ports import ObservationError
from controller.core.reconcile import lanes_of, observe
from controller.core.store import Store
from controller.core.types import ClusterRef
from controller.entry.passes import pass_targets
from controller.entry.wiring import cluster_ports


def audit_results(specs: SpecSet, store: Store, catalog: Catalog, now: datetime) -> AuditReport:
    """Every EvalRun's Finished rows judged by their run dirs, with the marks recorded for the findings.

    Raises ObservationError when an EvalRun's rows cannot be read: an audit that skipped them would say "clean"."""
    targets = pass_targets(specs, catalog, store, now, act=False, select_new=False)  # new picks have no rows yet
    clusters = cluster_ports(specs, store, catalog)
    stems: dict[ClusterRef, set[str]] = defaultdict(set)  # the run dirs a cluster's EvalRuns can own (as a pass)
    for target in targets:
        for lane in lanes_of(target):  # a cell's run dir may be on any cluster of its EvalRun
            stems[lane.cluster].update(stem for cell in target.cells for stem in cell.tag_stems)
    views: dict[ClusterRef, ClusterView] = {}
    reports = []
    for target in targets:
        for lane in lanes_of(target):
            if lane.cluster not in views:
                views[lane.cluster] = ClusterView(clusters[lane.cluster], lane.policy, now,
                                                  frozenset(stems[lane.cluster]))
        observed = observe(target, store, views, clusters)
        if observed.snapshot is None:
            reason = next((o.unknown_reason for o in observed.cells if o.unknown_reason), "")
            raise ObservationError(f"EvalRun {target.evalrun}: the results DB cannot be read: "
                                   f"{reason or 'see the log (-v)'}")
        reports.append(audit_cells(target.cells, observed.cells, target.policy.admission,
                                   target.policy.health.instant_fail))
    report = merge(reports)
    return report.with_marks(store.results.read_audit_marks([a.row_id for a in report.findings]))
