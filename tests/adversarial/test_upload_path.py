"""The upload path against a real SQLite store and real Harbor run dirs: a number lands in the results DB only as
the admission gate computed it and as it read back, and no row of another writer is touched.

Each test drives the pure planner (`plan_cell`) over what the store and the run dir show, and the `Actor` over its
plan, pass after pass, as `reconcile` does.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.adapters.rundirs.harbor import HarborRunDirs
from controller.adapters.store.sqlite import SqliteStore
from controller.api.catalog import load_catalog
from controller.core.actions import Submit
from controller.core.actor import Actor, JobLauncher, row_id_for
from controller.core.job_env import JobSecrets, JobSettings
from controller.core.observed import Metric, Observation, ObservedJob, RowStatus, RunDirFacts
from controller.core.planner import Policy, plan_cell
from controller.core.ports import StoreUnavailable, SubmitRequest, TrackedRun, TrackerRecord
from controller.core.records import NewRow, ResultUpload
from controller.core.store import Store
from controller.core.tracking import Analysis
from controller.core.types import Cell
from controller.core.vocabulary import CellPlan, Phase, Plan, Rule
from tests.core.builders import ME, NOW, POLICY, RUN, ago, cell, obs
from tests.fixtures.harbor_dirs import REFERENCE_ERRORS, write_config, write_job_result, write_meta_env, write_trial

MODEL = "laion/Qwen3-8B"
DATASET = "DCAgent2/terminal_bench_2"
CELL = cell(model=MODEL, benchmark=DATASET)  # no preset: Harbor's total is the expected one
TAG = CELL.run_tag(1)
TRACKING = POLICY.model_copy(update={"track": True})


# --------------------------------------------------------------------------- the world: run dirs, store, actor


def settled_trial(run: Path, name: str, reward: float) -> None:
    """A graded trial whose files were written well before the job ended (not settling)."""
    trial = write_trial(run, name, reward=reward, output_tokens=300)
    written = ago(hours=3).timestamp()
    for path in (trial, *trial.rglob("*")):
        os.utime(path, (written, written))


def finished_run(jobs: Path, tag: str = TAG, *, n: int = 10, passed: int = 5) -> RunDirFacts:
    """A complete run of CELL's model: `n` tasks, one attempt each, the first `passed` solved (score passed/n)."""
    run = jobs / tag
    for i in range(n):
        settled_trial(run, f"t{i:03d}__0000000", 1.0 if i < passed else 0.0)
    write_config(run, model=f"hosted_vllm/{MODEL}", dataset=DATASET)
    write_meta_env(run, MODEL=MODEL, REPO_ID=DATASET, AGENT_NAME="terminus-2", TIMEOUT_MULTIPLIER=2.0,
                   RESUME_COUNT=0)
    write_job_result(run, n)
    written = ago(hours=3).timestamp()
    for path in run.iterdir():
        os.utime(path, (written, written))
    return run_dir_facts(jobs, tag)


def run_dir_facts(jobs: Path, tag: str = TAG) -> RunDirFacts:
    return {f.run_tag: f for f in HarborRunDirs(str(jobs), REFERENCE_ERRORS).observe()}[tag]


class ScriptedTracker:
    """A tracker that is down until told otherwise, then holds what was logged."""

    def __init__(self) -> None:
        self.up = False
        self.runs: dict[str, TrackedRun] = {}

    def log(self, experiment: str, record: TrackerRecord) -> str:
        if not self.up:
            raise StoreUnavailable("MLflow at http://mlflow: connection refused")
        self.runs[record.run_tag] = TrackedRun(run_id="run-1", tags=record.tags, params=record.params,
                                               metrics=dict(record.metrics), artifacts=("post_eval_report.txt",))
        return "run-1"

    def read_back(self, experiment: str, run_tag: str, owner: str) -> TrackedRun | None:
        return self.runs.get(run_tag)


class RecordingScheduler:
    """Finds no job by name; records what was submitted."""

    def __init__(self) -> None:
        self.submitted: list[str] = []

    def find(self, name: str) -> ObservedJob | None:
        return None

    def submit(self, request: SubmitRequest) -> str:
        self.submitted.append(request.name)
        return "4242"


