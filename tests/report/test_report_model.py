"""What the report says of a cell: an uploaded score or none, provisional below the trust threshold, history newest
first, checkpoint families against their base; and the HTML escapes what other users wrote into the DB."""

from __future__ import annotations

import pytest

from controller.api.catalog import load_catalog
from controller.core.observed import Metric
from controller.core.planner import plan
from controller.report.html import render_html
from controller.report.model import Report, families, run_report
from tests.core.builders import NOW, POLICY, RUN, ago, cell, facts, obs, row, sub

ERRORS = load_catalog().error_classes


def scored(value: float, n_valid: int) -> tuple[Metric, ...]:
    return (Metric(name="accuracy", value=value), Metric(name="accuracy_stderr", value=0.04),
            Metric(name="n_valid_trials", value=float(n_valid)))


def report_of(cells, observations, trust: int = 150):
    the_plan = plan(RUN, cells, observations, POLICY, NOW)
    return run_report(the_plan, observations, ERRORS, trust, {}, None)


def test_a_score_is_an_uploaded_one_and_a_small_one_is_provisional() -> None:
    done, running, trusted = cell(model="org/a-8B"), cell(model="org/b-8B"), cell(model="org/c-8B")
    observations = [
        obs(rows=(row("Finished", metrics=scored(0.5, 40), row_id="r1", created=ago(hours=3)),
                  row("Finished", metrics=scored(0.2, 30), row_id="r0", user="bob", created=ago(days=9))),
            subs=(sub(done, row_id="r1"),)),
        obs(rows=(row("Started", job_name=running.run_tag(1), row_id="r2"),), subs=(sub(running, row_id="r2"),),
            dirs=(facts(running.run_tag(1), total=18, completed=5, finished=False),)),
        obs(rows=(row("Finished", metrics=scored(0.7, 200), row_id="r3"),)),
    ]
    a, b, c = report_of([done, running, trusted], observations).cells
    assert (a.score, a.n_valid, a.provisional) == (0.5, 40, True)
    assert [h.row_id for h in a.history] == ["r1", "r0"], "newest first, anyone's rows"
    assert (b.score, b.n_scored, b.n_total) == (None, 5, 18), "a running cell has progress, never a score"
    assert (c.score, c.provisional) == (0.7, False)


def test_checkpoints_are_set_against_their_base() -> None:
    names = ["org/m-8B", "org/m-8B-step100", "org/m-8B_ckpt2", "org/other-8B"]
    cells = [cell(model=n) for n in names]
    observations = [obs(rows=(row("Finished", metrics=scored(s, 200), row_id=f"r{i}"),))
                    for i, s in enumerate([0.5, 0.6, 0.25, 0.9])]
    report = report_of(cells, observations)
    [family] = report.families
    assert (family.stem, family.base) == ("org/m-8B", "org/m-8B")
    deltas = {m.model: m.deltas["tb2"] for m in family.members}
    assert deltas == {"org/m-8B-step100": pytest.approx(0.1), "org/m-8B_ckpt2": pytest.approx(-0.25)}
    assert families(["x/a-step1", "x/a-step2"], report.cells)[0].base == "x/a-step1", "no member named the stem"


def test_what_other_users_wrote_is_escaped() -> None:
    hostile = cell(model="org/a-8B")
    observed = [obs(rows=(row("Finished", metrics=scored(0.5, 200), user="<script>alert(1)</script>"),))]
    html = render_html(Report(runs=(report_of([hostile], observed),), as_of=None))
    assert "<script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_a_cells_gpu_hours_are_shown() -> None:
    spent = cell(model="org/a-8B")
    observed = [obs(rows=(row("Finished", metrics=scored(0.5, 200)),))]
    the_plan = plan(RUN, [spent], observed, POLICY, NOW)
    the_plan = the_plan.model_copy(update={"cells": (the_plan.cells[0].model_copy(update={"gpu_hours": 2.5}),)})
    report = run_report(the_plan, observed, ERRORS, 150, {}, None)
    assert report.cells[0].gpu_hours == 2.5
    html = render_html(Report(runs=(report,), as_of=None))
    assert "2.5 GPU-h" in html and "GPU-hours: 2.50" in html
