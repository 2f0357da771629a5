"""The controller's own state: intents, act-leases, cell claims, tunnel pairs, cell memory, quarantines.

Expiry is the store's."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta, timezone

from controller.core.observed import Submission, TunnelLease
from controller.core.ports import ControllerState
from controller.core.records import StateSnapshot
from controller.core.remedies import CellMemory, QuarantineKind, ShardChoice, StallReading
from controller.core.types import EvalRunRef

T0 = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
HOUR = 3600.0
QWEN, OTHER, ANY = EvalRunRef(name="qwen-evals"), EvalRunRef(name="other"), EvalRunRef(name="any")
RUN_A, RUN_B = EvalRunRef(namespace="lab", name="run-a"), EvalRunRef(name="run-b")
CLOCK_MARGIN = timedelta(seconds=5)  # the store's clock may be the server's, not this process's


def submission(name: str, *, evalrun: EvalRunRef = QWEN, cell_key: str = "cell-a") -> Submission:
    return Submission(name=name, run_tag=name, evalrun=evalrun, cell_key=cell_key, attempt=1, fire=1,
                      row_id="4d0f1f6e-0000-4000-8000-000000000001", created_at=T0)


def test_an_intent_is_recorded_once_and_read_by_evalrun_or_cell(state_backend: ControllerState) -> None:
    state_backend.record_submission(submission("ours"))
    state_backend.record_submission(submission("ours"))
    state_backend.record_submission(submission("theirs", evalrun=OTHER, cell_key="cell-b"))
    state_backend.record_submission(submission("taken-over", evalrun=OTHER, cell_key="cell-a"))

    names = [s.name for s in state_backend.read_state(QWEN, ["cell-a"], HOUR).submissions]
    by_run_only = [s.name for s in state_backend.read_state(QWEN, [], HOUR).submissions]

    assert sorted(names) == ["ours", "taken-over"]
    assert by_run_only == ["ours"]


def test_job_ids_and_offset_times_read_back_as_recorded(state_backend: ControllerState) -> None:
    offset = submission("ours").model_copy(update={"created_at": datetime(2025, 6, 1, 14, tzinfo=timezone(timedelta(hours=2)))})
    state_backend.record_submission(offset)

    state_backend.record_job_id("ours", "4242")
    state_backend.record_job_id("ours", "4242")

    (sub,) = state_backend.read_state(QWEN, [], HOUR).submissions
    assert (sub.job_id, sub.created_at) == ("4242", T0)
    assert sub.created_at.utcoffset() == timedelta(0)


def test_the_cluster_a_submission_went_to_reads_back_for_its_evalrun_and_for_get(state_backend: ControllerState) -> None:
    state_backend.record_submission(submission("on-a").model_copy(update={"cluster": "lab/cluster-a"}))
    state_backend.record_submission(submission("on-shared", cell_key="cell-b").model_copy(
        update={"cluster": "ClusterEvalCluster/shared"}))
    state_backend.record_submission(submission("before-clusters", cell_key="cell-c"))

    read = {s.name: s.cluster for s in state_backend.read_state(QWEN, [], HOUR).submissions}
    inventory = state_backend.read_inventory()

    assert read == {"on-a": "lab/cluster-a", "on-shared": "ClusterEvalCluster/shared", "before-clusters": None}
    assert inventory is not None and {s.name: s.cluster for s in inventory.submissions} == read


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
    assert state_backend.claim_cells(RUN_A, ["c1", "c2"], HOUR) == {"c1": RUN_A, "c2": RUN_A}
    assert state_backend.claim_cells(RUN_B, ["c2", "c3"], HOUR) == {"c2": RUN_A, "c3": RUN_B}
    owners = {o.cell_key: o.evalrun for o in state_backend.read_state(RUN_B, ["c1", "c2", "c3"], HOUR).cell_owners}
    assert owners == {"c1": RUN_A, "c2": RUN_A, "c3": RUN_B}

    assert state_backend.claim_cells(RUN_B, ["c2"], 0) == {"c2": RUN_B}, "a claim older than the TTL is taken"
    assert state_backend.read_state(RUN_B, ["c3"], HOUR).cell_owners == (), "run-b stopped naming c3: released"


def test_stale_claims_are_not_reported_as_owners(state_backend: ControllerState) -> None:
    state_backend.claim_cells(RUN_A, ["c1"], HOUR)

    assert state_backend.read_state(RUN_B, ["c1"], 0).cell_owners == ()


def test_a_tunnel_pair_goes_to_one_holder_and_back_only_by_it(state_backend: ControllerState) -> None:
    def lease(pair: str, holder: str) -> TunnelLease:
        return TunnelLease(pair=pair, holder=holder, evalrun=RUN_A, leased_at=T0)

    assert state_backend.take_tunnel(lease("pair-a", "job-1"))
    assert not state_backend.take_tunnel(lease("pair-a", "job-2"))
    assert state_backend.take_tunnel(lease("pair-a", "job-1")), "taking a pair you hold again is a success"
    state_backend.release_tunnel("pair-a", "job-2")
    assert state_backend.read_state(ANY, [], HOUR).tunnel_leases == (lease("pair-a", "job-1"),)
    state_backend.release_tunnel("pair-a", "job-1")
    state_backend.release_tunnel("pair-a", "job-1")
    assert state_backend.take_tunnel(lease("pair-a", "job-2"))


def test_cell_memory_is_replaced_and_read_per_cell(state_backend: ControllerState) -> None:
    reading = StallReading(run_tag="ev_x__a1", scored=270, at=T0)
    state_backend.remember("c1", CellMemory(stall_reading=reading, db_verified="row 1"))
    state_backend.remember("c1", CellMemory(stall_reading=reading, upload_as_is="ev_x__a1"))
    state_backend.remember("c2", CellMemory(track_error="MLflow: down"))

    memory = state_backend.read_state(RUN_A, ["c1"], HOUR).cell_memory

    assert memory == {"c1": CellMemory(stall_reading=reading, upload_as_is="ev_x__a1")}


def test_the_memories_of_named_cells_are_read_before_a_pass_with_the_shards_an_estimate_chose(
        state_backend: ControllerState) -> None:
    """RULES §17: a chosen count is read back before cells are resolved; a cell never remembered is absent."""
    chosen = CellMemory(shards=ShardChoice(count=3, reason="p90 40 h over maxTimeLimit 24 h", at=T0))
    assert state_backend.read_memories(["cell-a"]) == {}, "nothing recorded yet: a store without the table"
    state_backend.remember("cell-a", chosen)
    state_backend.remember("cell-b", CellMemory(track_error="MLflow: down"))

    assert state_backend.read_memories(["cell-a", "cell-c"]) == {"cell-a": chosen}
    assert state_backend.read_memories([]) == {}


def test_a_namespaced_evalrun_reads_back_as_itself_everywhere(state_backend: ControllerState) -> None:
    """`lab/run-a` in submissions, leases and claims, never its bare name (the pinggy deadlock of issue 15)."""
    state_backend.record_submission(submission("ours", evalrun=RUN_A))
    state_backend.take_tunnel(TunnelLease(pair="pair-a", holder="ours", evalrun=RUN_A, leased_at=T0))
    state_backend.claim_cells(RUN_A, ["cell-a"], HOUR)

    seen = state_backend.read_state(RUN_A, [], HOUR)
    owners = state_backend.read_state(RUN_B, ["cell-a"], HOUR).cell_owners

    assert [s.evalrun for s in seen.submissions] == [RUN_A]
    assert [lease.evalrun for lease in seen.tunnel_leases] == [RUN_A]
    assert [o.evalrun for o in owners] == [RUN_A]
    assert state_backend.read_state(EvalRunRef(name="run-a"), [], HOUR).submissions == (), "the bare name is another"


def test_a_quarantine_reads_back_until_ttl_from_now_whatever_the_evalrun(state_backend: ControllerState) -> None:
    before = datetime.now(UTC)
    state_backend.quarantine(QuarantineKind.NODE, "cluster-a", "node-7", "NCCL timeout on node-7", HOUR)
    after = datetime.now(UTC)

    (seen,) = state_backend.read_state(ANY, [], HOUR).quarantined

    assert (seen.kind, seen.scope, seen.name, seen.reason) == (QuarantineKind.NODE, "cluster-a", "node-7",
                                                              "NCCL timeout on node-7")
    assert before + timedelta(seconds=HOUR) - CLOCK_MARGIN < seen.until < after + timedelta(seconds=HOUR)
    assert state_backend.read_state(RUN_A, ["cell-a"], HOUR).quarantined == (seen,), "not per EvalRun"


def test_a_quarantine_with_no_ttl_is_expired_and_repeating_it_extends_it(state_backend: ControllerState) -> None:
    state_backend.quarantine(QuarantineKind.PAIR, "lab/run-a", "pair-3", "token locked", 0)

    assert state_backend.read_state(ANY, [], HOUR).quarantined == (), "expired by the store's clock"

    state_backend.quarantine(QuarantineKind.PAIR, "lab/run-a", "pair-3", "token locked", HOUR)
    assert [q.name for q in state_backend.read_state(ANY, [], HOUR).quarantined] == ["pair-3"]


def test_repeating_a_quarantine_replaces_its_reason_in_one_record(state_backend: ControllerState) -> None:
    state_backend.quarantine(QuarantineKind.CLUSTER, "cluster-a", "launches", "load shedding", HOUR)
    state_backend.quarantine(QuarantineKind.CLUSTER, "cluster-a", "launches", "rate limited", HOUR)

    (seen,) = state_backend.read_state(ANY, [], HOUR).quarantined

    assert (seen.kind, seen.reason) == (QuarantineKind.CLUSTER, "rate limited")


def test_quarantines_of_other_scopes_or_kinds_are_separate_records(state_backend: ControllerState) -> None:
    state_backend.quarantine(QuarantineKind.NODE, "cluster-a", "node-7", "ECC errors", HOUR)
    state_backend.quarantine(QuarantineKind.NODE, "cluster-b", "node-7", "disk full", HOUR)
    state_backend.quarantine(QuarantineKind.CLUSTER, "cluster-a", "node-7", "odd name, other kind", HOUR)

    seen = {(q.kind, q.scope, q.name): q.reason for q in state_backend.read_state(ANY, [], HOUR).quarantined}

    assert seen == {(QuarantineKind.NODE, "cluster-a", "node-7"): "ECC errors",
                    (QuarantineKind.NODE, "cluster-b", "node-7"): "disk full",
                    (QuarantineKind.CLUSTER, "cluster-a", "node-7"): "odd name, other kind"}


def test_a_quarantine_keeps_when_it_began_and_whose_pass_decided_it(state_backend: ControllerState) -> None:
    before = datetime.now(UTC)
    assert state_backend.quarantine(QuarantineKind.NODE, "lab/gpu", "gpu03", "nccl-timeout", HOUR, "team-a/sweep")
    (first,) = state_backend.live_quarantines()
    assert state_backend.quarantine(QuarantineKind.NODE, "lab/gpu", "gpu03", "nccl-timeout again", 2 * HOUR, "sweep")

    (again,) = state_backend.read_state(ANY, [], HOUR).quarantined

    assert first.since is not None and before - CLOCK_MARGIN < first.since < datetime.now(UTC) + CLOCK_MARGIN
    assert (first.owner, first.reason) == ("team-a/sweep", "nccl-timeout")
    assert (again.since, again.owner, again.reason) == (first.since, "sweep", "nccl-timeout again"), \
        "extended: it began when it began; the latest decision is whose it is"
    assert again.until > first.until


def test_a_quarantine_recorded_after_one_ended_begins_anew(state_backend: ControllerState) -> None:
    state_backend.quarantine(QuarantineKind.NODE, "lab/gpu", "gpu03", "nccl-timeout", 0, "sweep")
    time.sleep(0.01)
    boundary = datetime.now(UTC)
    state_backend.quarantine(QuarantineKind.NODE, "lab/gpu", "gpu03", "nccl-timeout", HOUR, "sweep")

    (seen,) = state_backend.live_quarantines()

    assert seen.since is not None and seen.since > boundary - CLOCK_MARGIN


def test_every_live_quarantine_is_listed_without_a_spec(state_backend: ControllerState) -> None:
    state_backend.quarantine(QuarantineKind.NODE, "lab/gpu", "gpu04", "ECC errors", HOUR, "sweep")
    state_backend.quarantine(QuarantineKind.NODE, "ClusterEvalCluster/shared", "gpu03", "disk full", HOUR)
    state_backend.quarantine(QuarantineKind.PAIR, "lab/run-a", "pair-3", "token locked", HOUR, "lab/run-a")
    state_backend.quarantine(QuarantineKind.NODE, "lab/gpu", "gpu09", "over", 0, "sweep")

    listed = [(q.kind, q.scope, q.name, q.owner) for q in state_backend.live_quarantines()]

    assert listed == [(QuarantineKind.NODE, "ClusterEvalCluster/shared", "gpu03", ""),
                      (QuarantineKind.NODE, "lab/gpu", "gpu04", "sweep"),
                      (QuarantineKind.PAIR, "lab/run-a", "pair-3", "lab/run-a")]


def test_a_released_quarantine_is_gone_and_the_same_decision_does_not_bring_it_back(
        state_backend: ControllerState) -> None:
    state_backend.quarantine(QuarantineKind.NODE, "lab/gpu", "gpu03", "nccl-timeout", HOUR, "sweep")
    state_backend.quarantine(QuarantineKind.NODE, "lab/gpu", "gpu04", "nccl-timeout", HOUR, "sweep")

    assert state_backend.release_quarantine(QuarantineKind.NODE, "lab/gpu", "gpu03")
    assert not state_backend.release_quarantine(QuarantineKind.NODE, "lab/gpu", "gpu03"), "twice: nothing to lift"
    assert [q.name for q in state_backend.live_quarantines()] == ["gpu04"]
    assert [q.name for q in state_backend.read_state(ANY, [], HOUR).quarantined] == ["gpu04"]

    # the next pass decides again from the failure it already saw (any EvalRun's): the release stands
    assert not state_backend.quarantine(QuarantineKind.NODE, "lab/gpu", "gpu03", "nccl-timeout", HOUR, "sweep")
    assert not state_backend.quarantine(QuarantineKind.NODE, "lab/gpu", "gpu03", "nccl-timeout", HOUR, "other")
    assert [q.name for q in state_backend.live_quarantines()] == ["gpu04"]

    # another failure is another decision
    assert state_backend.quarantine(QuarantineKind.NODE, "lab/gpu", "gpu03", "ECC errors", HOUR, "sweep")
    (gpu03, _) = state_backend.live_quarantines()
    assert (gpu03.name, gpu03.reason) == ("gpu03", "ECC errors")


def test_a_release_holds_only_until_the_lifted_quarantine_would_have_ended(state_backend: ControllerState) -> None:
    state_backend.quarantine(QuarantineKind.NODE, "lab/gpu", "gpu03", "nccl-timeout", 0.2, "sweep")
    assert state_backend.release_quarantine(QuarantineKind.NODE, "lab/gpu", "gpu03")
    time.sleep(0.3)

    assert state_backend.quarantine(QuarantineKind.NODE, "lab/gpu", "gpu03", "nccl-timeout", HOUR, "sweep")
    assert [q.name for q in state_backend.live_quarantines()] == ["gpu03"]


def test_releasing_an_absent_expired_or_other_quarantine_lifts_nothing(state_backend: ControllerState) -> None:
    state_backend.quarantine(QuarantineKind.NODE, "lab/gpu", "gpu03", "nccl-timeout", HOUR, "sweep")
    state_backend.quarantine(QuarantineKind.NODE, "lab/gpu", "gpu05", "over", 0, "sweep")

    assert not state_backend.release_quarantine(QuarantineKind.NODE, "lab/gpu", "gpu99")
    assert not state_backend.release_quarantine(QuarantineKind.NODE, "lab/gpu", "gpu05"), "expired: nothing to lift"
    assert not state_backend.release_quarantine(QuarantineKind.NODE, "other/gpu", "gpu03"), "another cluster's node"
    assert not state_backend.release_quarantine(QuarantineKind.CLUSTER, "lab/gpu", "gpu03"), "another kind"
    assert [q.name for q in state_backend.live_quarantines()] == ["gpu03"]


def test_the_inventory_holds_every_evalruns_submissions_and_every_cells_memory(state_backend: ControllerState) -> None:
    """What `evalctl get` lists without a spec: nothing filtered by EvalRun or cell."""
    assert state_backend.read_inventory() == StateSnapshot(), "a store with no record yet: empty, not absent"
    later = submission("b1", evalrun=RUN_B, cell_key="cell-b").model_copy(update={"created_at": T0 + timedelta(1)})
    state_backend.record_submission(later)
    state_backend.record_submission(submission("a1", evalrun=RUN_A, cell_key="cell-a"))
    state_backend.remember("cell-b", CellMemory(analyzed_run_tag="b1"))

    inventory = state_backend.read_inventory()

    assert inventory is not None
    assert [(s.name, s.evalrun, s.cell_key) for s in inventory.submissions] == [("a1", RUN_A, "cell-a"),
                                                                                ("b1", RUN_B, "cell-b")]
    assert inventory.cell_memory == {"cell-b": CellMemory(analyzed_run_tag="b1")}