def actor(store: SqliteStore, tmp_path: Path, *, tracker: ScriptedTracker | None = None,
          scheduler: RecordingScheduler | None = None) -> Actor:
    launcher = JobLauncher(cluster="c1", script="/bin/true", logs_dir=str(tmp_path / "logs"),
                           settings=JobSettings(jobs_dir=str(tmp_path / "jobs"), username=ME, gpu_memory_util=0.9,
                                                infra_error_threshold=10))
    return Actor(Store(store, store), scheduler, launcher, lambda _: JobSecrets(),  # type: ignore[arg-type]
                 lambda facts, metrics: Analysis(report="report", step_stats={}), load_catalog().error_classes,
                 lambda: NOW, tracker=None if tracker is None else (tracker, "evals"))


def observed(store: SqliteStore, facts: RunDirFacts, c: Cell = CELL) -> Observation:
    """What a pass reads of the cell: every row, its submissions and memory, its run dir; no job in the queue."""
    state = store.read_state(RUN, [c.key], 3600)
    seen = obs(rows=store.read_results(None, None).rows, subs=state.submissions, dirs=(facts,))
    return seen.model_copy(update={"memory": state.cell_memory.get(c.key) or seen.memory})


def one_pass(store: SqliteStore, the_actor: Actor, facts: RunDirFacts, policy: Policy = POLICY) -> CellPlan:
    decided = plan_cell(CELL, observed(store, facts), policy, NOW)
    the_actor.act(Plan(evalrun=RUN, cells=(decided,)))
    return decided


def metric_values(store: SqliteStore, row_id: str) -> dict[str, float | None]:
    row = store.read_row(row_id)
    assert row is not None
    return {m.name: m.value for m in row.metrics or ()}


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteStore]:
    opened = SqliteStore(tmp_path / "store.db")
    yield opened
    opened.close()


# --------------------------------------------------------------------------- verification


# What lands in the row instead of what was written: another writer's score, the same numbers rounded by the
# store, or the list without a metric. Each is written by a trigger the moment our upload writes the row.
NOT_AS_WRITTEN = {
    "another-writers-score": """'[{"name": "accuracy", "value": 0.9}, {"name": "accuracy_stderr", "value": 0.01},
                                  {"name": "n_valid_trials", "value": 10.0}]'""",
    "rounded-by-the-store": """(SELECT json_group_array(json_object('name', json_extract(value, '$.name'),
                                  'value', round(json_extract(value, '$.value'), 2)))
                                FROM json_each(NEW.metrics))""",
    "a-metric-missing": """(SELECT json_group_array(value) FROM json_each(NEW.metrics)
                            WHERE json_extract(value, '$.name') <> 'accuracy_stderr')""",
}


@pytest.mark.parametrize("landed", NOT_AS_WRITTEN.values(), ids=NOT_AS_WRITTEN.keys())
def test_an_upload_that_did_not_read_back_is_retried_not_completed(tmp_path: Path, store: SqliteStore,
                                                                    landed: str) -> None:
    """SCORES.md "Upload and verification": until the read-back matches, the cell stays Evaluated with
    UploadNotVerified and the next pass retries. The row is Finished with metrics, though not ours as written: the
    next pass must not take it for a verified upload."""
    facts = finished_run(tmp_path / "jobs")
    with sqlite3.connect(tmp_path / "store.db") as conn:
        store.read_results(None, None)  # the writable store has made its tables
        conn.execute(f"""CREATE TRIGGER another_writer AFTER UPDATE OF metrics ON sandbox_jobs
                         WHEN NEW.metrics LIKE '%accuracy_stderr", "value": 0.1666%'
                         BEGIN UPDATE sandbox_jobs SET metrics = {landed} WHERE id = NEW.id; END""")
    first = plan_cell(CELL, observed(store, facts), POLICY, NOW)
    outcomes = actor(store, tmp_path).act(Plan(evalrun=RUN, cells=(first,)))
    assert [o.ok for o in outcomes] == [True, False] and "does not show the uploaded metrics" in outcomes[1].message

    second = plan_cell(CELL, observed(store, facts), POLICY, NOW)

    assert second.phase == Phase.EVALUATED, f"{second.phase}: {second.reason} (score {second.score})"
    assert second.reason.startswith("UploadNotVerified")


# --------------------------------------------------------------------------- a Finished row is history


LEGACY_TAG = "laion_Qwen3-8B_terminal_bench_2_20250601"  # the old listener's run tag (no `ev_` prefix)


