"""Audit marks (`evalctl db audit --apply`): the gate's verdict on any user's row, kept in the store's own table;
the lab's `sandbox_jobs` row is never written. Supabase (PostgREST) holds none and refuses to write them."""

from __future__ import annotations

import time

import pytest

from controller.core.ports import WriteRefused
from controller.core.records import AuditVerdict, RowAuditMark
from tests.store.contract.conftest import Backend

SCORE = [{"name": "accuracy", "value": 0.9}]


def refused(row_id: str, reason: str = "19 of 20 trials are infra") -> RowAuditMark:
    return RowAuditMark(row_id=row_id, gate=1, verdict=AuditVerdict.REFUSED, refusal="InfraShare", reason=reason)


def test_marking_another_users_row_leaves_its_row_untouched(results_backend: Backend) -> None:
    fam = results_backend.families
    theirs = results_backend.legacy.add_row(fam.qwen, fam.v2, username="bob", metrics=SCORE, job_name="old_run")
    mine = results_backend.legacy.add_row(fam.qwen, fam.tb2, username="alice", metrics=SCORE, job_name="new_run")
    before = {row_id: results_backend.raw_row(row_id) for row_id in (theirs, mine)}
    results = results_backend.results
    assert results.read_audit_marks([theirs, mine]) == {}

    if results_backend.name == "supabase":
        with pytest.raises(WriteRefused, match="postgresql://"):
            results.mark_rows([refused(theirs)])
        return
    provisional = RowAuditMark(row_id=mine, gate=1, verdict=AuditVerdict.PROVISIONAL, reason="5 scored trials")
    results.mark_rows([refused(theirs), provisional])

    marks = results.read_audit_marks([theirs, mine, "no-such-row"])
    assert set(marks) == {theirs, mine}
    assert marks[theirs].same_verdict(refused(theirs)) and marks[mine].same_verdict(provisional)
    assert marks[theirs].audited_at is not None
    assert {row_id: results_backend.raw_row(row_id) for row_id in (theirs, mine)} == before


def test_the_same_verdict_again_keeps_the_first_mark_and_another_replaces_it(results_backend: Backend) -> None:
    if results_backend.name == "supabase":
        pytest.skip("Supabase holds no marks (test above)")
    fam = results_backend.families
    row_id = results_backend.legacy.add_row(fam.qwen, fam.v2, username="bob", metrics=SCORE)
    results = results_backend.results

    results.mark_rows([refused(row_id)])
    first = results.read_audit_marks([row_id])[row_id]
    time.sleep(0.01)
    results.mark_rows([refused(row_id)])
    again = results.read_audit_marks([row_id])[row_id]
    results.mark_rows([refused(row_id, reason="20 of 20 trials are infra")])
    replaced = results.read_audit_marks([row_id])[row_id]

    assert again == first, "repeating a mark is a no-op"
    assert replaced.reason == "20 of 20 trials are infra" and replaced.audited_at is not None
    assert first.audited_at is not None and replaced.audited_at >= first.audited_at
