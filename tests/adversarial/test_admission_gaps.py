"""Run dirs in Harbor's real layout that the admission gate (RULES §14) lets through as a plain upload, although
the number is not what the model earned on the cell, or the run is not the cell's.

Each case is a finished run dir of one cell, read from disk by the real adapter and planned by the pure planner:
its job ended two hours ago, its files were written before that, and no fire is left to resume it, so the plan is
the gate's last word. Each test states what the plan must not do (publish) or what the number must be.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from controller.adapters.rundirs.harbor import HarborRunDirs
from controller.core.actions import Upload
from controller.core.observed import JobState
from controller.core.planner import plan_cell
from controller.core.types import Cell
from controller.core.vocabulary import CellPlan
from tests.core.builders import NOW, POLICY, ago, cell, job, obs, row, sub
from tests.fixtures.harbor_dirs import REFERENCE_ERRORS, write_config, write_job_result, write_meta_env, write_trial

MODEL = "laion/Qwen3-8B"
OTHER_MODEL = "org/Other-70B"
TB2_DATASET = "DCAgent2/terminal_bench_2"
PLAIN = cell(model=MODEL, benchmark=TB2_DATASET)  # a dataset the catalog does not know: Harbor's total is expected
NO_FIRES_LEFT = POLICY.model_copy(update={"max_total_fires": 1})
Edit = Callable[[dict[str, Any]], None]


def trial(run: Path, task: str, attempt: int = 0, *, reward: float | None = 0.0, exception: str | None = None,
          tokens: object = 300, seconds: float | None = 240.0, edit: Edit | None = None) -> None:
    """One finished trial of `task` as Harbor writes it (the model answered, the verifier graded it); `edit`
    changes its result.json afterwards."""
    path = write_trial(run, f"{task}__{attempt:07d}", reward=reward, exception=exception, output_tokens=tokens,
                       agent_seconds=seconds)
    if edit is not None:
        result = path / "result.json"
        doc = json.loads(result.read_text())
        edit(doc)
        result.write_text(json.dumps(doc))


def genuine(run: Path, n: int, *, passed: int = 0) -> None:
    """Trials of tasks t000..t{n-1}, the first `passed` of them solved."""
    for i in range(n):
        trial(run, f"t{i:03d}", reward=1.0 if i < passed else 0.0)


def job_files(run: Path, n_total: int | None, *, config_model: str = MODEL, meta_model: str = MODEL,
              dataset: str = TB2_DATASET, multiplier: float = 2.0, **meta: object) -> None:
    """config.json (Harbor's JobConfig), meta.env (the job script's) and a finished job result.json."""
    write_config(run, model=f"hosted_vllm/{config_model}", dataset=dataset, timeout_multiplier=multiplier)
    write_meta_env(run, **{"MODEL": meta_model, "REPO_ID": dataset, "AGENT_NAME": "terminus-2",
                           "TIMEOUT_MULTIPLIER": multiplier, "RESUME_COUNT": 0, **meta})
    write_job_result(run, n_total)


def decided(tmp_path: Path, c: Cell, build: Callable[[Path], None]) -> tuple[CellPlan, list[Upload]]:
    """The plan for `c` whose attempt-1 run dir `build` wrote, and the uploads it holds. A fix may refuse such a
    file as unreadable instead: the cell is then Unknown, nothing is uploaded, and the test passes."""
    tag = c.run_tag(1)
    run = tmp_path / tag
    build(run)
    written = ago(hours=3).timestamp()  # before the job ended: not settling
    for path in run.rglob("*"):
        os.utime(path, (written, written))
    (facts,) = HarborRunDirs(str(tmp_path), REFERENCE_ERRORS).observe()  # unreadable: held, which passes
    ended = job(tag, JobState.COMPLETED, started=ago(hours=4), ended=ago(hours=2))
    plan = plan_cell(c, obs(rows=(row("Started", job_name=tag),), subs=(sub(c),), jobs=(ended,), dirs=(facts,)),
                     NO_FIRES_LEFT, NOW)
    return plan, [a for a in plan.actions if isinstance(a, Upload)]


# --------------------------------------------------------------------------- identity


def test_a_run_whose_harbor_config_names_another_model_is_not_published(tmp_path: Path) -> None:
    """config.json is what Harbor ran (`agents[0].model_name`); meta.env naming the cell's model must not outvote
    it. The gate takes meta.env's MODEL alone and calls the identity ok."""
    def build(run: Path) -> None:
        genuine(run, 20, passed=10)
        job_files(run, 20, config_model=OTHER_MODEL, meta_model=MODEL)

    plan, uploads = decided(tmp_path, PLAIN, build)
    assert uploads == [], f"published another model's run: {plan.reason}"


def other_model_in_trials(doc: dict[str, Any]) -> None:
    doc["config"]["agent"] = {"name": "terminus-2", "model_name": f"hosted_vllm/{OTHER_MODEL}"}
    doc["agent_info"]["model_info"] = {"name": OTHER_MODEL, "provider": "hosted_vllm"}