def test_the_mlflow_retry_never_rewrites_the_old_listeners_finished_row(tmp_path: Path, store: SqliteStore) -> None:
    """DECISIONS "The flag is part of exactly once": re-uploading a Finished row would rewrite history, perhaps the
    old listener's under our username, with today's metrics (rules_upload.flag_note: "not ours to re-upload").
    With upload.mlflow on, logging its run to MLflow must leave the row's published numbers as they are."""
    facts = finished_run(tmp_path / "jobs", LEGACY_TAG, passed=5)
    store.create_row(NewRow(id="legacy-row", job_name=LEGACY_TAG, username=ME, model_name=MODEL,
                            benchmark_name="terminal_bench_2", job_status=RowStatus.STARTED,
                            config={"agent": "terminus-2", "timeout_multiplier": 2.0}))
    published = (Metric(name="accuracy", value=0.9), Metric(name="accuracy_stderr", value=0.01))
    store.upload_result("legacy-row", ResultUpload(metrics=published, stats={"n_trials": 10}, n_trials=10,
                                                   ended_at=ago(days=30)), owner=ME)
    tracker = ScriptedTracker()
    tracker.up = True

    one_pass(store, actor(store, tmp_path, tracker=tracker), facts, TRACKING)

    assert metric_values(store, "legacy-row") == {"accuracy": 0.9, "accuracy_stderr": 0.01}


def test_a_verified_row_is_not_rewritten_when_only_mlflow_is_retried(tmp_path: Path, store: SqliteStore) -> None:
    """The row read back as uploaded in pass 1 (its `db_verified` is remembered); only MLflow failed. A late trial
    of a killed fire's sandbox lands before pass 2. Retrying MLflow must not publish a second, different number
    in the row: with upload.mlflow off the row would have stayed as verified, so the store's content must not
    depend on whether the MLflow server was up."""
    jobs = tmp_path / "jobs"
    tracker = ScriptedTracker()
    the_actor = actor(store, tmp_path, tracker=tracker)
    one_pass(store, the_actor, finished_run(jobs, passed=5), TRACKING)
    verified = metric_values(store, row_id_for(TAG))
    assert verified["accuracy"] == 0.5

    settled_trial(jobs / TAG, "t000__0000001", 0.0)  # the late sandbox's result, beside the re-run
    tracker.up = True
    one_pass(store, the_actor, run_dir_facts(jobs), TRACKING)

    assert metric_values(store, row_id_for(TAG)) == verified


# --------------------------------------------------------------------------- ownership of the intent's row


def test_no_job_is_submitted_when_the_intents_row_is_another_users(tmp_path: Path, store: SqliteStore) -> None:
    """RULES §12: the intent (our submission and OUR Pending row) is durable before anything runs; RULES §1: another
    user's row is never ours. Run tags carry no username, so bob, running the same spec against the same results DB
    (his own state), writes the row of the same deterministic id first: our create_row is silently ignored, and
    the job must not be submitted on an intent whose row we do not own (its EVAL_DB_JOB_ID would be bob's row)."""
    store.create_row(NewRow(id=row_id_for(TAG), job_name=TAG, username="bob", model_name=MODEL,
                            benchmark_name="terminal_bench_2", job_status=RowStatus.PENDING, submitted_at=NOW))
    scheduler = RecordingScheduler()
    submitting = CellPlan(cell=CELL, phase=Phase.PENDING, reason="no existing job", rule=Rule.NO_EXISTING_JOB,
                          actions=(Submit(reason="start", run_tag=TAG, attempt=1),))

    actor(store, tmp_path, scheduler=scheduler).act(Plan(evalrun=RUN, cells=(submitting,)))

    assert scheduler.submitted == []
    landed = store.read_row(row_id_for(TAG))
    assert landed is not None and landed.username == "bob" and landed.slurm_job_id == "pending"


def test_the_uploaded_row_names_the_cluster_the_run_ran_on(tmp_path: Path, store: SqliteStore) -> None:
    """A cell's row is written with its first submission; a queued job that spilled ran on another cluster, whose
    lane uploads it. The row's config.env, what the lab's dashboards group by, names where it ran."""
    facts = finished_run(tmp_path / "jobs")
    store.create_row(NewRow(id=row_id_for(TAG), job_name=TAG, username=ME, model_name=MODEL,
                            benchmark_name="terminal_bench_2", job_status=RowStatus.STARTED,
                            config={"agent": "terminus-2", "env": "lab-a", "run_tag": TAG}))

    one_pass(store, actor(store, tmp_path), facts)

    landed = store.read_row(row_id_for(TAG))
    assert landed is not None and landed.job_status == "Finished"
    assert landed.config == {"agent": "terminus-2", "env": CELL.cluster, "run_tag": TAG}
