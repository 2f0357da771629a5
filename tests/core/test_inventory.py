"""What `evalctl get` says of a cell from the store alone: only what is recorded, nothing the spec would decide."""

from __future__ import annotations

from controller.core.inventory import cell_records, evalrun_records
from controller.core.observed import Metric
from controller.core.records import SandboxJobRow, StateSnapshot
from controller.core.remedies import AdmissionRecord, CellMemory
from tests.core.builders import ME, ago, cell, sub

C, OTHER = cell(), cell(model="org/other-8B")
SCORED = (Metric(name="accuracy", value=0.25), Metric(name="n_valid_trials", value=40.0))


def stored_row(row_id: str, tag: str, status: str, metrics: tuple[Metric, ...] | None = None) -> SandboxJobRow:
    return SandboxJobRow(id=row_id, job_name=tag, username=ME, job_status=status, metrics=metrics,
                         config={"env": "hpc"})


def test_a_cell_is_its_newest_attempt_and_its_newest_upload() -> None:
    first, second = sub(C, 1, row_id="r1", created=ago(hours=3)), sub(C, 2, row_id="r2", job_id="101",
                                                                       created=ago(hours=1))
    rows = (stored_row("r1", C.run_tag(1), "Finished", SCORED), stored_row("r2", C.run_tag(2), "Started"))
    memory = {C.key: CellMemory(admitted=AdmissionRecord(run_tag=C.run_tag(1), score=0.25, n_scored=40,
                                                         provisional=True, evidence="40 graded"))}

    [record] = cell_records(StateSnapshot(submissions=(first, second), cell_memory=memory), rows)

    assert (record.status, record.attempts, record.run_tag, record.job_id) == ("Started", 2, C.run_tag(2), "101")
    assert (record.score, record.n_scored, record.provisional, record.cluster) == (0.25, 40, True, "hpc")
    assert record.submitted_at == ago(hours=1)


def test_an_intent_without_its_row_is_submitted_and_a_record_without_names_is_unknown() -> None:
    intent = sub(C, row_id="r9").model_copy(update={"model": C.model, "benchmark": C.benchmark_name})
    legacy = sub(OTHER, row_id="r8")  # before 0.4: no model or benchmark recorded, so its rows were not read

    records = cell_records(StateSnapshot(submissions=(intent, legacy)), ())

    assert [(r.model, r.status, r.score, r.provisional, r.cluster) for r in records] == [
        (C.model, "Submitted", None, None, None), (None, "Unknown", None, None, None)]
    [run] = evalrun_records(records)
    assert (run.cells, run.statuses, run.scored, run.provisional) == (2, {"Submitted": 1, "Unknown": 1}, 0, 0)


def test_a_score_without_the_gates_record_of_it_is_not_called_trusted_or_provisional() -> None:
    scored = sub(C, row_id="r1").model_copy(update={"model": C.model, "benchmark": C.benchmark_name})

    [record] = cell_records(StateSnapshot(submissions=(scored,)), (stored_row("r1", C.run_tag(1), "Finished", SCORED),))

    assert (record.status, record.score, record.n_scored, record.provisional) == ("Finished", 0.25, 40, None)


def test_a_cell_shows_the_cluster_its_newest_job_was_submitted_to_before_the_one_its_rows_name() -> None:
    first = sub(C, 1, row_id="r1", created=ago(hours=3)).model_copy(update={"cluster": "lab/hpc"})
    second = sub(C, 2, row_id="r2", created=ago(hours=1)).model_copy(update={"cluster": "lab/gpu-b"})
    rows = (stored_row("r1", C.run_tag(1), "Finished", SCORED), stored_row("r2", C.run_tag(2), "Started"))
    intent = sub(OTHER, row_id="r9").model_copy(update={"model": OTHER.model, "benchmark": OTHER.benchmark_name,
                                                        "cluster": "ClusterEvalCluster/shared"})

    records = cell_records(StateSnapshot(submissions=(first, second, intent)), rows)

    assert {r.cell_key: r.cluster for r in records} == {C.key: "lab/gpu-b", OTHER.key: "ClusterEvalCluster/shared"}
    [run] = evalrun_records(records)
    assert run.clusters == ("ClusterEvalCluster/shared", "lab/gpu-b")
