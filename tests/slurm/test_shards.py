"""A cell run as 2 shards on the lab SLURM with real Harbor over the tiny dataset (RULES §17): killed between its
shards' submissions, the next pass makes one job per shard, no more; the shards run disjoint halves of the dataset,
and the one row uploaded holds the score the same trials make unsharded. With walltime auto and history that says
one job cannot finish within maxTimeLimit, the estimate chooses the 2 shards, and each asks SLURM for its sized
--time."""

from __future__ import annotations

import json
import signal
from datetime import UTC, datetime
from pathlib import Path

import pytest

from controller.adapters.store import open_store
from controller.core.observed import Submission
from controller.core.types import EvalRunRef
from tests.slurm.conftest import EVAL_HARBOR, wait_until
from tests.slurm.test_converge import TINY_ACCURACY
from tests.slurm.test_walltime import asked_time

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]


def write_sharded(cluster, eval_env: Path, tmp_path: Path, extra: str = "", *, shards: str = "  shards: 2\n",
                  extra_cluster: str = "") -> None:
    """One model × a preset `tiny` (a catalog override: the tiny dataset, its 4 tasks counted) as 2 shards."""
    catalog = tmp_path / "catalog"
    catalog.mkdir()
    dataset = cluster.tiny_dataset("tinyshards")
    (catalog / "presets.yaml").write_text(json.dumps(
        {"presets": {"tiny": {"dataset": dataset, "n_concurrent": 4, "tasks": 4}}}))
    cluster.env = {**cluster.env, "EVALCTL_CATALOG_DIR": str(catalog)}
    cluster.write(models=[cluster.model(1)], datasets=[dataset], env={"EVAL_ENV": str(eval_env)}, time_limit="10",
                  extra_run=shards + "  monitor: {preWalltimeMinutes: 1, settleMinutes: 0}" + extra,
                  extra_cluster=extra_cluster)
    cluster.spec.write_text(cluster.spec.read_text().replace(f"datasets: {json.dumps([dataset])}", "presets: [tiny]"))


def test_two_shards_killed_between_submissions_make_one_job_each_and_one_row_of_the_unsharded_score(
        cluster, eval_env, tmp_path: Path) -> None:
    write_sharded(cluster, eval_env, tmp_path)

    killed = cluster.reconcile(kill_at="after-submit")  # the first shard's sbatch done, its id not recorded
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
    [first] = cluster.submissions()
    assert first["job_id"] is None

    cluster.reconcile()
    subs = cluster.submissions()
    assert len(subs) == 2 and all(s["job_id"] for s in subs), subs
    for sub in subs:  # one job per shard, in the queue or already in accounting
        jobs = {j["job_id"] for j in cluster.queue(sub["name"])} | {
            j["job_id"] for j in wait_until(lambda name=sub["name"]: cluster.accounting(name), f"sacct {sub['name']}")}
        assert jobs == {sub["job_id"]}, (sub, jobs)

    def converged() -> bool:
        cluster.reconcile()
        return cluster.status()["counts"] == {"Completed": 3}

    wait_until(converged, "the cell and its 2 shards Completed", timeout_s=600, step_s=1.0)

    assert len(cluster.submissions()) == 2, "no shard ran twice"
    rows = cluster.rows()
    [union] = [r for r in rows if r["job_status"] == "Finished"]
    score = next(m["value"] for m in union["metrics"] if m["name"] == "accuracy")
    assert score == pytest.approx(TINY_ACCURACY)  # test_converge's unsharded score of the same trials
    assert {r["job_status"] for r in rows if r is not union} == {"Started"}  # the shards' own rows: no score
    shard_dirs = [cluster.jobs_dir / s["run_tag"] for s in subs]
    tasks = [{json.loads(p.read_text())["task_name"] for p in d.glob("*/result.json")} for d in shard_dirs]
    assert not tasks[0] & tasks[1] and tasks[0] | tasks[1] == {"pass", "fail", "slow", "noreward"}
    assert (shard_dirs[0] / "post_eval_report.txt").exists()  # the union's report, over both shards' trials
    finished = cluster._query("SELECT run_tag, finished_at FROM evalrun_submissions")
    assert all(r["finished_at"] for r in finished), [dict(r) for r in finished]  # the shards' hours are history


