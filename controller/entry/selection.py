"""The models of an EvalRun with a `modelSelector`: its listed ones, those it took before, and (acting) new ones.

Before each pass: read what the selector took (the controller state; unreadable → the EvalRun is Unknown, as
its cells are), then the registered models and, batch by batch newest first, whether the admitted ones are
evaluated (the results DB; unreadable → nothing new, fail closed). New picks are recorded before their cells
exist, so a crash between the two never loses a selection; `plan` shows them as "would select".
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from pathlib import Path
from typing import NamedTuple

from pydantic import ValidationError

from controller.api.catalog import Catalog
from controller.api.evalcluster import EvalCluster
from controller.api.evalrun import SELECTOR_LIMIT_MAX, EvalRun, ModelSelector, duration_hours
from controller.api.fields import API_VERSION
from controller.api.loader import LoadedCluster, LoadedRun, SpecSet
from controller.api.resolve import resolve
from controller.core.intake import Candidate, Selection, SelectorRule, admitted, selections, unevaluated_models
from controller.core.match import join_cells
from controller.core.ports import ObservationError, StoreUnavailable
from controller.core.records import StoreSnapshot
from controller.core.store import Store
from controller.core.types import EvalRunRef

log = logging.getLogger("evalctl.intake")
BATCH_MIN = 50  # admitted models whose rows one read checks: ~limit × 4, at least this many


class Intake(NamedTuple):
    """What an EvalRun's modelSelector gives this pass: its cells' models (listed, then taken), the selections,
    what it did in words, and why its cells cannot be known ("" when they can)."""

    models: tuple[str, ...] | None
    selections: tuple[Selection, ...] = ()
    note: str = ""
    unknown: str = ""


def intakes(specs: SpecSet, catalog: Catalog, store: Store, now: datetime, *, act: bool,
            select_new: bool = True) -> dict[EvalRunRef, Intake]:
    """The intake of each EvalRun with a modelSelector. `act`: record new picks; `select_new`: False only reads
    what was taken before (a deletion cancels those cells' jobs, picks nothing)."""
    return {run.ref: _intake(run, specs.cluster_of(run), catalog, store, now, act=act, select_new=select_new)
            for run in specs.evalruns if run.run.spec.model_selector is not None}


def selector_rule(selector: ModelSelector) -> SelectorRule:
    band = selector.size_band
    return SelectorRule(
        name_patterns=tuple(selector.name_patterns), exclude=tuple(selector.exclude),
        min_b=None if band is None else band.min_b, max_b=None if band is None else band.max_b,
        created_within=None if selector.created_within is None else timedelta(
            hours=duration_hours(selector.created_within)),
        unevaluated=selector.unevaluated, limit=selector.limit)


def unevaluated_candidates(rule: SelectorRule, run: LoadedRun, cluster: LoadedCluster, catalog: Catalog,
                           store: Store, taken: set[str], now: datetime, wanted: int | None) -> list[Candidate]:
    """The newest admitted models (unevaluated ones, if the rule asks), up to `wanted` (None: all): the selector's
    query, and `evalctl models unevaluated`'s. Raises ObservationError when the results DB cannot be read."""
    registered = store.results.read_models()
    size_b = catalog.size_policy.size_b
    candidates = admitted(rule, (Candidate(name=m.name, created_at=m.created_at, size_b=size_b(m.name))
                                 for m in registered), taken, now)
    wanted = len(candidates) if wanted is None else wanted
    if not rule.unevaluated:
        return candidates[:wanted]
    found: list[Candidate] = []
    batch = max(wanted * 4, BATCH_MIN)
    for start in range(0, len(candidates), batch):
        chunk = candidates[start:start + batch]
        unevaluated = _unevaluated(run, cluster, catalog, store, [c.name for c in chunk])
        found += [c for c in chunk if c.name in unevaluated]
        if len(found) >= wanted:
            break
    return found[:wanted]


def _intake(run: LoadedRun, cluster: LoadedCluster, catalog: Catalog, store: Store, now: datetime, *, act: bool,
            select_new: bool) -> Intake:
    selector = run.run.spec.model_selector
    assert selector is not None
    try:
        before = store.state.read_selections(run.ref)
    except ObservationError as error:
        return Intake(models=None, unknown=f"the models its modelSelector took cannot be read: {error}")
    listed = set(run.run.spec.models)
    rule = selector_rule(selector)
    new: list[Selection] = []
    note = ""
    room = rule.limit - len(before)
    if select_new and room > 0:
        try:
            chosen = unevaluated_candidates(rule, run, cluster, catalog, store,
                                            listed | {s.model for s in before}, now, room)
            new = selections(rule, chosen, now)
        except ObservationError as error:
            note = f"nothing new selected: the results DB cannot be read ({error})"
    if new and act:
        try:
            store.state.record_selections(run.ref, new)
        except StoreUnavailable as error:
            note, new = f"nothing new selected: the selection could not be recorded ({error})", []
    if new:
        verb = "selected" if act else "would select"
        note = f"{verb} {len(new)} new model(s): {', '.join(s.model for s in new)}"
        log.info(verb, extra={"evalrun": str(run.ref), "models": [s.model for s in new]})
    elif not note:
        note = (f"{len(before)} of limit {rule.limit} selected" if room <= 0 or not select_new
                else f"no new model matches ({rule.describe()})")
    taken = (*before, *new)
    models = (*run.run.spec.models, *(s.model for s in taken if s.model not in listed))
    return Intake(models=models, selections=taken, note=note)


def _unevaluated(run: LoadedRun, cluster: LoadedCluster, catalog: Catalog, store: Store,
                 models: list[str]) -> set[str]:
    """Which of these models have a cell with no scored Finished row in its benchmark's family (whoever wrote
    it), matched to the cell's config as the planner matches it. One read of the results DB."""
    cells = resolve(run.run, cluster.cluster, catalog, models)
    results = store.results.read_results(models, sorted({c.benchmark_name for c in cells}))
    if results.undecodable:  # a row that cannot be read may be the scored one: say nothing is known
        raise ObservationError(f"{len(results.undecodable)} row(s) cannot be decoded: {results.undecodable[0]}")
    snapshot = StoreSnapshot(models=results.models, benchmarks=results.benchmarks, rows=results.rows, submissions=())
    return unevaluated_models([c.model for c in cells], join_cells(cells, snapshot, None, None))


def flag_query(catalog: Catalog, benchmark: str, size: float | None, within: str | None) -> tuple[LoadedRun,
                                                                                                 LoadedCluster]:
    """`models unevaluated --benchmark tb2 --size 8 --within 30d` as the EvalRun it stands for: a terminus-2 run
    of that preset (or dataset) whose selector takes the size policy's band around `size`, on a cluster that
    only resolves cells (nothing is submitted). Raises ValueError, in the flags' words, on a bad value."""
    if "/" not in benchmark and not catalog.presets.expand(benchmark):
        raise ValueError(f"--benchmark {benchmark!r} is neither a preset ({', '.join(sorted(catalog.presets.presets))})"
                         " nor a dataset (Org/name)")
    selector: dict[str, object] = {"limit": SELECTOR_LIMIT_MAX}
    if size is not None:
        band = next((b for b in catalog.size_policy.bands if b.min_b <= size <= b.max_b), None)
        selector["sizeBand"] = {"minB": band.min_b if band else size, "maxB": band.max_b if band else size}
    if within is not None:
        selector["createdWithin"] = within
    benchmarks_field = {"datasets": [benchmark]} if "/" in benchmark else {"presets": [benchmark]}
    try:
        run = EvalRun.model_validate({"apiVersion": API_VERSION, "kind": "EvalRun", "metadata": {"name": "query"},
                                      "spec": {"cluster": "query", "modelSelector": selector, **benchmarks_field}})
    except ValidationError as error:
        problem = error.errors()[0]
        raise ValueError(f"{'.'.join(map(str, problem['loc'][-1:]))}: {problem['msg']}") from None
    cluster = EvalCluster.model_validate({
        "apiVersion": API_VERSION, "kind": "EvalCluster", "metadata": {"name": "query"},
        "spec": {"scheduler": {"type": "local"}, "jobsDir": ".", "logsDir": ".", "jobScript": "none"}})
    here = Path.cwd()
    return LoadedRun(file=here, directory=here, run=run), LoadedCluster(file=here, directory=here, cluster=cluster)
