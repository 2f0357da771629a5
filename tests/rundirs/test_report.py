"""post_eval_report.txt: histogram with every known class, step stats, tolerant of bad trajectories."""

from __future__ import annotations

from pathlib import Path

from controller.adapters.rundirs.harbor import HarborRunDirs
from controller.adapters.rundirs.report import REPORT_NAME, write_post_eval_report
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

    path, summary = write_post_eval_report(run, facts, REFERENCE_ERRORS)

    assert path == run / REPORT_NAME and path.is_file()
    assert summary.mean_score == 1 / 3 and (summary.n_scored, summary.n_total, summary.n_valid) == (3, 5, 3)
    assert summary.steps is not None
    assert summary.steps.model_dump() == {"n_trajectories": 3, "mean": 7.0, "median": 7, "max": 10}
    assert set(summary.error_histogram) == set(REFERENCE_ERRORS.known)
    assert summary.error_histogram["DaytonaError"] == 1 and summary.error_histogram["CancelledError"] == 0
    text = path.read_text()
    assert "mean score: 0.3333" in text and "scored: 3 / 5 total" in text
    rows = [line.split() for line in text.splitlines() if line.startswith("  ")]
    assert {row[1]: (row[0], int(row[2])) for row in rows} == {
        name: ({"DaytonaError": "infra", "AgentTimeoutError": "benign"}.get(name, _kind(name)),
               int(name in {"DaytonaError", "AgentTimeoutError"}))
        for name in REFERENCE_ERRORS.known}
    assert "steps per trial (n=3): mean 7.00  median 7  max 10" in text


def test_report_on_an_empty_dir_says_none(tmp_path: Path) -> None:
    write_meta_env(tmp_path / "r", MODEL="m")
    (facts,) = HarborRunDirs(str(tmp_path), REFERENCE_ERRORS).observe()
    path, summary = write_post_eval_report(tmp_path / "r", facts, REFERENCE_ERRORS)
    assert summary.mean_score is None and summary.steps is None
    assert "mean score: none" in path.read_text()
    write_post_eval_report(tmp_path / "r", facts, REFERENCE_ERRORS)  # repeatable
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == ["meta.env", REPORT_NAME]


def _kind(name: str) -> str:
    return "infra" if name in REFERENCE_ERRORS.infra else "benign"
