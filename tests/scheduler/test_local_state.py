"""The local scheduler's state files are written next to what a job can write: read fail-closed (issue 18: a job
that replaced its job.json with a FIFO blocked every operator handler thread in `read_text()`)."""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest

from controller.adapters.scheduler.local import LocalJob, LocalScheduler
from controller.adapters.secrets import SecretMask
from controller.core.ports import ObservationError
from tests.fixtures.threads import in_thread


def _job_dir(state: Path, job_id: str = "1") -> Path:
    job_dir = state / "jobs" / job_id
    job_dir.mkdir(parents=True)
    return job_dir


def _job_json(job_dir: Path) -> None:
    job = LocalJob(job_id=job_dir.name, name="ev_x__a1", comment="k", script="/bin/true", args=(),
                   output=str(job_dir / "out"), time_limit_s=60, submitted_at=datetime.now(UTC))
    (job_dir / "job.json").write_text(job.model_dump_json())


def _within_deadline(call: Callable[[], object]) -> object:
    """What `call` returned or raised; a read that blocks shows as its thread still alive at the (generous) deadline."""
    worker, result = in_thread(call)
    worker.join(timeout=30)
    assert not worker.is_alive(), "the read blocked"
    return result[0]


@pytest.mark.parametrize("fifo", ["job.json", "end.json", "pid"])
def test_a_fifo_in_place_of_a_state_file_makes_the_queue_unknown_without_blocking(tmp_path: Path, fifo: str) -> None:
    job_dir = _job_dir(tmp_path)
    if fifo != "job.json":
        _job_json(job_dir)
    os.mkfifo(job_dir / fifo)  # no writer: a blocking open or read would wait for ever
    outcome = _within_deadline(LocalScheduler(tmp_path).observe)
    assert isinstance(outcome, ObservationError), outcome
    assert f"{job_dir / fifo}: not a regular file" in str(outcome)


def test_a_device_or_huge_state_file_is_refused_and_entries_not_ours_are_ignored(tmp_path: Path) -> None:
    job_dir = _job_dir(tmp_path)
    os.symlink("/dev/zero", job_dir / "job.json")
    outcome = _within_deadline(LocalScheduler(tmp_path).observe)
    assert isinstance(outcome, ObservationError) and "not a regular file" in str(outcome), outcome

    os.unlink(job_dir / "job.json")
    with open(job_dir / "job.json", "wb") as huge:
        huge.truncate(2 << 20)
    outcome = _within_deadline(LocalScheduler(tmp_path).observe)
    assert isinstance(outcome, ObservationError) and "larger than the 1 MiB cap" in str(outcome), outcome

    os.unlink(job_dir / "job.json")
    _job_json(job_dir)
    (tmp_path / "jobs" / "not-a-job").mkdir()  # a job's own junk beside the numbered dirs
    [job] = LocalScheduler(tmp_path).observe()
    assert job.name == "ev_x__a1"


def test_a_finished_local_job_leaves_no_zombie_under_the_process_that_submitted_it(tmp_path: Path) -> None:
    """The operator submits for weeks: every runner it started used to stay <defunct> under it."""
    from controller.core.ports import SubmitRequest
    from tests.fixtures.evalctl import wait_until

    scheduler = LocalScheduler(tmp_path / "state")
    request = SubmitRequest(name="ev_x__a1", comment="k", script="/bin/true", args=(), env={},
                            logs_dir=str(tmp_path / "logs"), time_limit="1")
    job_id = scheduler.submit(request)
    wait_until(lambda: (tmp_path / "state" / "jobs" / job_id / "end.json").exists(), "the job to end")
    children = Path(f"/proc/self/task/{os.getpid()}/children").read_text().split()
    zombies = [pid for pid in children if Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")]
    assert zombies == []


def test_a_state_file_a_job_wrote_a_token_into_is_unknown_and_its_error_masked(tmp_path: Path) -> None:
    """The corrupt file's error quotes it (pydantic shows the input), and that becomes the cluster's reason."""
    token = "ghp_" + "R2d2C3po" * 5
    job_dir = _job_dir(tmp_path)
    _job_json(job_dir)
    (job_dir / "end.json").write_text(f'{{"state": "{token}"}}')
    with pytest.raises(ObservationError, match=r"end\.json is corrupt") as raised:
        LocalScheduler(tmp_path, SecretMask()).observe()
    assert token not in str(raised.value) and "ghp_***" in str(raised.value)
    assert raised.value.__cause__ is None and raised.value.__suppress_context__