def other_dataset_in_trials(doc: dict[str, Any]) -> None:
    doc["source"] = "dev_set_v2"
    doc["task_id"] = {"path": f"/data/DCAgent/dev_set_v2/{doc['task_name']}"}


TRIAL_IDENTITY: dict[str, tuple[Edit, bool]] = {
    # every trial's result.json names another model; neither config.json nor meta.env is there to say anything
    "trials-of-another-model-no-job-files": (other_model_in_trials, False),
    # the job files are the cell's, every trial says it ran a task of another dataset
    "trials-of-another-dataset": (other_dataset_in_trials, True),
}


@pytest.mark.parametrize("case", TRIAL_IDENTITY.values(), ids=TRIAL_IDENTITY.keys())
def test_what_every_trial_says_it_ran_is_part_of_the_identity(tmp_path: Path, case: tuple[Edit, bool]) -> None:
    """Each Harbor trial result records its model (`config.agent.model_name`, `agent_info.model_info`) and its
    dataset (`source`, `task_id.path`); the gate reads neither, and what the job files do not say it takes as ok."""
    edit, with_job_files = case

    def build(run: Path) -> None:
        for i in range(20):
            trial(run, f"t{i:03d}", reward=float(i < 15), edit=edit)
        if with_job_files:
            job_files(run, 20)
        else:
            write_job_result(run, 20)

    plan, uploads = decided(tmp_path, PLAIN, build)
    assert uploads == [], f"published a run its trials say is not the cell's: {plan.reason}"


RECORDED_DATASETS = {
    # Harbor ran dev_set_v2 (config.json and REPO_ID say so); meta.env's BENCHMARK_NAME label says tb2
    "another-benchmark-labelled-tb2": ("DCAgent/dev_set_v2", {"BENCHMARK_NAME": "terminal_bench_2"}),
    # a same-named dataset of another org: another cell (its key and run tag differ), same benchmark name
    "same-name-another-org": ("OtherOrg/terminal_bench_2", {}),
}


@pytest.mark.parametrize("case", RECORDED_DATASETS.values(), ids=RECORDED_DATASETS.keys())
def test_a_run_of_another_dataset_is_not_published(tmp_path: Path, case: tuple[str, dict[str, str]]) -> None:
    """The gate compares only the benchmark *name* (meta.env's BENCHMARK_NAME first), never the dataset the run
    dir records (meta.env REPO_ID, config.json datasets[0].path) against the cell's dataset."""
    dataset, meta = case

    def build(run: Path) -> None:
        genuine(run, 20, passed=10)
        job_files(run, 20, dataset=dataset, **meta)

    plan, uploads = decided(tmp_path, PLAIN, build)
    assert uploads == [], f"published a run of {dataset} as {PLAIN.dataset}: {plan.reason}"


def test_a_run_with_another_timeout_multiplier_is_not_published_as_the_cells(tmp_path: Path) -> None:
    """The row's config records the cell's ×2 (actor.row_config); a run that Harbor ran at ×16 (config.json and
    meta.env agree) is another measurement. `run_dir_matches` refuses such a dir for the old listener's runs; the
    gate does not look."""
    def build(run: Path) -> None:
        genuine(run, 20, passed=10)
        job_files(run, 20, multiplier=16.0)

    plan, uploads = decided(tmp_path, PLAIN, build)
    assert uploads == [], f"published a ×16 run under a ×2 row: {plan.reason}"


# --------------------------------------------------------------------------- completeness


# (cell, distinct tasks in the run, each run once): neither run holds the cell's attempts of its tasks
SHORT_OF_ATTEMPTS = {
    # nAttempts 3 on a dataset the catalog does not know: Harbor ran each of its 20 tasks once (its total 20), and
    # the gate took Harbor's total as the whole run, publishing a 1-attempt score for a 3-attempt cell (the row
    # says n_rep_eval 3)
    "fewer-attempts-than-the-cell": (PLAIN.model_copy(update={"n_attempts": 3}), 20),
    # the catalog says 10 tasks × 3 attempts = 30; the run has 30 distinct tasks, one attempt each (another, bigger
    # dataset): distinct (task, attempt) pairs counted 30 and it was published as complete, though no task has
    # its 3 attempts and 20 tasks are not the benchmark's
    "more-tasks-than-the-catalog": (cell(model=MODEL, tasks=10, n_attempts=3, partial_credit=False), 30),
}


