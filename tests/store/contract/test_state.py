"""The controller's own state: intents, act-leases, cell claims, tunnel pairs, cell memory. Expiry is the store's."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

from controller.core.ports import ControllerState
from controller.core.types import Submission, TunnelLease

T0 = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
HOUR = 3600.0


def submission(name: str, *, evalrun: str = "qwen-evals", cell_key: str = "cell-a") -> Submission:
    return Submission(name=name, run_tag=name, evalrun=evalrun, cell_key=cell_key, attempt=1, fire=1,
                      row_id="4d0f1f6e-0000-4000-8000-000000000001", created_at=T0)


def test_an_intent_is_recorded_once_and_read_by_evalrun_or_cell(state_backend: ControllerState) -> None:
    state_backend.record_submission(submission("ours"))
    state_backend.record_submission(submission("ours"))
    state_backend.record_submission(submission("theirs", evalrun="other", cell_key="cell-b"))
    state_backend.record_submission(submission("taken-over", evalrun="other", cell_key="cell-a"))

    names = [s.name for s in state_backend.read_state("qwen-evals", ["cell-a"], HOUR).submissions]
    by_run_only = [s.name for s in state_backend.read_state("qwen-evals", [], HOUR).submissions]

    assert sorted(names) == ["ours", "taken-over"]
    assert by_run_only == ["ours"]


def test_job_ids_and_offset_times_read_back_as_recorded(state_backend: ControllerState) -> None:
    offset = submission("ours").model_copy(update={"created_at": datetime(2025, 6, 1, 14, tzinfo=timezone(timedelta(hours=2)))})
    state_backend.record_submission(offset)

    state_backend.record_job_id("ours", "4242")
    state_backend.record_job_id("ours", "4242")

    (sub,) = state_backend.read_state("qwen-evals", [], HOUR).submissions
    assert (sub.job_id, sub.created_at) == ("4242", T0)
    assert sub.created_at.utcoffset() == timedelta(0)


def test_a_lease_is_held_until_it_expires_by_the_stores_clock(state_backend: ControllerState) -> None:
    assert state_backend.try_lease("evalrun/a", "operator", HOUR)
    assert not state_backend.try_lease("evalrun/a", "cli", HOUR)
    assert state_backend.lease_holder("evalrun/a") == "operator"
    assert state_backend.try_lease("evalrun/a", "operator", 0)  # renewed, and already expired
    assert state_backend.lease_holder("evalrun/a") is None
    assert state_backend.try_lease("evalrun/a", "cli", HOUR)
    assert state_backend.try_lease("evalrun/b", "operator", HOUR), "leases are per name"


def test_release_frees_a_lease_only_for_its_holder(state_backend: ControllerState) -> None:
    state_backend.try_lease("evalrun/a", "operator", HOUR)

    state_backend.release_lease("evalrun/a", "cli")
    assert not state_backend.try_lease("evalrun/a", "cli", HOUR)
    state_backend.release_lease("evalrun/a", "operator")
    state_backend.release_lease("evalrun/a", "operator")
    assert state_backend.try_lease("evalrun/a", "cli", HOUR)


def test_a_cell_has_one_owner_until_its_claim_goes_stale(state_backend: ControllerState) -> None:
    assert state_backend.claim_cells("run-a", ["c1", "c2"], HOUR) == {"c1": "run-a", "c2": "run-a"}
    assert state_backend.claim_cells("run-b", ["c2", "c3"], HOUR) == {"c2": "run-a", "c3": "run-b"}
    owners = {o.cell_key: o.evalrun for o in state_backend.read_state("run-b", ["c1", "c2", "c3"], HOUR).cell_owners}
    assert owners == {"c1": "run-a", "c2": "run-a", "c3": "run-b"}

    assert state_backend.claim_cells("run-b", ["c2"], 0) == {"c2": "run-b"}, "a claim older than the TTL is taken"
    assert state_backend.read_state("run-b", ["c3"], HOUR).cell_owners == (), "run-b stopped naming c3: released"


def test_stale_claims_are_not_reported_as_owners(state_backend: ControllerState) -> None:
    state_backend.claim_cells("run-a", ["c1"], HOUR)

    assert state_backend.read_state("run-b", ["c1"], 0).cell_owners == ()


def test_a_tunnel_pair_goes_to_one_holder_and_back_only_by_it(state_backend: ControllerState) -> None:
    def lease(pair: str, holder: str) -> TunnelLease:
        return TunnelLease(pair=pair, holder=holder, evalrun="qwen-evals", leased_at=T0)

    assert state_backend.take_tunnel(lease("pair-a", "job-1"))
    assert not state_backend.take_tunnel(lease("pair-a", "job-2"))
    assert state_backend.take_tunnel(lease("pair-a", "job-1")), "taking a pair you hold again is a success"
    state_backend.release_tunnel("pair-a", "job-2")
    assert state_backend.read_state("any", [], HOUR).tunnel_leases == (lease("pair-a", "job-1"),)
    state_backend.release_tunnel("pair-a", "job-1")
    state_backend.release_tunnel("pair-a", "job-1")
    assert state_backend.take_tunnel(lease("pair-a", "job-2"))


def test_cell_memory_is_replaced_and_read_per_cell(state_backend: ControllerState) -> None:
    state_backend.remember("c1", {"stalled_readings": 1, "last_scored": 270})
    state_backend.remember("c1", {"stalled_readings": 2, "last_scored": 270})
    state_backend.remember("c2", {"stalled_readings": 0})

    memory = state_backend.read_state("run-a", ["c1"], HOUR).cell_memory

    assert memory == {"c1": {"stalled_readings": 2, "last_scored": 270}}
