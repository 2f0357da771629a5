"""Cells that used to share a run tag, and cells named by two EvalRuns: one identity, one owner, one job."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controller.core.actions import ActionKind
from controller.core.match import join_cells
from controller.core.observed import JobState
from controller.core.planner import plan
from controller.core.records import StoreSnapshot
from controller.core.vocabulary import Phase
from tests.core.builders import NOW, POLICY, RUN, cell, job, obs

# Pairs of cells whose old run tags (slug of model and benchmark name + fingerprint) were equal.
COLLIDING = {
    "same benchmark name, two orgs": (cell(dataset="OrgA/bench_x", benchmark_name="bench_x"),
                                      cell(dataset="OrgB/bench_x", benchmark_name="bench_x")),
    "absolute vs relative checkpoint": (cell(model="/ckpts/run1"), cell(model="ckpts/run1")),
    "names differing only in non-ASCII": (cell(model="org/модель-α"), cell(model="org/модель-β")),
    "slash vs double underscore": (cell(model="org/m"), cell(model="org__m")),
    "space vs underscore": (cell(model="org/my model"), cell(model="org/my_model")),
    "differ after the readable part": (cell(model="org/" + "x" * 80 + "-a"), cell(model="org/" + "x" * 80 + "-b")),
}


@pytest.mark.parametrize("pair", COLLIDING.values(), ids=COLLIDING.keys())
def test_cells_that_slug_alike_get_distinct_tags_and_never_claim_each_other(pair):
    first, second = pair
    assert first.key != second.key
    assert first.run_tag(1) != second.run_tag(1)
    assert second.attempt_of(first.run_tag(1)) is None and first.attempt_of(second.run_tag(1)) is None
    # the job of the first cell is seen by the first cell only
    running = job(first.run_tag(1), JobState.RUNNING)
    seen = join_cells([first, second], StoreSnapshot(models=(), benchmarks=(), rows=(), submissions=()),
                         [running], [])
    assert seen[0].jobs == (running,) and seen[1].jobs == ()


@given(st.lists(st.tuples(st.text(min_size=1, max_size=120), st.text(min_size=1, max_size=60)), min_size=2,
                max_size=6, unique=True))
def test_run_tags_are_injective_and_stay_file_names(names):
    cells = [cell(model=model, dataset=f"org/{bench}", benchmark_name=bench) for model, bench in names]
    tags = [c.run_tag(1) for c in cells]
    assert len(set(tags)) == len({c.key for c in cells})
    for tag in tags:
        assert re.fullmatch(r"ev_[A-Za-z0-9._-]+", tag) and len(tag.encode()) < 200


def test_a_cell_owned_by_another_evalrun_is_shown_but_not_acted_on():
    mine, theirs = cell(model="org/a"), cell(model="org/b")
    decided = plan(RUN, [mine, theirs], [obs(), obs()], POLICY, NOW, budget=1, owners={theirs.key: "other"})
    owned = decided.cells[1]
    assert [a.kind for a in owned.actions] == [ActionKind.SKIP] and "owned by EvalRun other" in owned.reason
    assert owned.phase == Phase.PENDING and owned.row_updates == ()
    assert [a.kind for a in decided.cells[0].actions] == [ActionKind.SUBMIT], "the owned cell used no budget"


def test_a_copy_with_another_model_has_that_models_identity_not_the_cached_one():
    original = cell("org/a-8B")
    assert original.key and original.tag_stem  # computed, and cached on the instance
    copy = original.model_copy(update={"model": "org/b-8B"})
    fresh = cell("org/b-8B")
    assert (copy.key, copy.tag_stem, copy.label) == (fresh.key, fresh.tag_stem, fresh.label)
