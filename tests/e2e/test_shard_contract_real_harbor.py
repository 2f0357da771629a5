"""The shard contract of the job script eval/slurm/eval_harbor.sbatch, with REAL Harbor 0.26 (the oracle agent, the
host environment) over a copy of eval/harbor/tiny-dataset: `EVAL_SHARD=i/K` runs a subset of the tasks, the K
subsets are disjoint and cover the dataset, their trials score what the same trials score unsharded, and a resume of
a shard stays within its subset (Harbor keeps the subset in config.json). The script runs as a plain process: SLURM
adds nothing to what is checked here. Read back through the reconciler's own run-dir reader.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from controller.adapters.rundirs.harbor import HarborRunDirs
from controller.core.observed import RunDirFacts
from tests.fixtures.harbor_dirs import REFERENCE_ERRORS

pytestmark = [pytest.mark.skipif(os.geteuid() != 0, reason="Harbor's host environment needs root (mount namespaces)"),
              pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
SBATCH = REPO / "eval" / "slurm" / "eval_harbor.sbatch"
TINY_DATASET = REPO / "eval" / "harbor" / "tiny-dataset"


def run_script(eval_env: Path, jobs: Path, dataset: Path, run_tag: str, code: int = 0,
               **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("EVAL_")}
    environ |= {"EVAL_ENV": str(eval_env), "EVAL_JOBS_DIR": str(jobs), "EVAL_N_CONCURRENT": "4"} | env
    done = subprocess.run(["bash", str(SBATCH), "org/oracle", str(dataset), "b1", run_tag], env=environ,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == code, done.stdout + done.stderr
    return done


def observe(jobs: Path) -> dict[str, RunDirFacts]:
    return {facts.run_tag: facts for facts in HarborRunDirs(str(jobs), REFERENCE_ERRORS).observe()}


def test_two_shards_are_disjoint_cover_the_dataset_and_score_as_unsharded(tmp_path: Path, eval_env: Path) -> None:
    dataset, jobs = tmp_path / "tiny", tmp_path / "jobs"
    shutil.copytree(TINY_DATASET, dataset)
    (dataset / "pass").rename(dataset / "pass[1]")  # a glob character in a task name is matched literally
    (dataset / "notes").mkdir()  # a dir without task.toml is no task
    (dataset / "notes" / "README").write_text("not a task\n")
    for run_tag, shard in (("whole", ""), ("shard0", "0/2"), ("shard1", "1/2")):
        run_script(eval_env, jobs, dataset, run_tag, EVAL_SHARD=shard)

    seen = observe(jobs)
    whole, shards = seen["whole"], (seen["shard0"], seen["shard1"])
    assert [set(s.tasks) for s in shards] == [{"fail", "pass[1]"}, {"noreward", "slow"}]  # i-th of every 2, sorted
    assert set(whole.tasks) == {"fail", "noreward", "pass[1]", "slow"}
    for shard in shards:  # each task's (trials, scored, reward sum) is the unsharded run's
        assert {task: whole.tasks[task] for task in shard.tasks} == shard.tasks
        assert shard.n_total == 2
    assert sum(s.reward_sum for s in shards) == whole.reward_sum == 1.0
    assert sum(s.n_scored for s in shards) == whole.n_scored
    assert "SHARD=1/2\n" in (jobs / "shard1" / "meta.env").read_text()
    config = json.loads((jobs / "shard1" / "config.json").read_text())
    assert config["datasets"][0]["task_names"] == ["noreward", "slow"]

    # A resume runs the shard's subset again, and only it (EVAL_SHARD is not needed then: config.json holds it).
    [trial] = [p for p in (jobs / "shard1").iterdir() if p.name.startswith("noreward__")]
    (trial / "result.json").unlink()
    run_script(eval_env, jobs, dataset, "shard1", EVAL_RESUME="1", EVAL_RESUME_COUNT="1")
    resumed = observe(jobs)["shard1"]
    assert resumed.tasks == seen["shard1"].tasks
    assert (resumed.n_completed, resumed.fires) == (2, 2)


def test_a_shard_outside_the_contract_exits_2_before_any_run_dir(tmp_path: Path, eval_env: Path) -> None:
    jobs = tmp_path / "jobs"
    for shard, says in (("2/2", "EVAL_SHARD must be i/K with 0 <= i < K"), ("0/", "EVAL_SHARD must be i/K"),
                        ("4/5", "EVAL_SHARD=4/5 selects no task: ")):
        done = run_script(eval_env, jobs, TINY_DATASET, "bad", code=2, EVAL_SHARD=shard)
        assert says in done.stderr
    assert not (jobs / "bad").exists()
