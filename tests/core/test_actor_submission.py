"""The actor records each intent with the cluster its job goes to: what binds the cell there across a restart."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.adapters.scheduler.local import LocalScheduler
from controller.adapters.store.sqlite import SqliteStore
from controller.api.catalog import load_catalog
from controller.core.actions import Submit
from controller.core.actor import Actor, JobLauncher
from controller.core.job_env import JobSecrets, JobSettings
from controller.core.observed import RunDirFacts
from controller.core.store import Store
from controller.core.types import Cell
from controller.core.vocabulary import CellPlan, Phase, Plan, Rule
from tests.core.builders import ME, NOW, RUN, cell
from tests.fixtures.evalctl import cancel_live_jobs


@pytest.fixture
def scheduler(tmp_path: Path) -> Iterator[LocalScheduler]:
    local = LocalScheduler(tmp_path / "scheduler")
    yield local
    cancel_live_jobs(local)


def actor(store: SqliteStore, scheduler: LocalScheduler, cluster: str, tmp_path: Path) -> Actor:
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(0o755)
    launcher = JobLauncher(cluster=cluster, script=str(script), logs_dir=str(tmp_path / "logs"),
                           settings=JobSettings(jobs_dir=str(tmp_path / "jobs"), username=ME, gpu_memory_util=0.9,
                                                infra_error_threshold=10))

    def never(*_: RunDirFacts) -> object:
        raise AssertionError("a launch analyses nothing")

    return Actor(Store(store, store), scheduler, launcher, lambda _: JobSecrets(), never,  # type: ignore[arg-type]
                 load_catalog().error_classes, lambda: NOW)


def submitting(c: Cell) -> Plan:
    return Plan(evalrun=RUN, cells=(CellPlan(cell=c, phase=Phase.PENDING, reason="no job yet", rule=Rule.NO_EXISTING_JOB,
                                             actions=(Submit(reason="start", run_tag=c.run_tag(1), attempt=1),)),))


def test_each_submission_records_the_cluster_its_actor_submits_to(tmp_path: Path, scheduler: LocalScheduler) -> None:
    store = SqliteStore(tmp_path / "store.db")
    on_a, on_shared = cell(), cell(model="org/other-8B")

    [first] = actor(store, scheduler, "lab/cluster-a", tmp_path).act(submitting(on_a))
    [second] = actor(store, scheduler, "ClusterEvalCluster/shared", tmp_path).act(submitting(on_shared))
    recorded = {s.cell_key: (s.cluster, s.job_id) for s in store.read_state(RUN, [], 3600).submissions}
    store.close()

    assert first.ok and second.ok, (first.message, second.message)
    jobs = {job.name: job.job_id for job in scheduler.observe()}
    assert recorded == {on_a.key: ("lab/cluster-a", jobs[on_a.run_tag(1)]),
                        on_shared.key: ("ClusterEvalCluster/shared", jobs[on_shared.run_tag(1)])}
