"""A local job cancelled before its runner started must never run (it used to run on, for ever, unseen)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from controller.adapters.scheduler import local_runner
from controller.adapters.scheduler.local import JobEnd, LocalJob
from controller.core.observed import JobState


def test_a_cancel_marker_written_before_the_runner_starts_ends_the_job_without_running_it(tmp_path: Path) -> None:
    ran = tmp_path / "ran"
    script = tmp_path / "job.sh"
    script.write_text(f"#!/bin/sh\ntouch {ran}\n")
    script.chmod(0o755)
    job_dir = tmp_path / "jobs" / "1"
    job_dir.mkdir(parents=True)
    job = LocalJob(job_id="1", name="ev_x", comment="k", script=str(script), args=(), output=str(tmp_path / "out"),
                   time_limit_s=60, submitted_at=datetime.now(UTC))
    (job_dir / "job.json").write_text(job.model_dump_json())
    (job_dir / "cancelled").touch()  # `cancel` came first and found no pid to signal

    assert local_runner.main(job_dir) == 0
    assert JobEnd.model_validate_json((job_dir / "end.json").read_text()).state == JobState.CANCELLED
    assert not ran.exists(), "the script must not start"
