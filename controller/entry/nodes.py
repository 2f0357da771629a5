"""`evalctl nodes`: the nodes quarantined as bad (RULES §9 `refire-elsewhere`), as a human sees and lifts them.

A node quarantine is the store's; its scope is the cluster as the planner names it (`lab/gpu` for a namespaced
EvalCluster, `ClusterEvalCluster/shared`, or a spec file's bare `gpu`). A person may name the cluster by that scope
or by its name alone.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from datetime import datetime

from rich.console import Console
from rich.table import Table
from rich.text import Text

from controller.core.ports import ControllerState
from controller.core.remedies import Quarantined, QuarantineKind
from controller.entry.humanize import NOTHING, moment

NAMED_IN_ERRORS = 10  # quarantined nodes an error names; the rest are counted


class NotQuarantined(RuntimeError):
    """The node is not quarantined now (on that cluster): one line naming those that are."""


class ClusterNeeded(ValueError):
    """The node is quarantined on several clusters and none was named."""


def names_cluster(scope: str, cluster: str) -> bool:
    """Does `--cluster` name this scope: the scope itself, or its last part (`gpu` for `lab/gpu`)?"""
    return cluster in (scope, scope.rpartition("/")[2])


def node_quarantines(quarantined: Iterable[Quarantined], cluster: str | None = None) -> tuple[Quarantined, ...]:
    """The node quarantines of `cluster` (None: of every cluster), by cluster, then node."""
    return tuple(sorted((q for q in quarantined if q.kind == QuarantineKind.NODE
                         and (cluster is None or names_cluster(q.scope, cluster))), key=lambda q: (q.scope, q.name)))


def find(quarantined: Iterable[Quarantined], node: str, cluster: str | None) -> Quarantined:
    """The quarantine of `node` that `release NODE [--cluster C]` means; raises NotQuarantined or ClusterNeeded."""
    nodes = node_quarantines(quarantined)
    matches = [q for q in node_quarantines(nodes, cluster) if q.name == node]
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise ClusterNeeded(f"node {node} is quarantined on {len(matches)} clusters "
                            f"({', '.join(q.scope for q in matches)}): name one with --cluster")
    where = f" on {cluster}" if cluster else ""
    raise NotQuarantined(f"node {node} is not quarantined{where}; {_quarantined_now(nodes)}")


def release(state: ControllerState, node: str, cluster: str | None) -> Quarantined:
    """Lift the quarantine `find` means; returns what was lifted. One that ended meanwhile is NotQuarantined."""
    found = find(state.live_quarantines(), node, cluster)
    if not state.release_quarantine(QuarantineKind.NODE, found.scope, found.name):
        raise NotQuarantined(f"node {node} on {found.scope} is no longer quarantined (it ended meanwhile)")
    return found


def released_line(released: Quarantined, now: datetime) -> str:
    by = f" by {released.owner}" if released.owner else ""
    return (f"released node {released.name} on cluster {released.scope} (quarantined{by} until "
            f"{moment(released.until, now)}: {released.reason}); the next pass may submit to it")


def table(quarantines: Sequence[Quarantined], console: Console, now: datetime) -> None:
    if not quarantines:
        console.print("no node is quarantined")
        return
    shown = Table("cluster", "node", "since", "until", "owner", "reason",
                  title=f"{len(quarantines)} node(s) quarantined", expand=False)
    for q in quarantines:  # as text: a hostlist's or a reason's brackets are no markup
        shown.add_row(*map(Text, (q.scope, q.name, NOTHING if q.since is None else moment(q.since, now),
                                  moment(q.until, now), q.owner or NOTHING, q.reason)))
    console.print(shown)


def as_json(quarantines: Sequence[Quarantined]) -> str:
    return json.dumps({"nodes": [
        {"cluster": q.scope, "node": q.name, "since": None if q.since is None else q.since.isoformat(),
         "until": q.until.isoformat(), "owner": q.owner, "reason": q.reason} for q in quarantines]}, indent=2)


def _quarantined_now(nodes: Sequence[Quarantined]) -> str:
    if not nodes:
        return "no node is quarantined now"
    named = ", ".join(f"{q.name} ({q.scope})" for q in nodes[:NAMED_IN_ERRORS])
    more = f" (+{len(nodes) - NAMED_IN_ERRORS} more)" if len(nodes) > NAMED_IN_ERRORS else ""
    return f"quarantined now: {named}{more}"
