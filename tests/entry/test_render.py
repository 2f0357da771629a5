"""The `plan` table: a row per cell for an EvalRun a person reads whole, a row per decision past that (issue 19:
rich measured every cell of 5,000 rows, ~0.8 s per 1,000)."""

from __future__ import annotations

import re

from rich.console import Console

from controller.core.planner import plan
from controller.entry.render import TABLE_CELLS_MAX, plan_table
from tests.core.builders import NOW, POLICY, cell, obs


def _table(models: int) -> str:
    cells = [cell(model=f"org/m{index}-8B") for index in range(models)]
    console = Console(record=True, width=200)
    plan_table(plan(cells[0].evalrun, cells, [obs() for _ in cells], POLICY, NOW), console)
    return console.export_text()


def test_a_small_evalrun_has_a_row_per_cell() -> None:
    text = _table(3)
    assert all(f"org/m{index}-8B" in text for index in range(3))
    assert "decisions" not in text


def test_a_big_evalrun_has_a_row_per_decision_counted_and_says_where_every_cell_is() -> None:
    models = TABLE_CELLS_MAX + 50
    text = _table(models)
    assert f"{models} cells in 2 decisions" in text, text
    submitted = POLICY.max_submissions_per_pass
    for count in (models - submitted, submitted):  # waiting for the budget; submitted
        assert re.search(rf"│\s+{count} │ Pending", text), text
    assert f"org/m{models - 1}-8B" not in text, "one row per decision, not per cell"
    assert "-o json` lists every cell" in text
