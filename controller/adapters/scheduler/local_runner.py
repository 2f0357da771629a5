"""The process that owns one local job: runs the job script, enforces the time limit, records the end.

Started by `LocalScheduler.submit` as a session leader, so it and the script share one process
group that `cancel` can signal as a whole, and neither dies with the `evalctl` that started it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

from controller.adapters.process import proc_start_ticks
from controller.adapters.scheduler.local import JobEnd, LocalJob, _write_atomic
from controller.core.observed import JobState

KILL_WAIT_S = 5  # like SLURM's KillWait: SIGTERM, then SIGKILL after this long


def main(job_dir: Path) -> int:
    job = LocalJob.model_validate_json((job_dir / "job.json").read_text())
    started = datetime.now(UTC)
    cancelled = False

    def on_term(signum: int, frame: object) -> None:
        nonlocal cancelled
        cancelled = True

    signal.signal(signal.SIGTERM, on_term)  # before the pid is visible: `cancel` may signal as soon as it is
    _write_atomic(job_dir / "pid", f"{os.getpid()} {proc_start_ticks(os.getpid())} {started.isoformat()}")
    # `cancel` writes its marker, then looks for the pid: either it saw ours (and signals), or we see its marker.
    if cancelled or (job_dir / "cancelled").exists():
        end = JobEnd(state=JobState.CANCELLED, exit_code=None, started_at=started, ended_at=datetime.now(UTC))
        _write_atomic(job_dir / "end.json", end.model_dump_json())
        return 0
    script = job.script if os.access(job.script, os.X_OK) else None
    argv = [script, *job.args] if script else ["bash", job.script, *job.args]
    child = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
    state, code = JobState.COMPLETED, None
    try:
        code = child.wait(timeout=job.time_limit_s)
    except subprocess.TimeoutExpired:
        state = JobState.TIMEOUT
        _stop(child)
        code = child.returncode
    if cancelled and state != JobState.TIMEOUT:
        _stop(child)
        state, code = JobState.CANCELLED, child.returncode
    elif state == JobState.COMPLETED and code != 0:
        state = JobState.FAILED
    end = JobEnd(state=state, exit_code=code, started_at=started, ended_at=datetime.now(UTC))
    _write_atomic(job_dir / "end.json", end.model_dump_json())
    return 0


def _stop(child: subprocess.Popen[bytes]) -> None:
    """SIGTERM the job's process group (our own handler ignores it), then SIGKILL after KillWait."""
    if child.poll() is None:
        os.killpg(os.getpgid(0), signal.SIGTERM)
        try:
            child.wait(timeout=KILL_WAIT_S)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
