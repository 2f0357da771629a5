"""A pass costs what is active: a finished run dir is read once per process, a running one only for its new or
changed trials. Counted at the one place files are read (`localfs.read_file`), on real files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from controller.adapters.rundirs import localfs
from controller.adapters.rundirs.harbor import HarborRunDirs
from controller.core.observed import ErrorKind, QuietFailure, RunDirFacts
from tests.fixtures.harbor_dirs import REFERENCE_ERRORS, write_job_result, write_synthetic_run_dir, write_trial


def a_pass(jobs: Path) -> dict[str, RunDirFacts]:
    """Like a reconcile pass: the adapter is built anew, only the process is the same."""
    return {f.run_tag: f for f in HarborRunDirs(str(jobs), REFERENCE_ERRORS).observe()}


def trial_reads(reads: list[str]) -> list[str]:
    """The trial results read (not the first trial's config.json, read once per scanned run dir for api_base)."""
    return [p for p in reads if os.path.basename(os.path.dirname(p)).count("__") and p.endswith("/result.json")]


def trial_config_reads(reads: list[str]) -> list[str]:
    return [p for p in reads if os.path.basename(os.path.dirname(p)).count("__") and p.endswith("/config.json")]


def test_a_finished_run_dir_is_read_once_then_only_stat_ed(tmp_path: Path, reads: list[str]) -> None:
    write_synthetic_run_dir(tmp_path / "jobs" / "ev_done", 20)

    first = a_pass(tmp_path / "jobs")
    reads.clear()
    again = a_pass(tmp_path / "jobs")

    assert reads == [], "nothing of a finished, unchanged run dir is read again"
    assert again == first and first["ev_done"].n_completed == 20


def test_a_running_dir_reads_only_its_new_trials(tmp_path: Path, reads: list[str]) -> None:
    run = tmp_path / "jobs" / "ev_running"
    write_synthetic_run_dir(run, 10, n_total=20, finished=False)
    write_trial(run, "late__xxxxxxx", result=False)  # no result yet: running
    write_trial(run, "instant__zzzzzzz", exception="APIConnectionError", output_tokens=None, agent_seconds=0.5)

    first = a_pass(tmp_path / "jobs")
    reads.clear()
    write_trial(run, "late__xxxxxxx", reward=1.0)  # it finishes
    write_trial(run, "new__yyyyyyy", reward=0.0)  # and another one lands
    again = a_pass(tmp_path / "jobs")

    assert sorted(os.path.basename(os.path.dirname(p)) for p in trial_reads(reads)) == ["late__xxxxxxx",
                                                                                      "new__yyyyyyy"]
    assert trial_config_reads(reads) == [str(run / "instant__zzzzzzz" / "config.json")], "one per scan: the first trial's"
    assert (first["ev_running"].n_completed, again["ev_running"].n_completed) == (11, 13)
    assert again["ev_running"].quiet_failures == first["ev_running"].quiet_failures == (
        QuietFailure(exception_type="APIConnectionError", kind=ErrorKind.INFRA, agent_seconds=0.5,
                     task="instant"),), \
        "a remembered trial outcome keeps its tokens and agent time"
    assert again == a_pass(tmp_path / "jobs"), "the remembered trials give the same facts as reading them"


def test_a_resume_of_a_finished_dir_is_seen(tmp_path: Path, reads: list[str]) -> None:
    run = tmp_path / "jobs" / "ev_resumed"
    write_synthetic_run_dir(run, 10, n_total=20)
    assert a_pass(tmp_path / "jobs")["ev_resumed"].finished_at is not None

    write_job_result(run, 20, finished=False, n_completed=10)  # `harbor jobs resume` rewrites the job result
    again = a_pass(tmp_path / "jobs")["ev_resumed"]

    assert again.finished_at is None and again.n_completed == 10


def test_a_changed_trial_result_of_a_running_dir_is_read_again(tmp_path: Path, reads: list[str]) -> None:
    run = tmp_path / "jobs" / "ev_running"
    write_synthetic_run_dir(run, 4, n_total=10, finished=False)
    trial = write_trial(run, "flaky__zzzzzzz", reward=0.0)
    assert a_pass(tmp_path / "jobs")["ev_running"].n_scored == 5

    write_trial(run, "flaky__zzzzzzz", exception="DaytonaError")  # rewritten: now an infra error, no reward
    stat = os.stat(trial / "result.json")
    os.utime(trial / "result.json", ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    reads.clear()
    again = a_pass(tmp_path / "jobs")["ev_running"]

    assert [os.path.basename(os.path.dirname(p)) for p in trial_reads(reads)] == ["flaky__zzzzzzz"]
    assert again.n_scored == 4 and again.n_infra_errors == 1


def test_a_trial_result_costs_one_stat_when_unchanged_and_none_before_its_first_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An unchanged result is stat-ed and recalled (no open); a result of a dir the memo keeps nothing of is opened
    straight away (the fstat of the open is its StatKey), not stat-ed first."""
    run = tmp_path / "jobs" / "ev_running"
    write_synthetic_run_dir(run, 6, n_total=20, finished=False)
    stats: list[str] = []
    real = localfs.stat_key
    monkeypatch.setattr(localfs, "stat_key", lambda path: stats.append(path) or real(path))

    a_pass(tmp_path / "jobs")
    trial_stats = [p for p in stats if "__" in os.path.basename(os.path.dirname(p))]
    assert trial_stats == [], "a cold read stats nothing before opening"

    stats.clear()
    a_pass(tmp_path / "jobs")
    trial_stats = [p for p in stats if "__" in os.path.basename(os.path.dirname(p))]
    assert len(trial_stats) == len(set(trial_stats)) == 6, "one stat per unchanged trial result"
