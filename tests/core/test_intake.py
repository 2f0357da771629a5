"""The selector's rule as data: which registered models it admits, in which order, and which count as evaluated."""

from __future__ import annotations

from datetime import timedelta

from controller.core.intake import Candidate, SelectorRule, admitted, selections, unevaluated_models
from controller.core.observed import Observation
from tests.core.builders import NOW, SCORED, ago, row


def candidate(name: str, days: float | None = 1, size: float | None = 8) -> Candidate:
    return Candidate(name=name, created_at=None if days is None else ago(days=days), size_b=size)


RULE = SelectorRule(name_patterns=("laion/*",), min_b=7, max_b=9, created_within=timedelta(days=14),
                    exclude=("*-dpo*",), limit=10)


def test_each_rule_of_the_selector_refuses_what_it_should():
    pool = [candidate("laion/a-8B", days=2), candidate("other/b-8B"), candidate("laion/c-32B", size=32),
            candidate("laion/d-8B", days=15), candidate("laion/e", size=None), candidate("laion/f-8B-dpo"),
            candidate("laion/g-8B", days=None), candidate("LAION/H-8B", days=3)]
    assert [c.name for c in admitted(RULE, pool, taken=set(), now=NOW)] == ["laion/a-8B", "LAION/H-8B"], \
        "pattern (case ignored), band, window, a size or a time that cannot be read, exclude"


def test_newest_first_ties_by_name_and_taken_or_repeated_names_once():
    pool = [candidate("laion/z-8B", days=1), candidate("laion/a-8B", days=1), candidate("laion/m-8B", days=0.5),
            candidate("laion/m-8B", days=9), candidate("laion/listed-8B", days=0.1)]
    chosen = admitted(RULE, pool, taken={"laion/listed-8B"}, now=NOW)
    assert [c.name for c in chosen] == ["laion/m-8B", "laion/a-8B", "laion/z-8B"]


def test_without_band_or_window_every_name_that_matches_counts():
    rule = SelectorRule(limit=3)
    chosen = admitted(rule, [candidate("x/old", days=None, size=None), candidate("y/new-1B", days=1)], set(), NOW)
    assert [c.name for c in chosen] == ["y/new-1B", "x/old"], "a time that cannot be read sorts last"


def test_a_model_is_evaluated_only_when_every_cell_has_a_scored_finished_row():
    models = ["a", "a", "b", "c"]
    observed = [
        Observation(rows=(row("Finished", metrics=SCORED, user="bob"),), submissions=(), jobs=(), run_dirs=()),
        Observation(rows=(row("Finished", metrics=SCORED),), submissions=(), jobs=(), run_dirs=()),
        Observation(rows=(row("Finished", metrics=None), row("Started")), submissions=(), jobs=(), run_dirs=()),
        Observation(rows=(row("Finished", metrics=SCORED),), submissions=(), jobs=(), run_dirs=()),
    ]
    assert unevaluated_models(models, observed) == {"b"}
    observed[1] = Observation(rows=(), submissions=(), jobs=(), run_dirs=())
    assert unevaluated_models(models, observed) == {"a", "b"}, "one benchmark of a still unevaluated"


def test_each_selection_names_its_rule_in_words():
    [taken] = selections(RULE, [candidate("laion/a-8B")], NOW)
    assert (taken.model, taken.selected_at) == ("laion/a-8B", NOW)
    assert taken.rule == "newest names laion/*, 7–9B, registered within 14d, unevaluated"
    assert SelectorRule(created_within=timedelta(hours=36), unevaluated=False, limit=1).describe() == \
        "newest names *, registered within 36h"
