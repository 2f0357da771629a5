"""post_eval_report.txt: histogram with every known class, step stats, tolerant of bad trajectories."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from controller.adapters.rundirs.harbor import HarborRunDirs
from controller.adapters.rundirs.post_eval import REPORT_NAME, post_eval_analysis, write_post_eval_report
from controller.core.admission import Refusal, Refused
from tests.core.builders import gate, metrics_of
from tests.fixtures.harbor_dirs import REFERENCE_ERRORS, write_job_result, write_meta_env, write_trial


def test_report_has_score_histogram_and_steps(tmp_path: Path) -> None:
    run = tmp_path / "r"
    write_job_result(run, n_total=5)
    write_trial(run, "a__aaaaaaa", reward=1.0, steps=4)
    write_trial(run, "b__bbbbbbb", reward=0.0, steps=10)
    write_trial(run, "c__ccccccc", reward=0.0, exception="AgentTimeoutError", steps=7)
    write_trial(run, "d__ddddddd", exception="DaytonaError")  # no trajectory
    corrupt = write_trial(run, "e__eeeeeee", result=False, steps=3)
    (corrupt / "agent" / "trajectory.json").write_text("[{")
    (facts,) = HarborRunDirs(str(tmp_path), REFERENCE_ERRORS).observe()
    # 4 of 5 trials, one infra: a partial upload's report
    metrics = metrics_of(facts, REFERENCE_ERRORS, partial_upload=True)
    assert metrics.stats.partial and metrics.stats.evidence["seen"] == 4

    path, summary = write_post_eval_report(run, facts, REFERENCE_ERRORS, metrics)

    assert path == run / REPORT_NAME and path.is_file()
    assert summary.mean_score == 1 / 3 and (summary.n_scored, summary.n_total, summary.n_valid) == (3, 5, 3)
    assert summary.steps is not None
    assert summary.steps.model_dump() == {"n_trajectories": 3, "mean": 7.0, "median": 7, "max": 10, "tokens": None}
    assert set(summary.error_histogram) == set(REFERENCE_ERRORS.known)
    assert summary.error_histogram["DaytonaError"] == 1 and summary.error_histogram["CancelledError"] == 0
    text = path.read_text()
    assert "mean score: 0.3333" in text and "with a reward: 3 / 5 total" in text
    assert "trials: graded 2  model failures 1  infra 1  invalid 0" in text
    rows = [line.split() for line in text.splitlines() if line.startswith("  ")]
    assert {row[1]: (row[0], int(row[2])) for row in rows} == {
        name: ({"DaytonaError": "infra", "AgentTimeoutError": "benign"}.get(name, _kind(name)),
               int(name in {"DaytonaError", "AgentTimeoutError"}))
        for name in REFERENCE_ERRORS.known}
    assert "steps per trial (n=3): mean 7.00  median 7  max 10" in text
    assert "tokens per trial: not reported by the trajectories" in text


def test_a_class_counted_both_ways_has_a_row_of_each_kind_and_the_infra_breakdown_adds_up(tmp_path: Path) -> None:
    """A graded AgentTimeoutError is the model's failure, an ungraded one infra; a BadRequestError no traceback ties
    to litellm is infra: each infra trial is in the row's infra breakdown and on an infra line of the report."""
    run = tmp_path / "r"
    write_job_result(run, n_total=4)
    write_trial(run, "a__aaaaaaa", reward=1.0, output_tokens=300)
    write_trial(run, "b__bbbbbbb", reward=0.0, exception="AgentTimeoutError", output_tokens=300)
    write_trial(run, "c__ccccccc", exception="AgentTimeoutError", output_tokens=300)
    write_trial(run, "d__ddddddd", exception="BadRequestError", output_tokens=300)
    (facts,) = HarborRunDirs(str(tmp_path), REFERENCE_ERRORS).observe()
    metrics = metrics_of(facts, REFERENCE_ERRORS, max_infra_fraction=0.5)

    path, _ = write_post_eval_report(run, facts, REFERENCE_ERRORS, metrics)

    breakdown = metrics.stats.infra_error_breakdown
    assert facts.n_infra_errors == sum(breakdown.values()) == 2
    assert (breakdown["AgentTimeoutError"], breakdown["BadRequestError"]) == (1, 1)
    assert metrics.stats.n_errors_by_class["AgentTimeoutError"] == 2  # the MLflow errors.* metric: every kind
    rows = {(row[0], row[1]): int(row[2]) for line in path.read_text().splitlines() if line.startswith("  ")
            for row in [line.split()] if row[1] in {"AgentTimeoutError", "BadRequestError"}}
    assert rows == {("benign", "AgentTimeoutError"): 1, ("infra", "AgentTimeoutError"): 1,
                    ("benign", "BadRequestError"): 0, ("infra", "BadRequestError"): 1}


