"""`evalctl presets`: the benchmarks a spec may name, as the shipped catalog defines them."""

from __future__ import annotations

import json

from rich.console import Console
from rich.table import Table
from rich.text import Text

from controller.api.catalog import Presets

CLUSTER_WALLTIME = "cluster's timeLimit"


def presets_table(presets: Presets, console: Console) -> None:
    table = Table("preset", "dataset", "tasks", "nConcurrent", "walltime", "note",
                  title=f"{len(presets.presets)} preset(s)", expand=False)
    for name, preset in sorted(presets.presets.items()):
        table.add_row(*map(Text, (name, preset.dataset, "?" if preset.tasks is None else str(preset.tasks),
                                  str(preset.n_concurrent), preset.walltime or CLUSTER_WALLTIME, preset.note)))
    console.print(table)
    for alias, names in sorted(presets.aliases.items()):
        console.print(Text(f"alias {alias}: {', '.join(names)}"))


def presets_json(presets: Presets) -> str:
    return json.dumps({
        "presets": [{"name": name, **preset.model_dump(mode="json", by_alias=True)}
                    for name, preset in sorted(presets.presets.items())],
        "aliases": dict(sorted(presets.aliases.items())),
    }, indent=2)