@pytest.mark.parametrize(("c", "tasks"), SHORT_OF_ATTEMPTS.values(), ids=SHORT_OF_ATTEMPTS.keys())
def test_a_run_of_one_attempt_per_task_is_not_a_complete_run_of_the_cell(tmp_path: Path, c: Cell, tasks: int) -> None:
    def build(run: Path) -> None:
        genuine(run, tasks, passed=tasks // 2)
        job_files(run, tasks)

    plan, uploads = decided(tmp_path, c, build)
    assert uploads == [], f"published {tasks} tasks × 1 as {c.tasks or tasks} tasks × {c.n_attempts}: {plan.reason}"


def test_duplicates_beyond_n_attempts_do_not_weigh_in_the_score(tmp_path: Path) -> None:
    """10 tasks × 1 attempt; the model solved t000 only (1/10). Ten more results of t000 (a resume re-running it,
    late sandboxes of killed fires) count once for completeness but ten more times in the score: 11/20."""
    c = cell(model=MODEL, tasks=10, n_attempts=1, partial_credit=False)

    def build(run: Path) -> None:
        genuine(run, 10, passed=1)
        for attempt in range(1, 11):
            trial(run, "t000", attempt, reward=1.0)
        job_files(run, 10)

    plan, uploads = decided(tmp_path, c, build)
    assert all(u.admitted.score == pytest.approx(0.1) for u in uploads), \
        f"score {uploads[0].admitted.score:g}, the model earned 0.1: {plan.reason}"


def test_duplicates_do_not_dilute_the_infra_share(tmp_path: Path) -> None:
    """20 tasks × 1 attempt, 5 of them (25%) infra only: over upload.maxInfraErrorFraction 0.1, held. Thirty
    duplicate results of the 15 graded tasks bring the share, measured over all trials, to 5/50 = 10%, and the
    run is published plainly (not partial) with a quarter of the benchmark never measured."""
    c = cell(model=MODEL, tasks=20, n_attempts=1, partial_credit=False)

    def build(run: Path) -> None:
        genuine(run, 15, passed=5)
        for i in range(15, 20):
            trial(run, f"t{i:03d}", reward=None, exception="DaytonaError")
        for i in range(15):
            for attempt in (1, 2):
                trial(run, f"t{i:03d}", attempt, reward=1.0 if i < 5 else 0.0)
        job_files(run, 20)

    plan, uploads = decided(tmp_path, c, build)
    assert uploads == [], f"published with 5 of 20 tasks unmeasured: {plan.reason}"


# --------------------------------------------------------------------------- trials counted as the model's


def exception_without_type(doc: dict[str, Any]) -> None:
    doc["exception_info"] = {"exception_message": "sandbox lost", "exception_traceback": "Traceback ...",
                             "occurred_at": "2026-11-29T12:03:00Z"}


def exception_with_empty_type(doc: dict[str, Any]) -> None:
    exception_without_type(doc)
    doc["exception_info"]["exception_type"] = ""


def infra_failure_in_a_step(doc: dict[str, Any]) -> None:
    """A multi-step trial as Harbor 0.26 writes it (trial/multi_step.py): the failure is recorded on the step,
    the trial's own exception_info stays null, and its reward is the mean over the steps that were verified."""
    doc["step_results"] = [
        {"step_name": "one", "verifier_result": {"rewards": {"reward": 1.0}}, "exception_info": None,
         "agent_result": {"n_input_tokens": 1000, "n_output_tokens": 300}},
        {"step_name": "two", "verifier_result": None, "agent_result": None,
         "exception_info": {"exception_type": "SandboxBuildFailedError", "exception_message": "build failed",
                            "exception_traceback": "Traceback ...", "occurred_at": "2026-11-29T12:03:00Z"}},
    ]
    doc["verifier_result"] = {"rewards": {"reward": 1.0}}
    doc["agent_result"] = None
    doc["exception_info"] = None


def agent_never_ran(doc: dict[str, Any]) -> None:
    """No agent_execution, no agent_result: nothing shows the agent (or the model) did anything."""
    doc["agent_execution"] = None
    doc.pop("agent_result", None)


UNMEASURED: dict[str, tuple[Edit, float]] = {
    # exception_info is there, its class is not: read as "no exception", a graded 0
    "exception-info-without-type": (exception_without_type, 0.0),
    "exception-info-with-empty-type": (exception_with_empty_type, 0.0),
    # SandboxBuildFailedError is infra in the catalog (and has_valid_reward false in Harbor's own policy)
    "infra-failure-in-a-step": (infra_failure_in_a_step, 1.0),
    # the verifier graded a workspace no agent touched
    "agent-never-ran": (agent_never_ran, 1.0),
}


@pytest.mark.parametrize("case", UNMEASURED.values(), ids=UNMEASURED.keys())
def test_a_trial_that_measured_nothing_is_not_the_models_score(tmp_path: Path, case: tuple[Edit, float]) -> None:
    """18 genuine trials, 9 solved (0.5), and 2 trials that are no measurement of the model: they must be left out
    (infra) as RULES §14 says, so the score stays 9/18 (or the run is held); the gate scores them as graded."""
    edit, reward = case

    def build(run: Path) -> None:
        genuine(run, 18, passed=9)
        for i in (18, 19):
            trial(run, f"t{i:03d}", reward=reward, edit=edit)
        job_files(run, 20)

    plan, uploads = decided(tmp_path, PLAIN, build)
    assert all(u.admitted.score == pytest.approx(9 / 18) and u.admitted.n_scored == 18 for u in uploads), \
        f"scored as the model's: {plan.reason}"
