"""The pass pipeline, written once: spec → each EvalRun's target (its cells resolved once, the modelSelector's
picks included) → the clusters' adapters → `reconcile_pass`. `evalctl reconcile`/`plan`/`status`, `report`,
`db audit`, the operator and the benches all go through it."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from controller.api.catalog import Catalog, load_catalog
from controller.api.loader import SpecSet
from controller.api.resolve import with_chosen_shards
from controller.core.cluster_view import ClusterPorts
from controller.core.ports import ObservationError
from controller.core.reconcile import PassResult, reconcile_pass
from controller.core.run_target import RunTarget
from controller.core.store import Store
from controller.core.types import ClusterRef
from controller.entry.selection import intakes
from controller.entry.wiring import cluster_ports, targets_for


def pass_targets(specs: SpecSet, catalog: Catalog, store: Store, now: datetime, *, act: bool,
                 select_new: bool = True) -> list[RunTarget]:
    """Each EvalRun's target, in the order of `specs.evalruns`. `act`: a modelSelector records its new picks;
    `select_new`: False only reads what it took before (a deletion picks nothing)."""
    targets = targets_for(specs, catalog, intakes(specs, catalog, store, now, act=act, select_new=select_new))
    return [with_estimated_shards(target, store) for target in targets]


def with_estimated_shards(target: RunTarget, store: Store) -> RunTarget:
    """The target with each cell whose estimate chose shards (RULES §17, remembered with the cell) run as them.
    The choice is the controller state's: when it cannot be read, the EvalRun's cells are unknown, never run
    unsharded beside shards that may be running."""
    keys = [cell.key for cell in target.cells if cell.may_shard]
    if not keys or target.unknown:
        return target
    try:
        memories = store.state.read_memories(keys)
    except ObservationError as error:
        return target.model_copy(update={"unknown": f"the shards its estimates chose cannot be read: {error}"})
    if any(memory.shards_undecodable for memory in memories.values()):
        return target.model_copy(update={"unknown": "the shards its estimates chose cannot be read: a stored choice "
                                                    "does not decode"})
    chosen = {key: memory.shards.count for key, memory in memories.items() if memory.shards is not None}
    return target.model_copy(update={"cells": with_chosen_shards(target.cells, chosen)}) if chosen else target


def run_pass(specs: SpecSet, store: Store, now: datetime, *, act: bool, catalog: Catalog | None = None,
             ports: dict[ClusterRef, ClusterPorts] | None = None, holder: str = "",
             holder_is_dead: Callable[[str], bool] = lambda _: False) -> list[PassResult]:
    """One pass over every EvalRun of `specs`; `ports` default to this process's (the CLI's) adapters."""
    catalog = catalog or load_catalog()
    targets = pass_targets(specs, catalog, store, now, act=act)
    return reconcile_pass(targets, store, ports or cluster_ports(specs, store, catalog), now, act=act, holder=holder,
                          holder_is_dead=holder_is_dead)
