"""The `plan` table: a row per cell for an EvalRun a person reads whole, a row per decision past that (issue 19:
rich measured every cell of 5,000 rows, ~0.8 s per 1,000)."""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable
from datetime import datetime, timedelta

import pytest
from rich.console import Console

from controller.core.gpu_hours import EstimateSource, GpuEstimate
from controller.core.observed import JobState, Metric, RowStatus
from controller.core.planner import plan
from controller.core.reconcile import PassResult
from controller.core.remedies import CellMemory, StallReading
from controller.core.status import summarize
from controller.core.vocabulary import Plan
from controller.core.walltime import WallEstimate
from controller.entry.humanize import value_text
from controller.entry.render import TABLE_CELLS_MAX, explain, plan_table, status_grid, status_json
from controller.entry.watch import Watch
from tests.core.builders import NOW, POLICY, ago, cell, facts, job, obs, row, sub


def passed(the_plan: Plan) -> PassResult:
    """A dry pass's result around a plan: nothing acted, nothing beside it."""
    return PassResult(evalrun=the_plan.evalrun, plan=the_plan, status=summarize(the_plan))


def _table(models: int) -> str:
    cells = [cell(model=f"org/m{index}-8B") for index in range(models)]
    console = Console(record=True, width=200)
    plan_table(passed(plan(cells[0].evalrun, cells, [obs() for _ in cells], POLICY, NOW)), console)
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


# ---------------------------------------------------------------------- progress, not fake scores (issue 21)

RUNNING_TAG = cell().run_tag(1)


def _running_plan(*, completed: int = 6, scored: int = 5, memory: CellMemory | None = None) -> Plan:
    """A cell 12 minutes into its run: 6 of 18 trials done (5 scored, all reward 0), its row still Pending."""
    the_cell = cell()
    dir_ = facts(RUNNING_TAG, total=18, completed=completed, scored=scored, finished=False,
                 last_progress=ago(minutes=1)).model_copy(update={"started_at": ago(minutes=12), "reward_sum": 0.0})
    observed = obs(subs=(sub(the_cell),), rows=(row("Pending", job_name=RUNNING_TAG),),
                   jobs=(job(RUNNING_TAG, JobState.RUNNING, started=ago(minutes=12)),), dirs=(dir_,))
    if memory is not None:
        observed = observed.model_copy(update={"memory": memory})
    return plan(the_cell.evalrun, [the_cell], [observed], POLICY, NOW)


def _text(draw: Callable[[Console], None]) -> str:
    console = Console(record=True, width=200)
    draw(console)
    return console.export_text()


def test_status_shows_a_running_cell_as_scored_of_total_with_an_eta_and_no_score() -> None:
    text = _text(lambda console: status_grid(passed(_running_plan()), console))

    assert "Running 5/18 · ETA 24 min" in text, text
    assert "0.000" not in text, "no score before one is uploaded"


def test_status_json_carries_the_progress_and_a_null_score() -> None:
    [run] = json.loads(status_json([passed(_running_plan())]))["evalruns"]
    [the_cell] = run["cells"]

    assert the_cell["phase"] == "Running" and the_cell["score"] is None
    assert the_cell["progress"] == {"scored": 5, "total": 18, "eta_minutes": 24}


def test_explain_prints_values_never_reprs() -> None:
    stalled = CellMemory(stall_reading=StallReading(run_tag=RUNNING_TAG, scored=5, at=ago(minutes=40)))
    [the_cell] = _running_plan(memory=stalled).cells

    text = _text(lambda console: explain(the_cell, console, NOW))

    assert not re.search(r"<\w+\.\w+: ", text) and "datetime(" not in text and "None" not in text, text
    assert "record: row_id row-1; status Started; started_at 2026-11-29 11:48 UTC (12 min ago)" in text, text
    assert "remembered stall_reading: run_tag" in text and "at 2026-11-29 11:20 UTC (40 min ago)" in text, text
    assert "Running 5/18 · ETA 24 min" in text and "score:  — (none uploaded)" in text, text
    assert "finished: —" in text


@pytest.mark.parametrize(("value", "shown"), [
    (None, "—"), (RowStatus.STARTED, "Started"), (0.41666, "0.4167"), (3.0, "3"), (True, "yes"),
    (("a", "b"), "a, b"), ((), "—"), (NOW - timedelta(hours=5), "2026-11-29 07:00 UTC (5 h ago)"),
    (datetime(2026, 11, 29, 12, 30), "2026-11-29 12:30 UTC (in 30 min)"),  # naive: the stores' UTC
])
def test_every_value_type_reads_as_a_value(value: object, shown: str) -> None:
    assert value_text(value, NOW) == shown