def test_a_shard_whose_launch_failed_is_refired_alone_and_the_union_is_uploaded(cluster, eval_env,
                                                                                 tmp_path: Path) -> None:
    """Shard 1/2's first job prints a catalogued start failure (a corrupt compile cache: refire) and exits; the
    shard is refired as its attempt 2, shard 0/2 runs once, and the union of their newest dirs is uploaded."""
    write_sharded(cluster, eval_env, tmp_path, extra="\n  health: {maxRefires: 2, refireBackoffMinutes: 0}")
    first_of_shard_1 = cluster.script("flaky_shard.sbatch", "#!/bin/bash\n"
                                      'if [ "$EVAL_SHARD" = 1/2 ] && [[ $4 == *__a1 ]]; then\n'
                                      '  mkdir -p "$EVAL_JOBS_DIR"\n'
                                      "  echo 'RuntimeError: Bytes object is corrupted, checksum does not match' >&2\n"
                                      "  exit 1\nfi\n"
                                      f'EVAL_HARBOR_PLUGIN_DIR={REPO}/eval/harbor exec bash {EVAL_HARBOR} "$@"\n')
    cluster.spec.write_text(cluster.spec.read_text().replace(f"jobScript: {EVAL_HARBOR}",
                                                             f"jobScript: {first_of_shard_1}"))

    def converged() -> bool:
        cluster.reconcile()
        return cluster.status()["counts"] == {"Completed": 3}

    wait_until(converged, "the cell and its 2 shards Completed", timeout_s=600, step_s=1.0)

    subs = cluster.submissions()
    by_shard = {tag.rsplit("__a", 1)[0]: [] for tag in (s["run_tag"] for s in subs)}
    for sub in subs:
        by_shard[sub["run_tag"].rsplit("__a", 1)[0]].append(sub["attempt"])
    assert sorted(by_shard.values()) == [[1], [1, 2]], subs  # the failed shard alone ran again
    [union] = [r for r in cluster.rows() if r["job_status"] == "Finished"]
    assert next(m["value"] for m in union["metrics"] if m["name"] == "accuracy") == pytest.approx(TINY_ACCURACY)
    assert union["job_name"].endswith("__a2")  # numbered by its shards' attempts: 1 + (1-1) + (2-1)


def test_with_history_over_max_time_limit_the_estimate_chooses_2_shards_each_asking_its_sized_time(
        cluster, eval_env, tmp_path: Path) -> None:
    """A finished attempt of the same benchmark took 2.5 h (another EvalRun's, recorded in the store): one job would
    ask 3 h 15 m (× 1.25 + the 1 min cancel), more than maxTimeLimit 2 h; a shard of half the tasks asks 1 h 45 m.
    The first pass chooses 2 shards and launches nothing; the next launches them, and SLURM holds their sized
    --time. The union's score is the one the same trials make unsharded."""
    write_sharded(cluster, eval_env, tmp_path, shards="  walltime: auto\n",
                  extra_cluster='  maxTimeLimit: "2:00:00"\n  minTimeLimit: "00:15:00"')
    store = open_store(cluster.store)
    try:
        earlier = Submission(name="ev_earlier__a1", run_tag="ev_earlier__a1", evalrun=EvalRunRef(name="earlier"),
                             cell_key="earlier", attempt=1, fire=1, created_at=datetime.now(UTC),
                             model=cluster.model(2), benchmark="tinyshards", trials=4, concurrency=4)
        store.state.record_submission(earlier)
        store.state.record_job_end(earlier.name, gpu_hours=2.5, elapsed_hours=2.5)
        store.state.finish_attempt(earlier.run_tag)
    finally:
        store.close()

    [planned] = cluster.plan_cells()
    assert planned["rule"] == "ShardsChosen" and "runs as 2 shards of at most 2 tasks" in planned["reason"], planned
    def ours() -> list[dict]:
        return [s for s in cluster.submissions() if s["name"] != earlier.name]

    cluster.reconcile()
    assert ours() == [], "the choice launches nothing"
    [(memory,)] = cluster._query("SELECT memory FROM evalrun_cell_memory")
    assert json.loads(memory)["shards"]["count"] == 2

    cluster.reconcile()
    subs = ours()
    assert len(subs) == 2 and all(s["job_id"] for s in subs), subs
    assert [asked_time(cluster, s["job_id"]) for s in subs] == ["01:45:00", "01:45:00"]

    def converged() -> bool:
        cluster.reconcile()
        return cluster.status()["counts"] == {"Completed": 3}

    wait_until(converged, "the cell and its 2 shards Completed", timeout_s=600, step_s=1.0)
    assert len(ours()) == 2, "no shard ran twice, and the cell never ran unsharded"
    [union] = [r for r in cluster.rows() if r["job_status"] == "Finished"]
    assert next(m["value"] for m in union["metrics"] if m["name"] == "accuracy") == pytest.approx(TINY_ACCURACY)
    tasks = [{json.loads(p.read_text())["task_name"] for p in (cluster.jobs_dir / s["run_tag"]).glob("*/result.json")}
             for s in subs]
    assert not tasks[0] & tasks[1] and tasks[0] | tasks[1] == {"pass", "fail", "slow", "noreward"}
