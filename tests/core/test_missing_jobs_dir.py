"""A missing jobs dir (unmounted, or nothing ran yet): which cells may still be judged without their run dir."""

from __future__ import annotations

import pytest

from controller.core.actions import ActionKind
from controller.core.match import join_cells
from controller.core.observed import JobState, Metric
from controller.core.planner import plan_cell
from controller.core.records import NamedRow, SandboxJobRow, StoreSnapshot
from controller.core.vocabulary import Phase
from tests.core.builders import NOW, POLICY, ago, cell, job, sub

C = cell()
TAG = C.run_tag(1)
MODEL, BENCH = NamedRow(id="m", name=C.model), NamedRow(id="b", name=C.benchmark_name)


def row(status: str, *, metrics: bool = False, job_id: str | None = "pending") -> SandboxJobRow:
    return SandboxJobRow(id="r", job_name=TAG, username="alice", job_status=status, model_id="m", benchmark_id="b",
                         slurm_job_id=job_id, metrics=(Metric(name="accuracy", value=0.5),) if metrics else None)


CASES = {
    "nothing recorded: may start": ((), (), (), False),
    "a bare intent (crash before sbatch): may repair": ((row("Pending"),), (sub(C, job_id=None),), (), False),
    "a queued job: nothing to read yet": ((row("Pending", job_id="7"),), (sub(C, job_id="7"),),
                                          (job(TAG, JobState.QUEUED, job_id="7"),), False),
    "a scored row: judged without its dir": ((row("Finished", metrics=True),), (), (), False),
    "a running job: its dir must be there": ((row("Started"),), (sub(C),), (job(TAG, JobState.RUNNING,
                                                                                started=ago(hours=1)),), True),
    "a Started row, job aged out": ((row("Started"),), (sub(C),), (), True),
    "Finished without metrics": ((row("Finished"),), (), (), True),
    "Pending with a job id, job out of sight": ((row("Pending", job_id="7"),), (sub(C, job_id="7"),), (), True),
}


@pytest.mark.parametrize(("rows", "subs", "jobs", "unknown"), CASES.values(), ids=CASES.keys())
def test_only_cells_whose_history_says_a_dir_exists_are_unknown(rows, subs, jobs, unknown):
    snapshot = StoreSnapshot(models=(MODEL,), benchmarks=(BENCH,), rows=rows, submissions=subs)
    [seen] = join_cells([C], snapshot, jobs, (), jobs_dir_missing="jobs dir /x does not exist")
    assert (seen.run_dirs is None) == unknown
    assert ("jobs dir /x does not exist" in seen.unknown_reason) == unknown


@pytest.mark.parametrize(("state", "words"), [(JobState.FAILED, "failed: no harbor"),
                                              (JobState.OUT_OF_MEMORY, "ran out of memory: no harbor")])
def test_a_failed_job_is_held_for_a_human_even_when_its_run_dir_cannot_be_seen(state, words):
    failed = job(TAG, state, job_id="7", started=ago(minutes=5), ended=ago(minutes=4), reason="no harbor")
    snapshot = StoreSnapshot(models=(MODEL,), benchmarks=(BENCH,), rows=(row("Pending", job_id="7"),),
                             submissions=(sub(C, job_id="7"),))
    [seen] = join_cells([C], snapshot, (failed,), (), jobs_dir_missing="jobs dir /x does not exist")
    decided = plan_cell(C, seen, POLICY, NOW)
    assert decided.phase == Phase.FAILED and [a.kind for a in decided.actions] == [ActionKind.HOLD]
    assert f"job 7 {words}" in decided.reason and "jobs dir /x does not exist" in decided.reason


def test_a_job_found_by_its_name_is_still_recorded_while_the_run_dirs_are_unseen():
    running = job(TAG, JobState.RUNNING, job_id="9", started=ago(minutes=1))
    snapshot = StoreSnapshot(models=(MODEL,), benchmarks=(BENCH,), rows=(row("Pending"),),
                             submissions=(sub(C, job_id=None, created=ago(minutes=2)),))
    [seen] = join_cells([C], snapshot, (running,), (), jobs_dir_missing="jobs dir /x does not exist")
    decided = plan_cell(C, seen, POLICY, NOW)
    assert decided.phase == Phase.UNKNOWN and decided.actions == ()
    assert [(u.submission_name, u.job_id) for u in decided.row_updates] == [(TAG, "9")], "the crash repair"