def _atif(path: Path, steps: list[dict[str, object]], final: dict[str, object] | None = None) -> None:
    doc: dict[str, object] = {"schema_version": "ATIF-v1.4", "steps": steps}
    if final is not None:
        doc["final_metrics"] = final
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))


def test_tokens_come_from_final_metrics_else_from_the_steps(tmp_path: Path) -> None:
    run = tmp_path / "r"
    write_job_result(run, n_total=4)
    for name in ("a__aaaaaaa", "b__bbbbbbb", "c__ccccccc", "d__ddddddd"):
        write_trial(run, name, reward=1.0)
    agent = "agent/trajectory.json"
    # final_metrics wins over the steps' own metrics (which here disagree with it)
    _atif(run / "a__aaaaaaa" / agent, [{"step_id": 1, "metrics": {"prompt_tokens": 1, "completion_tokens": 1}}] * 2,
          {"total_prompt_tokens": 1000, "total_completion_tokens": 200, "total_steps": 2})
    # no final_metrics: the steps' metrics are summed; a step without metrics (the user's) adds nothing
    _atif(run / "b__bbbbbbb" / agent, [{"step_id": 1, "source": "user"},
                                       {"step_id": 2, "metrics": {"prompt_tokens": 300, "completion_tokens": 50}},
                                       {"step_id": 3, "metrics": {"prompt_tokens": 500, "completion_tokens": 50}}])
    # no token counts anywhere (and junk that must not count): steps only
    _atif(run / "c__ccccccc" / agent, [{"step_id": 1, "metrics": {"prompt_tokens": True, "completion_tokens": -5}}],
          {"total_prompt_tokens": None})
    (facts,) = HarborRunDirs(str(tmp_path), REFERENCE_ERRORS).observe()

    _, summary = write_post_eval_report(run, facts, REFERENCE_ERRORS, metrics_of(facts, REFERENCE_ERRORS))

    assert summary.steps is not None and (summary.steps.n_trajectories, summary.steps.max) == (3, 3)
    tokens = summary.steps.tokens
    assert tokens is not None
    assert tokens.model_dump() == {"n_trajectories": 2, "prompt_mean": 900.0, "completion_mean": 150.0,
                                   "total_mean": 1050.0, "total_median": 1050.0, "total_max": 1200}
    assert "tokens per trial (n=2): mean 1050.0 (prompt 900.0, completion 150.0)  median 1050  max 1200" in (
        run / REPORT_NAME).read_text()
    analysis = post_eval_analysis(summary, facts, REFERENCE_ERRORS)
    assert {k: v for k, v in analysis.step_stats.items() if k.startswith("tokens_")} == {
        "tokens_n_trajectories": 2.0, "tokens_prompt_mean": 900.0, "tokens_completion_mean": 150.0,
        "tokens_mean": 1050.0, "tokens_median": 1050.0, "tokens_max": 1200.0}


