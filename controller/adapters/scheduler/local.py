"""The embedded default scheduler: each job is a detached process on this host.

It mirrors what the SLURM backend offers so the core cannot tell them apart: deterministic names,
a queue (live jobs) and accounting (every job's end state, kept on disk), cancel, time limits and
time left. Jobs outlive the `evalctl` process that started them: the runner is a session leader
(`start_new_session`), and everything the next pass needs lives in the state dir, never in memory.

State dir layout: `jobs/<id>/job.json` (request, written before the process starts),
`jobs/<id>/pid` (runner pid and its /proc start time, against pid reuse), `jobs/<id>/end.json`
(written by the runner when the job ends), `jobs/<id>/cancelled` (marker written before a cancel).
"""

from __future__ import annotations

import fcntl
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from controller.adapters.process import proc_start_ticks
from controller.adapters.rundirs.localfs import Unreadable, read_local
from controller.adapters.scheduler.commands import inherited_environment
from controller.adapters.scheduler.output import failure_tail, job_output, read_from, read_tail
from controller.adapters.secrets import SecretMask
from controller.core.gpu_hours import job_gpu_hours
from controller.core.observed import JobOutput, JobState, ObservedJob
from controller.core.ports import OUTPUT_READ_CAP, ObservationError, OutputCursor, SubmitRequest
from controller.core.types import RUN_TAG_PREFIX, Frozen, walltime_seconds


class LocalJob(Frozen):
    """job.json: what was asked for. The environment is NOT stored: it may hold secrets."""

    job_id: str
    name: str
    comment: str
    script: str
    args: tuple[str, ...]
    output: str
    time_limit_s: int
    submitted_at: datetime


class JobEnd(Frozen):
    """end.json, written by the runner."""

    state: JobState
    exit_code: int | None
    started_at: datetime
    ended_at: datetime


