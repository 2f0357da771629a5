"""The actor records a quarantine with the EvalRun that decided it, and says so when a human's release stands."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from controller.adapters.store.sqlite import SqliteStore
from controller.api.catalog import load_catalog
from controller.core.actions import Quarantine, Wait
from controller.core.actor import Actor, JobLauncher
from controller.core.job_env import JobSettings
from controller.core.remedies import QuarantineKind
from controller.core.store import Store
from controller.core.vocabulary import CellPlan, Phase, Plan, Rule
from tests.core.builders import NOW, RUN, cell

NCCL = Quarantine(subject=QuarantineKind.NODE, scope="lab/gpu", name="gpu03", reason="nccl-timeout", ttl_s=3600,
                  owner="lab/sweep")


def quarantining() -> Plan:
    return Plan(evalrun=RUN, cells=(CellPlan(cell=cell(), phase=Phase.PENDING, reason="refire after the back-off",
                                             rule=Rule.REFIRE, actions=(NCCL, Wait(reason="back-off"))),))


def actor(store: SqliteStore) -> Actor:
    def unused(*_: Any) -> Any:
        raise AssertionError("a quarantine launches and analyses nothing")

    launcher = JobLauncher(cluster="lab", script="run.sh", logs_dir="logs",
                           settings=JobSettings(jobs_dir="jobs", username="alice", gpu_memory_util=0.9,
                                                infra_error_threshold=10))
    return Actor(Store(store, store), unused, launcher, unused, unused,  # type: ignore[arg-type]
                 load_catalog().error_classes, lambda: NOW)


def test_a_quarantine_is_recorded_with_its_owner_and_a_released_one_is_not_recorded_again(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "store.db")

    [first] = actor(store).act(quarantining())
    (recorded,) = store.live_quarantines()
    store.release_quarantine(QuarantineKind.NODE, "lab/gpu", "gpu03")
    [again] = actor(store).act(quarantining())

    assert first.ok and first.message == "node gpu03 quarantined for 1 h: nccl-timeout"
    assert (recorded.scope, recorded.name, recorded.owner) == ("lab/gpu", "gpu03", "lab/sweep")
    assert again.ok and again.message == "node gpu03 not quarantined again: a human released it (nccl-timeout)"
    assert store.live_quarantines() == ()
    store.close()