def _watched(frames: list[Plan]) -> str:
    out = io.StringIO()
    console = Console(file=out, width=160)  # a file: not a terminal
    with Watch(console) as watch:
        for frame in frames:
            watch.show([frame], NOW)
    return out.getvalue()


def test_watch_on_a_pipe_prints_each_changed_table_once_without_terminal_codes() -> None:
    early, same, later = _running_plan(), _running_plan(), _running_plan(completed=12, scored=11)

    text = _watched([early, same, later])

    assert "\x1b" not in text, "no cursor or colour codes in a log"
    assert text.count("2026-11-29 12:00:00 UTC") == 2, "an unchanged reading prints nothing"
    assert "5/18 · ETA 24 min" in text and "11/18 · ETA 6 min" in text, text
    first_bar, second_bar = re.findall(r"│ (━*╸?) +│ \d+/18", text)
    assert len(first_bar) < len(second_bar), "the bar grows with the scored trials"
    assert "0.000" not in text


def test_watch_on_a_terminal_redraws_in_place() -> None:
    out = io.StringIO()
    with Watch(Console(file=out, width=160, force_terminal=True)) as watch:
        watch.show([_running_plan()], NOW)
        watch.show([_running_plan(completed=12, scored=11)], NOW)

    assert "\x1b[?25l" in out.getvalue() and "\x1b[2K" in out.getvalue(), "the cursor hidden, the old frame erased"
    assert "11/18" in out.getvalue().rsplit("\x1b[2K", 1)[-1], "the last frame drawn is the newest reading"


def test_watch_shows_a_finished_cell_as_its_score_and_n_where_a_running_one_has_its_bar() -> None:
    """A finished cell's row holds the number it rests on (`0.412 (n=89)`), not a full bar; its trust flag beside."""
    running, done = cell(), cell(model="org/done-8B")
    tag = done.run_tag(1)
    uploaded = row("Finished", job_name=tag, metrics=(Metric(name="accuracy", value=0.412), Metric(
        name="accuracy_stderr", value=0.05), Metric(name="n_valid_trials", value=89)))
    finished = obs(subs=(sub(done),), rows=(uploaded,), dirs=(facts(tag, total=90, completed=90, scored=89),))
    observed = [obs(subs=(sub(running),), rows=(row("Pending", job_name=RUNNING_TAG),),
                    jobs=(job(RUNNING_TAG, JobState.RUNNING, started=ago(minutes=12)),),
                    dirs=(facts(RUNNING_TAG, total=18, completed=6, scored=5, finished=False,
                                last_progress=ago(minutes=1)).model_copy(update={"started_at": ago(minutes=12)}),)),
                finished]
    the_plan = plan(running.evalrun, [running, done], observed, POLICY, NOW)
    assert [c.phase.value for c in the_plan.cells] == ["Running", "Completed"]

    text = _watched([the_plan])

    [done_row] = [line for line in text.splitlines() if "org/done-8B" in line]
    [running_row] = [line for line in text.splitlines() if running.model in line and "done" not in line]
    assert re.search(r"│ 0\.412 \(n=89\) +│ provisional +│$", done_row), done_row
    assert "━" not in done_row and "━" in running_row and "5/18" in running_row, text


def test_explain_of_a_cell_not_run_yet_gives_what_an_attempt_should_cost_and_take_and_from_what() -> None:
    [the_cell] = _running_plan().cells
    estimate = GpuEstimate(hours=10.0, source=EstimateSource.HISTORY, basis="median of 3 finished attempt(s) of tb2",
                           wall=WallEstimate(median_hours=2.5, high_hours=3.0, basis="3 finished attempt(s) of tb2"))

    text = _text(lambda console: explain(the_cell, console, NOW, estimate=estimate))

    assert ("estimate: 10.00 GPU-h (median of 3 finished attempt(s) of tb2); est. 2 h 30 m (p90 3 h 00 m) from 3 "
            "finished attempt(s) of tb2") in text, text
    assert "server start" not in text  # none measured: the estimate says nothing of it


def test_explain_gives_the_server_start_measured_on_jobs_alike() -> None:
    [the_cell] = _running_plan().cells
    wall = WallEstimate(median_hours=2.5, high_hours=3.0, basis="3 finished attempt(s) of tb2", with_start=True,
                        start_hours=13 / 60, start_basis="measured, median of 4 job(s) of 0–14B")
    estimate = GpuEstimate(hours=10.0, source=EstimateSource.HISTORY, basis="median of 3 finished attempt(s) of tb2",
                           wall=wall)

    text = _text(lambda console: explain(the_cell, console, NOW, estimate=estimate))

    assert "from 3 finished attempt(s) of tb2; server start 13 m (measured, median of 4 job(s) of 0–14B)" in text, text