class LocalScheduler:
    def __init__(self, state_dir: str | Path, mask: SecretMask | None = None, gpus_per_job: int = 0):
        """`gpus_per_job`: the cluster's gpusPerJob, what a job's wall time costs in GPU-hours."""
        self.state_dir = Path(state_dir)
        self.gpus_per_job = gpus_per_job
        self.jobs_dir = self.state_dir / "jobs"
        self.mask = mask or SecretMask()
        self.host = socket.gethostname()  # where every local job runs: its `nodes`

    # ------------------------------------------------------------------ observe

    def observe(self) -> tuple[ObservedJob, ...]:
        """Every job of ours, live or ended (queue and accounting are the same files here). A corrupt state file's
        error quotes it, and the job can write there: masked."""
        try:
            listed = self.jobs_dir.iterdir() if self.jobs_dir.exists() else iter(())
            entries = sorted((p for p in listed if p.name.isdigit()), key=lambda p: int(p.name))  # ours only
            return tuple(job for job in map(self._read, entries) if job is not None)
        except OSError as exc:
            raise ObservationError(f"local scheduler state {self.jobs_dir} unreadable: {self.mask.known(str(exc))}") \
                from None

    def find(self, name: str) -> ObservedJob | None:
        matches = [job for job in self.observe() if job.name == name]
        return matches[-1] if matches else None

    def _read(self, job_dir: Path) -> ObservedJob | None:
        job = _job(job_dir)
        if job is None or not job.name.startswith(RUN_TAG_PREFIX):
            return None  # None: a submit in progress (job.json is written atomically: a dir made just now)
        end_text = _state_text(job_dir / "end.json")
        if end_text is not None:
            end = _parsed(JobEnd, end_text, job_dir / "end.json")
            return self._observed(job, end.state, end.started_at, end.ended_at, end.exit_code)
        started = _runner_start(job_dir)
        if started is not None and _alive(job_dir):
            left = job.time_limit_s - int((datetime.now(UTC) - started).total_seconds())
            return self._observed(job, JobState.RUNNING, started, None, None, time_left_s=max(left, 0))
        if started is None and not (job_dir / "cancelled").exists() and _spawned_recently(job):
            return self._observed(job, JobState.QUEUED, None, None, None)
        # The runner is gone without writing end.json: killed hard, or the host rebooted.
        state = JobState.CANCELLED if (job_dir / "cancelled").exists() else JobState.LOST
        return self._observed(job, state, started, _mtime(job_dir), None)

    def _observed(self, job: LocalJob, state: JobState, started: datetime | None, ended: datetime | None,
                  exit_code: int | None, time_left_s: int | None = None) -> ObservedJob:
        reason, tail = self._failure_tail(job) if state in (JobState.FAILED, JobState.OUT_OF_MEMORY) else ("", "")
        return ObservedJob(job_id=job.job_id, name=job.name, state=state, submitted_at=job.submitted_at,
                           started_at=started, ended_at=ended, exit_code=exit_code, time_left_s=time_left_s,
                           reason=reason, log_tail=tail, nodes=self.host if started is not None else "",
                           gpu_hours=job_gpu_hours(started, ended, datetime.now(UTC), self.gpus_per_job))

    def _failure_tail(self, job: LocalJob) -> tuple[str, str]:
        """A failed job says why in its output: the last lines, masked (a courtesy: unreadable means none)."""
        try:
            read = read_tail(job.output)
        except OSError:
            return "", ""
        if read is None:
            return "", ""
        raw, whole = read
        return failure_tail(raw.decode("utf-8", errors="replace"), self.mask, whole=whole)

    def read_output(self, cursors: Sequence[OutputCursor]) -> tuple[JobOutput, ...]:
        """Each job's output file (job.json names it) read on from its cursor, whole lines, at most the cap."""
        outputs = []
        for cursor in cursors:
            try:
                path = self._output_path(cursor.job_id)
                read = read_from(path, cursor.offset, OUTPUT_READ_CAP) if path is not None else None
            except OSError as exc:
                raise ObservationError(f"output of local job {cursor.job_id} unreadable: {exc}") from exc
            if read is not None:
                outputs.append(job_output(cursor.job_id, *read, OUTPUT_READ_CAP, self.mask))
        return tuple(outputs)

    def _output_path(self, job_id: str) -> str | None:
        """The output file of one of our jobs; None for an id that is not one (no job.json: not there)."""
        if not job_id.isdigit():
            return None  # never a path outside the jobs dir
        job = _job(self.jobs_dir / job_id)
        return job.output if job is not None else None

    # ------------------------------------------------------------------ mutate

    def usable_nodes(self) -> None:
        """Not applicable: every job runs on this host."""
        return None

    def submit(self, request: SubmitRequest) -> str:
        """Start the runner. `request.exclude_nodes` is ignored: every local job runs on this one host."""
        job_id = self._next_id()
        job_dir = self.jobs_dir / job_id
        job_dir.mkdir(parents=True)
        Path(request.logs_dir).mkdir(parents=True, exist_ok=True)
        job = LocalJob(job_id=job_id, name=request.name, comment=request.comment, script=request.script,
                       args=request.args, output=str(Path(request.logs_dir) / f"{request.name}_{job_id}.out"),
                       time_limit_s=walltime_seconds(request.time_limit), submitted_at=datetime.now(UTC))
        _write_atomic(job_dir / "job.json", job.model_dump_json())
        env = {**inherited_environment(), **request.env, "EVAL_JOB_ID": job_id, "SLURM_JOB_ID": job_id,
               "SLURM_JOB_NAME": request.name}
        with open(job.output, "ab") as out:
            # `setsid --fork` starts the runner in a session of its own and exits at once: the runner is not our
            # child, so a long-lived process (the operator) never keeps its zombie after it ends
            subprocess.run(
                ["setsid", "--fork", sys.executable, "-m", "controller.adapters.scheduler.local_runner", str(job_dir)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env, close_fds=True, check=True,
                timeout=60,
            )
        return job_id

    def cancel(self, job_id: str) -> None:
        job_dir = self.jobs_dir / job_id
        if not job_dir.exists() or (job_dir / "end.json").exists():
            return
        (job_dir / "cancelled").touch()
        pid = _runner_pid(job_dir)
        if pid is not None and _alive(job_dir):
            try:
                os.killpg(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    def _next_id(self) -> str:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        with open(self.state_dir / "next_id", "a+") as counter:
            fcntl.flock(counter, fcntl.LOCK_EX)
            counter.seek(0)
            current = int(counter.read().strip() or "0") + 1
            counter.seek(0)
            counter.truncate()
            counter.write(str(current))
        return str(current)


# ---------------------------------------------------------------------- helpers shared with the runner


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


STATE_FILE_CAP = 1 << 20  # job.json holds a command line and its environment
_M = TypeVar("_M", bound=BaseModel)


def _state_text(path: Path) -> str | None:
    """A state file, read as run dirs are: a regular file only, opened without blocking, capped; None when missing.

    The job's own process can write here: a FIFO or device in a state file's place is an OSError (the queue is
    Unknown), never a read that waits for ever."""
    content, _ = read_local(str(path), STATE_FILE_CAP)
    if isinstance(content, Unreadable):
        raise OSError(f"{path}: {content.reason}")
    return content.decode(errors="replace") if content is not None else None


def _parsed(model: type[_M], text: str, path: Path) -> _M:
    try:
        return model.model_validate_json(text)
    except ValidationError as exc:
        raise OSError(f"{path} is corrupt: {exc}") from exc


def _job(job_dir: Path) -> LocalJob | None:
    text = _state_text(job_dir / "job.json")
    return _parsed(LocalJob, text, job_dir / "job.json") if text is not None else None


def _pid_fields(job_dir: Path) -> list[str]:
    """`pid start-ticks started-at` as the runner wrote them; [] before it did."""
    return (_state_text(job_dir / "pid") or "").split()


def _runner_pid(job_dir: Path) -> int | None:
    try:
        return int(_pid_fields(job_dir)[0])
    except (ValueError, IndexError):
        return None


def _runner_start(job_dir: Path) -> datetime | None:
    try:
        return datetime.fromisoformat(_pid_fields(job_dir)[2])
    except (ValueError, IndexError):
        return None


def _alive(job_dir: Path) -> bool:
    """The runner still runs: its pid exists AND has the /proc start time it recorded (no pid reuse)."""
    try:
        pid_text, start_ticks, _ = _pid_fields(job_dir)
        return proc_start_ticks(int(pid_text)) == start_ticks
    except ValueError:
        return False


def _spawned_recently(job: LocalJob) -> bool:
    """A runner that has not written its pid file within a minute never started."""
    return (datetime.now(UTC) - job.submitted_at).total_seconds() < 60


def _mtime(path: Path) -> datetime:
    return datetime.fromtimestamp(path.stat().st_mtime, UTC)
