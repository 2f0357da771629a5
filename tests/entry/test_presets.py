"""`evalctl presets`: every shipped preset and alias, with what a spec gets by naming it."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from controller.api.catalog import load_catalog
from controller.entry.cli import app


def test_presets_lists_every_preset_and_alias_with_its_dataset_and_walltime() -> None:
    shipped = load_catalog().presets
    shown = CliRunner().invoke(app, ["presets", "-o", "json"])
    assert shown.exit_code == 0, shown.output
    listed = json.loads(shown.stdout)
    assert [p["name"] for p in listed["presets"]] == sorted(shipped.presets)
    by_name = {p["name"]: p for p in listed["presets"]}
    assert by_name["swebench_full"]["walltime"] == shipped.presets["swebench_full"].walltime == "48:00:00"
    assert by_name["tb2"]["dataset"] == shipped.presets["tb2"].dataset
    assert listed["aliases"] == shipped.aliases


def test_the_table_names_the_datasets_and_the_cluster_walltime_where_a_preset_sets_none() -> None:
    shown = CliRunner().invoke(app, ["presets"], env={"COLUMNS": "250"})
    assert shown.exit_code == 0, shown.output
    rows = {line.split("│")[1].strip(): line for line in shown.stdout.splitlines() if line.startswith("│")}
    assert set(rows) == set(load_catalog().presets.presets)
    assert "cluster's timeLimit" in rows["tb2"] and "48:00:00" in rows["swebench_full"]