def test_an_empty_dir_is_refused_by_the_gate_so_it_gets_no_report(tmp_path: Path) -> None:
    """A report is written for admitted runs only: a dir with nothing in it never reaches one."""
    write_meta_env(tmp_path / "r", MODEL="m")
    (facts,) = HarborRunDirs(str(tmp_path), REFERENCE_ERRORS).observe()
    verdict = gate(facts)
    assert isinstance(verdict, Refused) and (verdict.refusal, verdict.remedy) == (Refusal.NO_TOTAL, "hold")
    write_job_result(tmp_path / "r", n_total=0)  # Harbor says there was nothing to run
    (facts,) = HarborRunDirs(str(tmp_path), REFERENCE_ERRORS).observe()
    verdict = gate(facts)
    assert isinstance(verdict, Refused) and (verdict.refusal, verdict.remedy) == (Refusal.NOTHING_SCORED, "hold")
    assert verdict.evidence.scored == 0


def test_repeated_reports_replace_the_file_and_leave_no_temp_files(tmp_path: Path) -> None:
    run = tmp_path / "r"
    write_job_result(run, n_total=2)
    write_trial(run, "a__aaaaaaa", reward=1.0, steps=4)
    before = sorted(p.name for p in run.iterdir())
    for n_total in (2, 3, 3, 4):
        write_job_result(run, n_total=n_total)
        (facts,) = HarborRunDirs(str(tmp_path), REFERENCE_ERRORS).observe()
        # 1 of n_total trials: reported as a partial upload, whatever the share
        metrics = metrics_of(facts, REFERENCE_ERRORS, partial_upload=True, min_completed_fraction=0.25)
        path, _ = write_post_eval_report(run, facts, REFERENCE_ERRORS, metrics)
        assert f"with a reward: 1 / {n_total} total" in path.read_text()
        assert sorted(p.name for p in run.iterdir()) == sorted([*before, REPORT_NAME])
    assert not path.is_symlink() and os.stat(path).st_nlink == 1


def admissible_run(run: Path) -> list[str]:
    """A run dir the gate admits (one task, graded); returns its entries."""
    write_meta_env(run, MODEL="m")
    write_job_result(run, n_total=1)
    write_trial(run, "a__aaaaaaa", reward=1.0)
    return sorted(p.name for p in run.iterdir())


def test_a_failed_rename_leaves_the_old_report_and_no_temp_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    entries = admissible_run(tmp_path / "r")
    (facts,) = HarborRunDirs(str(tmp_path), REFERENCE_ERRORS).observe()
    path, _ = write_post_eval_report(tmp_path / "r", facts, REFERENCE_ERRORS, metrics_of(facts, REFERENCE_ERRORS))
    old = path.read_text()
    assert "mean score: 1.0000 over 1 valid trials" in old

    def no_rename(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("controller.adapters.rundirs.post_eval.os.rename", no_rename)
    with pytest.raises(OSError, match="post-eval report not written: No space left on device") as failed:
        write_post_eval_report(tmp_path / "r", facts, REFERENCE_ERRORS, metrics_of(facts, REFERENCE_ERRORS))
    assert failed.value.filename == str(path)
    assert path.read_text() == old and sorted(p.name for p in (tmp_path / "r").iterdir()) == sorted(
        [*entries, REPORT_NAME])


def test_a_missing_run_dir_is_an_error_naming_it(tmp_path: Path) -> None:
    admissible_run(tmp_path / "r")
    (facts,) = HarborRunDirs(str(tmp_path), REFERENCE_ERRORS).observe()
    with pytest.raises(FileNotFoundError, match="post-eval report not written: No such file or directory"):
        write_post_eval_report(tmp_path / "gone", facts, REFERENCE_ERRORS, metrics_of(facts, REFERENCE_ERRORS))
    assert not (tmp_path / "gone").exists()


def _kind(name: str) -> str:
    return "infra" if name in REFERENCE_ERRORS.infra else "benign"
