"""The pass pipeline, written once: spec → each EvalRun's target (its cells resolved once, the modelSelector's
picks included) → the clusters' adapters → `reconcile_pass`. `evalctl reconcile`/`plan`/`status`, `report`,
`db audit`, the operator and the benches all go through it."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from controller.api.catalog import Catalog, load_catalog
from controller.api.loader import SpecSet
from controller.core.cluster_view import ClusterPorts
from controller.core.reconcile import PassResult, RunTarget, reconcile_pass
from controller.core.store import Store
from controller.core.types import ClusterRef
from controller.entry.selection import intakes
from controller.entry.wiring import cluster_ports, targets_for


def pass_targets(specs: SpecSet, catalog: Catalog, store: Store, now: datetime, *, act: bool,
                 select_new: bool = True) -> list[RunTarget]:
    """Each EvalRun's target, in the order of `specs.evalruns`. `act`: a modelSelector records its new picks;
    `select_new`: False only reads what it took before (a deletion picks nothing)."""
    return targets_for(specs, catalog, intakes(specs, catalog, store, now, act=act, select_new=select_new))


def run_pass(specs: SpecSet, store: Store, now: datetime, *, act: bool, catalog: Catalog | None = None,
             ports: dict[ClusterRef, ClusterPorts] | None = None, holder: str = "",
             holder_is_dead: Callable[[str], bool] = lambda _: False) -> list[PassResult]:
    """One pass over every EvalRun of `specs`; `ports` default to this process's (the CLI's) adapters."""
    catalog = catalog or load_catalog()
    targets = pass_targets(specs, catalog, store, now, act=act)
    return reconcile_pass(targets, store, ports or cluster_ports(specs, store, catalog), now, act=act, holder=holder,
                          holder_is_dead=holder_is_dead)
