"""The `evalrun.io/retry` annotation at the operator's boundary, on a real store: one request per held cell the
selector names, once per token (a restart that handles it again records nothing new), said in status and an Event.
tests/kube/test_retry_annotation.py proves the same on the real API server."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from controller.adapters.store.sqlite import SqliteStore
from controller.core.observed import JobState
from controller.core.planner import plan_cell
from controller.core.store import Store
from controller.core.types import EvalRunRef
from controller.core.vocabulary import CellPlan
from controller.entry.operator_retry import (
    RETRY,
    RETRY_CELLS,
    RETRY_REASON,
    SelectorError,
    annotated_retry,
    parse_cells,
    release_hints,
)
from tests.core.builders import NOW, POLICY, cell, facts, job, obs, row, sub

RUN = EvalRunRef(namespace="lab", name="sweep")
AT = datetime(2026, 12, 3, 2, 0, tzinfo=UTC)


def held(model: str) -> CellPlan:
    c = cell(model=model, evalrun=RUN)
    tag = c.run_tag(1)
    failed = job(tag, JobState.FAILED, ended=NOW, reason="exit 127")
    return plan_cell(c, obs(subs=(sub(c),), rows=(row("Pending", job_name=tag),), jobs=(failed,),
                            dirs=(facts(tag, total=None, completed=0, has_result=False, trial_dirs=0,
                                        finished=False),)), POLICY, NOW)


def running(model: str) -> CellPlan:
    return plan_cell(cell(model=model, evalrun=RUN), obs(), POLICY, NOW)


def body(annotations: dict[str, str], status: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"metadata": {"namespace": "lab", "name": "sweep", "annotations": annotations}, "status": status or {}}


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    state = SqliteStore(tmp_path / "store.db")
    yield Store(state, state)
    state.close()


def requests(store: Store, *cells: CellPlan) -> list[tuple[str, str, str]]:
    found = store.state.read_state(RUN, [c.cell.key for c in cells], 3600).retries
    return [(r.cell_key, r.requested_by, r.reason) for r in found]


def test_a_new_token_records_one_request_per_selected_held_cell(store: Store) -> None:
    a, b, c = held("org/a-8B"), held("org/b-8B"), running("org/c-8B")
    assert a.held and b.held and not c.held

    status, event = annotated_retry(store, body({RETRY: "t1", RETRY_CELLS: "model=org/b-8B,benchmark=tb2",
                                                 RETRY_REASON: "script fixed"}), [a, b, c], AT) or ({}, None)

    assert requests(store, a, b, c) == [(b.cell.key, "annotation evalrun.io/retry=t1 on lab/sweep", "script fixed")]
    assert status["retry"]["token"] == "t1" and status["retry"]["cells"] == [b.cell.label]
    assert event is not None and event.type == "Normal" and event.reason == "RetryRequested"
    assert b.cell.label in event.message and "the next pass releases each once" in event.message


def test_a_handled_token_is_not_handled_again_and_a_repeat_records_nothing_new(store: Store) -> None:
    a = held("org/a-8B")
    first = annotated_retry(store, body({RETRY: "t1"}), [a], AT)
    assert first is not None

    assert annotated_retry(store, body({RETRY: "t1"}, status=first[0]), [a], AT) is None
    again = annotated_retry(store, body({RETRY: "t1"}), [a], AT)  # a restart before its status was written
    assert again is not None and len(requests(store, a)) == 1, "the token names the request: recorded once"
    assert annotated_retry(store, body({}), [a], AT) is None


def test_no_held_cell_or_a_bad_selector_is_a_warning_and_nothing_is_recorded(store: Store) -> None:
    c = running("org/c-8B")
    nothing = annotated_retry(store, body({RETRY: "t1"}), [c], AT)
    bad = annotated_retry(store, body({RETRY: "t2", RETRY_CELLS: "modle=org/a-8B"}), [held("org/a-8B")], AT)

    assert nothing is not None and nothing[1].reason == "NothingToRetry"
    assert bad is not None and bad[1].reason == "RetryNotRecorded" and "'modle=org/a-8B'" in bad[1].message
    assert bad[0]["retry"]["token"] == "t2", "handled: a new token is what asks again"
    assert requests(store, c, held("org/a-8B")) == []


def test_cell_selectors_parse_or_say_what_is_wrong() -> None:
    assert parse_cells("") == ()
    assert parse_cells("model=Org/M, benchmark=tb2; model=Org/N") == (
        {"model": "Org/M", "benchmark": "tb2"}, {"model": "Org/N"})
    with pytest.raises(SelectorError, match="is not model=NAME or benchmark=NAME"):
        parse_cells("model")


def test_a_held_cells_attention_item_says_how_to_release_it() -> None:
    a, c = held("org/a-8B"), running("org/c-8B")
    items = [{"model": x.cell.model, "benchmark": x.cell.benchmark, "phase": x.phase.value, "reason": x.reason}
             for x in (a, c)]

    hinted = release_hints({"attention": items}, [a, c], {"namespace": "lab", "name": "sweep"})["attention"]

    assert hinted[0]["release"] == ("kubectl annotate evalrun/sweep -n lab --overwrite evalrun.io/retry=<new token> "
                                    "'evalrun.io/retry-cells=model=org/a-8B,benchmark=tb2'")
    assert "release" not in hinted[1]
