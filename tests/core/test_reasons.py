"""A reason names the cause and says what was decided, never an action that was not taken (issue 29, item 6):
a hold quotes the catalog's advice without claiming a refire, a refire says what it adds, a failed first job
whose jobs dir was never seen is held with the job's failure, not a guess at an unmounted filesystem."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from controller.adapters.rundirs.harbor import HarborRunDirs
from controller.api.catalog import load_catalog
from controller.core.match import join_cells
from controller.core.observed import JobState, Observation
from controller.core.planner import plan_cell
from controller.core.ports import JobsDirMissing
from controller.core.records import NamedRow, SandboxJobRow, StoreSnapshot
from controller.core.remedies import CellMemory, Remedy, RemedyCause, RemedyKind
from controller.core.vocabulary import Phase
from tests.core.builders import ME, NOW, ago, cell, facts, job, obs, row, spec_policy, sub

CATALOG = load_catalog()
POLICY = spec_policy(health=spec_policy().health.model_copy(update={"failure_modes": CATALOG.failures.modes_for([])}),
                     cluster="hpc")
C = cell()
TAG = C.run_tag(1)
CORRUPT = "RuntimeError: Bytes object is corrupted, checksum does not match"
CLAIMS = re.compile(r"\b(refired|cancelled|excluded|quarantined|paused|resumed|uploaded)\b", re.IGNORECASE)


def failed_at_start(log: str, *, job_id: str = "7"):
    """The cell's first job, FAILED at start with `log` as its output's last line (as the schedulers report it)."""
    return job(TAG, JobState.FAILED, job_id=job_id, started=ago(minutes=5), ended=ago(minutes=4)).model_copy(
        update={"log_tail": f"loading model\n{log}", "reason": log})


def with_jobs_dir_missing(failed, jobs_dir: Path) -> Observation:
    """What a pass observes when the cluster's jobs dir was never made: the real adapter's error, the real join."""
    with pytest.raises(JobsDirMissing) as missing:
        HarborRunDirs(str(jobs_dir), CATALOG.error_classes).observe()
    snapshot = StoreSnapshot(
        models=(NamedRow(id="m", name=C.model),), benchmarks=(NamedRow(id="b", name=C.benchmark_name),),
        rows=(SandboxJobRow(id="r", job_name=TAG, username=ME, job_status="Pending", model_id="m", benchmark_id="b",
                            slurm_job_id=failed.job_id),),
        submissions=(sub(C, job_id=failed.job_id),))
    [seen] = join_cells([C], snapshot, (failed,), (), jobs_dir_missing=str(missing.value))
    return seen


def test_a_first_job_that_failed_at_start_is_held_with_its_failure_not_an_unmounted_guess(tmp_path: Path):
    seen = with_jobs_dir_missing(failed_at_start("OSError: /models/x: No such file"), tmp_path / "jobs")
    decided = plan_cell(C, seen, POLICY, NOW)

    assert decided.phase == Phase.FAILED and [a.kind.value for a in decided.actions] == ["hold"]
    assert decided.reason == ("job 7 failed: OSError: /models/x: No such file "
                              f"(run dir not observed: jobs dir {tmp_path / 'jobs'} does not exist)")
    assert "unmounted" not in decided.reason


def test_a_cell_with_history_but_no_failed_job_still_asks_about_the_filesystem(tmp_path: Path):
    """Unknown, no action: its job ran, so the dir should be there; the guess is a question, asked there only."""
    ran = job(TAG, JobState.COMPLETED, job_id="7", started=ago(hours=2), ended=ago(hours=1))
    decided = plan_cell(C, with_jobs_dir_missing(ran, tmp_path / "jobs"), POLICY, NOW)

    assert decided.phase == Phase.UNKNOWN and decided.actions == ()
    assert f"jobs dir {tmp_path / 'jobs'} does not exist (unmounted filesystem?)" in decided.reason


def test_a_catalogued_failure_held_for_a_human_claims_no_refire(tmp_path: Path):
    decided = plan_cell(C, with_jobs_dir_missing(failed_at_start(CORRUPT), tmp_path / "jobs"), POLICY, NOW)

    assert [a.kind.value for a in decided.actions] == ["hold"]
    assert "torch-compile-cache-corrupt: corrupt torch-compile cache" in decided.reason
    assert not CLAIMS.search(decided.reason), decided.reason


def ended_early(log: str, memory: CellMemory | None = None):
    failed_early = facts(TAG, total=None, completed=0, has_result=False, trial_dirs=0, finished=False)
    failed = job(TAG, JobState.FAILED, started=ago(hours=1), ended=ago(minutes=30)).model_copy(
        update={"log_tail": log, "reason": log})
    return obs(subs=(sub(C),), rows=(row("Started", job_name=TAG),), jobs=(failed,), dirs=(failed_early,)).model_copy(
        update={"memory": memory or CellMemory()})


def test_a_refire_says_what_it_adds_and_an_exhausted_one_says_it_was_not_refired():
    refire = plan_cell(C, ended_early(CORRUPT), POLICY, NOW)
    used = tuple(Remedy(run_tag=C.run_tag(a), kind=RemedyKind.REFIRE, diagnosis="earlier", at=ago(hours=h),
                        cause=RemedyCause.KNOWN_FAILURE) for a, h in ((2, 3), (3, 2)))
    exhausted = plan_cell(C, ended_early(CORRUPT, CellMemory(remedies=used)), POLICY, NOW)

    assert [a.kind.value for a in refire.actions] == ["submit"]
    assert refire.reason.startswith("refire 1 of 2 with EVAL_CLEAR_COMPILE_CACHE=1: torch-compile-cache-corrupt: ")
    assert [a.kind.value for a in exhausted.actions] == ["hold"]
    assert exhausted.reason.endswith("; not refired again: 2 refire(s) used (health.maxRefires)")
    assert not CLAIMS.search(exhausted.reason.removesuffix("; not refired again: 2 refire(s) used (health.maxRefires)"))


@pytest.mark.parametrize("mode", CATALOG.failures.modes_for([]), ids=lambda m: f"{m.name}-{m.when.value}")
def test_no_catalog_advice_claims_an_action(mode):
    """The advice is quoted in holds as in refires: it says what the failure means and what fixes it."""
    assert not CLAIMS.search(mode.advice), mode.advice
