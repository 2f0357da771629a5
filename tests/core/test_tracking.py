"""Verify before claiming: with `upload.mlflow`, a finished cell is Completed only once its MLflow run read back."""

from __future__ import annotations

from controller.core.actions import ActionKind
from controller.core.observed import Metric
from controller.core.planner import plan_cell
from controller.core.ports import TrackedRun
from controller.core.remedies import CellMemory
from controller.core.tracking import Analysis, differences, tracker_record
from controller.core.trial_errors import ErrorClasses
from controller.core.vocabulary import Phase
from tests.core.builders import NOW, POLICY, SCORED, cell, facts, metrics_of, obs, row, sub

TRACKING = POLICY.model_copy(update={"track": True})
ERRORS = ErrorClasses(infra=("DaytonaError", "CancelledError"), benign=("AgentTimeoutError",))
CELL = cell()
OWNER = "alice"
TAG = CELL.run_tag(1)


def finished(memory: CellMemory | None = None, *, user: str = "alice", metrics: tuple[Metric, ...] | None = None):
    """A Finished row holding what the gate gives its run dir (as our verified upload wrote it), unless `metrics`."""
    run = facts(TAG)
    uploaded = metrics_of(run, ERRORS, CELL).metrics if metrics is None else metrics
    observed = obs(rows=(row("Finished", metrics=uploaded, job_name=TAG, user=user),), subs=(sub(CELL),),
                   dirs=(run,))
    return observed.model_copy(update={"memory": memory or CellMemory()})


def test_a_finished_row_not_yet_read_back_from_mlflow_is_evaluated_and_logged_again() -> None:
    decided = plan_cell(CELL, finished(), TRACKING, NOW)

    assert decided.phase == Phase.EVALUATED
    assert [a.kind for a in decided.actions] == [ActionKind.ANALYZE, ActionKind.TRACK]  # the row is not written
    assert decided.reason.startswith("UploadNotVerified: not logged to MLflow yet")


def test_a_finished_row_whose_dir_now_gives_another_number_is_not_logged_to_mlflow() -> None:
    """A late trial, or an older tool's upload under our name: MLflow would publish a second number for one run,
    and the row is history, never rewritten."""
    decided = plan_cell(CELL, finished(metrics=SCORED), TRACKING, NOW)

    assert decided.phase == Phase.COMPLETED and [a.kind for a in decided.actions] == [ActionKind.SKIP]
    assert "not logged to MLflow: its run dir now gives" in decided.reason and "row holds 0.5" in decided.reason


def test_the_last_failure_is_the_reason_until_a_read_back_matches() -> None:
    failed = plan_cell(CELL, finished(CellMemory(track_error="MLflow: metric accuracy: logged 0.5, server has nothing")),
                       TRACKING, NOW)
    verified = plan_cell(CELL, finished(CellMemory(tracked_run_tag=TAG)), TRACKING, NOW)

    assert failed.phase == Phase.EVALUATED and "server has nothing" in failed.reason
    assert verified.phase == Phase.COMPLETED and [a.kind for a in verified.actions] == [ActionKind.SKIP]


def test_a_read_back_of_another_attempt_does_not_count() -> None:
    assert plan_cell(CELL, finished(CellMemory(tracked_run_tag=CELL.run_tag(2))), TRACKING, NOW).phase == Phase.EVALUATED


def test_other_users_rows_and_runs_without_tracking_are_completed_as_before() -> None:
    assert plan_cell(CELL, finished(user="bob"), TRACKING, NOW).phase == Phase.COMPLETED
    assert plan_cell(CELL, finished(), POLICY, NOW).phase == Phase.COMPLETED


ANALYSIS = Analysis(report="report", step_stats={"steps_mean": 12.5, "steps_median": 12.0, "steps_max": 30.0,
                                                 "n_trajectories": 10.0})


def record_for(breakdown: dict[str, int]):
    run = facts(TAG).model_copy(update={"error_breakdown": breakdown})
    return tracker_record(CELL, run, OWNER, metrics_of(run, ERRORS, CELL), ANALYSIS, ERRORS)


def test_every_run_has_the_same_metric_names_whatever_its_errors() -> None:
    clean, noisy = record_for({}), record_for({"DaytonaError": 3, "SomethingNew": 1})

    assert set(clean.metrics) == set(noisy.metrics)
    assert clean.metrics["errors.DaytonaError"] == 0 and noisy.metrics["errors.DaytonaError"] == 3
    assert clean.metrics["errors.other"] == 0 and noisy.metrics["errors.other"] == 1
    assert {"accuracy", "steps_mean", "steps_median", "steps_max"} <= set(clean.metrics)


def test_differences_name_whatever_did_not_land() -> None:
    record = record_for({"DaytonaError": 2})
    exact = TrackedRun(run_id="r", tags=record.tags, params=record.params, metrics=dict(record.metrics),
                       artifacts=("post_eval_report.txt",))
    lost_bucket = exact.model_copy(update={"metrics": {k: v for k, v in record.metrics.items()
                                                       if k != "errors.DaytonaError"}})
    other_score = exact.model_copy(update={"metrics": {**record.metrics, "accuracy": 0.25}})

    assert differences(record, exact) == []
    assert differences(record, None) == [f"no MLflow run tagged {TAG}"]
    assert differences(record, lost_bucket) == ["metric errors.DaytonaError: logged 2, server has nothing"]
    assert differences(record, other_score) == ["metric accuracy: logged 0.5, server has 0.25"]
    assert differences(record, exact.model_copy(update={"artifacts": ()})) == [
        "artifact post_eval_report.txt missing"]


def test_trial_counts_count_a_task_s_re_runs_once() -> None:
    """Ten results of a one-attempt task (a resume re-ran it, late sandboxes landed) are one trial of the benchmark:
    MLflow's counts agree with the n the score was taken over, never 19 of 10."""
    tasks = {"task-000": (10, 10, 10.0), **{f"task-{i:03d}": (1, 1, 0.0) for i in range(1, 10)}}
    run = facts(TAG, total=10, completed=19, scored=19).model_copy(update={"tasks": tasks})
    record = tracker_record(CELL, run, OWNER, metrics_of(run, ERRORS, CELL), ANALYSIS, ERRORS)

    assert (record.metrics["n_completed_trials"], record.metrics["n_scored_trials"]) == (10, 10)
    assert record.metrics["n_valid_trials"] == 10 and record.metrics["accuracy"] == 0.1
