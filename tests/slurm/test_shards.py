"""A cell run as 2 shards on the lab SLURM with real Harbor over the tiny dataset (RULES §17): killed between its
shards' submissions, the next pass makes one job per shard, no more; the shards run disjoint halves of the dataset,
and the one row uploaded holds the score the same trials make unsharded."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from tests.slurm.conftest import EVAL_HARBOR, wait_until
from tests.slurm.test_converge import TINY_ACCURACY

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]


def write_sharded(cluster, eval_env: Path, tmp_path: Path, extra: str = "") -> None:
    """One model × a preset `tiny` (a catalog override: the tiny dataset, its 4 tasks counted) as 2 shards."""
    catalog = tmp_path / "catalog"
    catalog.mkdir()
    dataset = cluster.tiny_dataset("tinyshards")
    (catalog / "presets.yaml").write_text(json.dumps(
        {"presets": {"tiny": {"dataset": dataset, "n_concurrent": 4, "tasks": 4}}}))
    cluster.env = {**cluster.env, "EVALCTL_CATALOG_DIR": str(catalog)}
    cluster.write(models=[cluster.model(1)], datasets=[dataset], env={"EVAL_ENV": str(eval_env)}, time_limit="10",
                  extra_run="  shards: 2\n  monitor: {preWalltimeMinutes: 1, settleMinutes: 0}" + extra)
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
