"""The local scheduler reads its real, detached jobs' output as it grows, and says where and why a job failed.

Each job prints what the test hands it, one step at a time: it waits for `go<i>`, copies `chunk<i>` to its output,
then touches `done<i>`; the test waits for that file (observable state), never for time.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from controller.adapters.scheduler.local import LocalJob, LocalScheduler
from controller.adapters.secrets import SecretMask
from controller.core.observed import JobOutput, JobState
from controller.core.ports import OUTPUT_READ_CAP, OutputCursor, SubmitRequest
from tests.fixtures.evalctl import cancel_live_jobs, wait_until

SECRET = "tok-9c1f00d2e7"
STEPPER = """#!/bin/bash
d="$1"
i=1
while :; do
  while [ ! -e "$d/go$i" ]; do [ -e "$d/stop" ] && exit "${EXIT:-0}"; sleep 0.02; done
  cat "$d/chunk$i"
  touch "$d/done$i"
  i=$((i + 1))
done
"""


class Stepper:
    """One running local job that prints exactly the chunks it is given."""

    def __init__(self, scheduler: LocalScheduler, root: Path, name: str, exit_code: int = 0):
        self.scheduler, self.dir, self.step = scheduler, root / name, 0
        self.dir.mkdir()
        script = root / "stepper.sh"
        script.write_text(STEPPER)
        script.chmod(0o755)
        self.job_id = scheduler.submit(SubmitRequest(
            name=name, comment="k", script=str(script), args=(str(self.dir),), env={"EXIT": str(exit_code)},
            logs_dir=str(root / "logs"), time_limit="5"))
        self.output = root / "logs" / f"{name}_{self.job_id}.out"
        self.name = name

    def prints(self, data: bytes) -> None:
        self.step += 1
        (self.dir / f"chunk{self.step}").write_bytes(data)
        (self.dir / f"go{self.step}").touch()
        wait_until(lambda: (self.dir / f"done{self.step}").exists(), f"job {self.job_id} to print step {self.step}")

    def stop(self) -> None:
        (self.dir / "stop").touch()
        wait_until(lambda: not self.state().active, f"job {self.job_id} to end")

    def state(self) -> JobState:
        job = self.scheduler.find(self.name)
        assert job is not None
        return job.state

    def read(self, offset: int) -> JobOutput:
        [out] = self.scheduler.read_output([OutputCursor(job_id=self.job_id, name=self.name, offset=offset)])
        return out


@pytest.fixture
def scheduler(tmp_path: Path) -> Iterator[LocalScheduler]:
    local = LocalScheduler(tmp_path / "state", mask=SecretMask([SECRET]))
    yield local
    cancel_live_jobs(local)


def test_a_growing_output_is_read_on_across_passes_without_losing_or_repeating_a_byte(
        scheduler: LocalScheduler, tmp_path: Path) -> None:
    job = Stepper(scheduler, tmp_path, "ev_grow")
    line = f"INFO: 127.0.0.1 - \"POST /v1/chat/completions HTTP/1.1\" 200 OK key={SECRET} \xe9\n".encode()
    backlog = line * (OUTPUT_READ_CAP // len(line) + 40)
    job.prints(backlog)
    wait_until(lambda: job.state() == JobState.RUNNING, "the job to run")
    first = job.read(0)
    assert first.offset == 0 and OUTPUT_READ_CAP - len(line) < first.end <= OUTPUT_READ_CAP, "a cap's worth first"
    rest = job.read(first.end)
    assert (rest.offset, rest.end) == (first.end, len(backlog)), "then the rest"
    assert job.read(rest.end) == JobOutput(job_id=job.job_id, offset=len(backlog), end=len(backlog), text="")

    job.prints(b"binary \xff\x00 bytes\nhalf a li")  # a line still being written waits for its end
    third = job.read(rest.end)
    job.prints(b"ne, now whole\n")
    fourth = job.read(third.end)
    assert (third.offset, fourth.offset) == (rest.end, third.end) and fourth.end == job.output.stat().st_size
    assert third.text == "binary \ufffd\x00 bytes\n" and fourth.text == "half a line, now whole\n"
    texts = "".join(out.text for out in (first, rest, third, fourth))
    assert texts == SecretMask([SECRET])(job.output.read_bytes().decode("utf-8", errors="replace"))
    assert SECRET not in texts and texts.count("key=***") == backlog.count(b"\n")

    observed = next(j for j in scheduler.observe() if j.job_id == job.job_id)
    assert observed.state == JobState.RUNNING and observed.nodes == socket.gethostname()
    job.stop()


def test_an_output_truncated_under_a_running_job_is_read_again_from_the_start(
        scheduler: LocalScheduler, tmp_path: Path) -> None:
    job = Stepper(scheduler, tmp_path, "ev_rotate")
    job.prints(b"a long first life of the log\n" * 100)
    before = job.read(0)
    os.truncate(job.output, 0)  # logrotate copytruncate; the job appends (O_APPEND) from the new end
    job.prints(b"second life\n")
    after = job.read(before.end)
    assert (after.offset, after.end, after.text) == (0, 12, "second life\n")
    job.stop()


def test_jobs_without_an_output_file_and_fifos_are_left_out_and_never_block(
        scheduler: LocalScheduler, tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.out"
    os.mkfifo(fifo)  # nobody writes to it: a blocking open or read would wait for ever
    job_dir = scheduler.jobs_dir / "41"
    job_dir.mkdir(parents=True)
    (job_dir / "job.json").write_text(LocalJob(
        job_id="41", name="ev_fifo", comment="k", script="/bin/true", args=(), output=str(fifo), time_limit_s=60,
        submitted_at=datetime.now(UTC)).model_dump_json())
    asked = [OutputCursor(job_id=job_id, name="ev_x") for job_id in ("41", "42", "../41", "")]
    result: list[tuple[JobOutput, ...]] = []
    reader = threading.Thread(target=lambda: result.append(scheduler.read_output(asked)), daemon=True)
    reader.start()
    reader.join(timeout=60)
    assert not reader.is_alive(), "the read blocked on the FIFO"
    assert result == [()]


def test_a_failed_job_says_why_in_its_last_lines_masked_and_where_it_ran(
        scheduler: LocalScheduler, tmp_path: Path) -> None:
    job = Stepper(scheduler, tmp_path, "ev_fails", exit_code=3)
    job.prints("".join(f"step {i}\n" for i in range(200)).encode() + f"CUDA error on token {SECRET}\n".encode())
    job.stop()
    [failed] = [j for j in scheduler.observe() if j.job_id == job.job_id]
    assert failed.state == JobState.FAILED and failed.nodes == socket.gethostname()
    assert failed.log_tail.splitlines() == [*(f"step {i}" for i in range(137, 200)), "CUDA error on token ***"]
    assert failed.reason == "step 196 | step 197 | step 198 | step 199 | CUDA error on token ***"
