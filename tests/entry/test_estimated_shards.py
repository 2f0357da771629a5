"""RULES §17 `ShardsChosen`, the pass's side: the shards an estimate chose are read from the controller state before
the cells are resolved, for the cells that may shard only; when that read fails the EvalRun's cells are unknown,
never resolved as one job beside shards that may be running."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime
from pathlib import Path

from controller.adapters.store.sqlite import SqliteStore
from controller.api.catalog import load_catalog
from controller.api.loader import load_specs
from controller.core.remedies import CellMemory, ShardChoice
from controller.core.store import Store
from controller.entry.passes import pass_targets

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


def spec(tmp_path: Path, run: str) -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(f"""
apiVersion: evalrun.io/v1alpha1
kind: EvalCluster
metadata: {{name: a}}
spec: {{scheduler: {{type: local}}, jobsDir: {tmp_path}/jobs, logsDir: {tmp_path}/logs, jobScript: /bin/true}}
---
apiVersion: evalrun.io/v1alpha1
kind: EvalRun
metadata: {{name: r}}
spec:
  cluster: a
  models: [org/m1-8B]
  presets: [tb2]
{run}""")
    return path


def targets(tmp_path: Path, run: str, memory: str | CellMemory | None) -> list:
    """The pass's targets over a SQLite store whose one cell memory is `memory` (text: written as is)."""
    specs = load_specs([spec(tmp_path, run)])
    state = SqliteStore(tmp_path / "store.db")
    try:
        [unsharded] = pass_targets(specs, load_catalog(), Store(state, state), NOW, act=False)[0].cells
        if isinstance(memory, CellMemory):
            state.remember(unsharded.key, memory)
        elif memory is not None:
            with sqlite3.connect(tmp_path / "store.db") as conn:
                conn.execute("INSERT INTO evalrun_cell_memory VALUES (?, ?, ?)", (unsharded.key, memory, "now"))
        return pass_targets(specs, load_catalog(), Store(state, state), NOW, act=False)
    finally:
        state.close()


CHOSEN = CellMemory(shards=ShardChoice(count=2, reason="p90 over maxTimeLimit", at=NOW))


def test_a_chosen_count_resolves_the_cell_as_its_shards_under_walltime_auto(tmp_path: Path) -> None:
    [target] = targets(tmp_path, "  walltime: auto\n", CHOSEN)
    cell, *shards = target.cells
    assert cell.shards == 2 and [s.label for s in shards] == ["org/m1-8B × tb2 (shard 1/2)",
                                                              "org/m1-8B × tb2 (shard 2/2)"]
    assert target.unknown == ""


def test_shards_set_in_the_spec_or_walltime_fixed_ignore_a_recorded_choice(tmp_path: Path) -> None:
    for run in ("  walltime: auto\n  shards: 1\n", "  walltime: fixed\n"):
        [target] = targets(tmp_path, run, CHOSEN)
        assert [c.shards for c in target.cells] == [1], run


def test_an_unreadable_choice_makes_the_evalrun_unknown(tmp_path: Path) -> None:
    [target] = targets(tmp_path, "  walltime: auto\n", "{not json")
    assert target.unknown.startswith("the shards its estimates chose cannot be read"), target.unknown
