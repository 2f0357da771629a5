"""The SLURM backend's output reading: ONE command for every cursor, parsed by its frames, never fooled by content.

The first half fakes the command runner (the boundary) to pin the parse and its failure modes; the second runs
the real script through LocalCommands on real files, as it runs on a login node.
"""

from __future__ import annotations

import base64
import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from controller.adapters.scheduler.commands import CommandFailed, CommandResult, CommandRunner, LocalCommands
from controller.adapters.scheduler.slurm import READ_MARKER, READ_SCRIPT, SlurmOptions, SlurmScheduler
from controller.adapters.secrets import SecretMask
from controller.core.observed import JobOutput
from controller.core.ports import OUTPUT_READ_CAP, ObservationError, OutputCursor, SubmitRequest

SECRET = "tok-5f0c9e1d2b"


class Scripted:
    """A CommandRunner that gives one answer and records what it was asked."""

    def __init__(self, answer: CommandResult | Exception):
        self.answer = answer
        self.calls: list[list[str]] = []

    def run(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, timeout: float) -> CommandResult:
        self.calls.append(list(argv))
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def printed(*lines: str, returncode: int = 0) -> Scripted:
    return Scripted(CommandResult(returncode=returncode, stdout="".join(f"{line}\n" for line in lines), stderr=""))


def frame(index: int, start: int, raw: bytes) -> str:
    return f"#{index} {start}\n" + base64.encodebytes(raw).decode()  # 76-column lines, as base64(1) prints


def cursors(*names: str, offset: int = 0) -> list[OutputCursor]:
    return [OutputCursor(job_id=str(i + 1), name=name, offset=offset) for i, name in enumerate(names)]


def slurm(runner: CommandRunner, logs: str = "/logs") -> SlurmScheduler:
    return SlurmScheduler(runner, SlurmOptions(), logs_dir=logs, user="alice", mask=SecretMask([SECRET]))


# ---------------------------------------------------------------------- the parse, at the runner boundary


def test_every_cursor_is_read_by_one_command_with_its_offset_and_output_path() -> None:
    runner = printed(READ_MARKER)
    assert slurm(runner).read_output([*cursors("ev_a", "ev_b", offset=12)]) == ()
    [argv] = runner.calls
    assert argv[:5] == ["sh", "-c", READ_SCRIPT, "read-output", str(OUTPUT_READ_CAP)]
    assert argv[5:] == ["12", "/logs/ev_a_1.out", "12", "/logs/ev_b_2.out"]


def test_no_cursor_no_command() -> None:
    runner = printed(READ_MARKER)
    assert slurm(runner).read_output([]) == () and runner.calls == []


def test_frames_give_each_job_its_bytes_and_offsets_raw_bytes_whatever_the_text() -> None:
    raw = f"line \xff one {SECRET}\n".encode("latin-1") + b"\x00#1 0\n==> x <==\npartial"
    runner = Scripted(CommandResult(returncode=0, stderr="", stdout="Welcome to the cluster!\n#0 9\n" + READ_MARKER
                                    + "\n" + frame(0, 40, raw) + "#2 0\n"))
    a, c = slurm(runner).read_output(cursors("ev_a", "ev_b", "ev_c", offset=40))
    whole = raw[:raw.rindex(b"\n") + 1]
    assert a == JobOutput(job_id="1", offset=40, end=40 + len(whole), text="line \ufffd one ***\n\x00#1 0\n==> x <==\n")
    assert c == JobOutput(job_id="3", offset=0, end=0, text=""), "an empty frame: the file is there, nothing new"


def test_a_file_that_exists_but_cannot_be_read_fails_the_read_naming_it() -> None:
    with pytest.raises(ObservationError, match=r"/logs/ev_b_2\.out is not readable"):
        slurm(printed(READ_MARKER, "#0 0", "!1")).read_output(cursors("ev_a", "ev_b"))


@pytest.mark.parametrize("stdout", [
    "",  # nothing at all: not even the script's first line
    f"{READ_MARKER}\n#2 0\n",  # a header for no cursor
    f"{READ_MARKER}\n#0 0\n#0 0\n",  # twice
    f"{READ_MARKER}\n#0 x\n",
    f"{READ_MARKER}\n#0 0\nnot*base64\n",
    f"{READ_MARKER}\nstray text\n",
])
def test_output_that_is_not_what_the_script_prints_is_unknown_never_a_guess(stdout: str) -> None:
    with pytest.raises(ObservationError, match="reading job output"):
        slurm(Scripted(CommandResult(returncode=0, stdout=stdout, stderr=""))).read_output(cursors("ev_a", "ev_b"))


@pytest.mark.parametrize("answer", [CommandFailed("ssh: did not answer within 30 s"),
                                    CommandResult(returncode=127, stdout=READ_MARKER, stderr="base64 not found")])
def test_a_failed_or_timed_out_read_is_an_observation_error(answer: CommandResult | Exception) -> None:
    with pytest.raises(ObservationError, match="reading job output"):
        slurm(Scripted(answer)).read_output(cursors("ev_a"))


class Accounting(Scripted):
    """squeue and sacct as SLURM prints them, a reason quoting a secret and a token; `sbatch` refusing with one."""

    TOKEN = "hf_" + "Zq8" * 12

    def run(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, timeout: float) -> CommandResult:
        self.calls.append(list(argv))
        lines = {"squeue": f"7|ev_a|PENDING|2026-11-29T14:00:00|N/A|N/A|1:00:00|1:00:00||held: {SECRET} {self.TOKEN}",
                 "sacct": f"6|ev_b|FAILED|1:0|2026-11-29T13:00:00|2026-11-29T13:00:01|2026-11-29T13:00:02|vm|1||"
                          f"admin note {self.TOKEN}"}
        if argv[0] in lines:
            return CommandResult(returncode=0, stdout=lines[argv[0]] + "\n", stderr="")
        return CommandResult(returncode=1, stdout="", stderr=f"sbatch: error: bad key {SECRET}\n")


def test_scheduler_reasons_and_error_lines_are_masked_as_they_are_read() -> None:
    """Free text SLURM hands back (an admin's hold reason, a login shell's noise) is masked like a job's tail."""
    scheduler = slurm(Accounting(CommandResult(returncode=0, stdout="", stderr="")))
    reasons = {job.name: job.reason for job in scheduler.observe()}
    assert reasons == {"ev_a": "held: *** hf_***", "ev_b": "admin note hf_***"}
    scheduler._logs_dir_made = True
    with pytest.raises(RuntimeError, match=r"bad key \*\*\*$"):
        scheduler.submit(SubmitRequest(name="ev_x", comment="k", script="/s/job.sh", args=(), env={}, logs_dir="/l",
                                       time_limit="10"))


def test_output_that_breaks_the_frames_is_quoted_masked() -> None:
    token = "xoxb-" + "4815162342" * 3
    with pytest.raises(ObservationError, match=r"unexpected text 'session xoxb-\*\*\*'"):
        slurm(printed(READ_MARKER, f"session {token}")).read_output(cursors("ev_a"))


# ---------------------------------------------------------------------- the real script on real files


@pytest.fixture
def logs(tmp_path: Path) -> Path:
    path = tmp_path / "logs"
    path.mkdir()
    return path


def read(logs: Path, *cursors_: OutputCursor, commands: LocalCommands | None = None) -> dict[str, JobOutput]:
    return {out.job_id: out for out in slurm(commands or LocalCommands(), str(logs)).read_output(cursors_)}


def test_a_file_is_read_on_from_its_offset_without_losing_or_repeating_a_byte(logs: Path) -> None:
    log = logs / "ev_a_1.out"
    content = b"".join(f"#{i} 0 ==> {i} <== \xff\xfe {SECRET if i % 7 == 0 else ''}\r\n".encode("latin-1")
                       for i in range(3000))
    log.write_bytes(content[:50_000])
    first = read(logs, OutputCursor(job_id="1", name="ev_a"))["1"]
    with log.open("ab") as f:
        f.write(content[50_000:])
    second = read(logs, OutputCursor(job_id="1", name="ev_a", offset=first.end))["1"]
    third = read(logs, OutputCursor(job_id="1", name="ev_a", offset=second.end))["1"]
    assert (first.offset, second.offset, third.offset) == (0, first.end, second.end)
    assert third.end == len(content) and third.text == ""
    assert first.text + second.text == SecretMask([SECRET])(content.decode("utf-8", errors="replace"))
    assert SECRET not in first.text + second.text


def test_a_backlog_comes_a_cap_at_a_time_and_a_secret_across_the_cap_is_still_masked(logs: Path) -> None:
    line = b"x" * 99 + b"\n"
    head = line * (OUTPUT_READ_CAP // len(line))
    content = head + b"y" * (OUTPUT_READ_CAP - len(head) - 4) + SECRET.encode() + b" the rest\n" + line * 10
    assert content.index(SECRET.encode()) < OUTPUT_READ_CAP < content.index(SECRET.encode()) + len(SECRET)
    (logs / "ev_a_1.out").write_bytes(content)
    first = read(logs, OutputCursor(job_id="1", name="ev_a"))["1"]
    rest = read(logs, OutputCursor(job_id="1", name="ev_a", offset=first.end))["1"]
    assert first.end == len(head), "a cap's worth, to its last whole line"
    assert rest.end == len(content) and "*** the rest" in rest.text and SECRET not in rest.text


def test_a_file_shorter_than_its_offset_was_rotated_and_is_read_from_the_start(logs: Path) -> None:
    (logs / "ev_a_1.out").write_bytes(b"new life\n")
    out = read(logs, OutputCursor(job_id="1", name="ev_a", offset=10_000))["1"]
    assert (out.offset, out.end, out.text) == (0, 9, "new life\n")


def test_missing_files_and_fifos_are_left_out_and_a_fifo_never_blocks_the_read(logs: Path) -> None:
    os.mkfifo(logs / "ev_b_2.out")  # nobody writes to it: reading it would wait for ever
    (logs / "ev_c_3.out").write_bytes(b"c\n")
    result: list[dict[str, JobOutput]] = []
    reader = threading.Thread(target=lambda: result.append(read(logs, *cursors("ev_a", "ev_b", "ev_c"))), daemon=True)
    reader.start()
    reader.join(timeout=60)
    assert not reader.is_alive(), "the read blocked on the FIFO"
    assert list(result[0]) == ["3"] and result[0]["3"].text == "c\n"


def test_a_login_node_without_a_tool_fails_the_read_rather_than_reading_no_output(logs: Path, tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("sh", "stat", "dd", "xargs"):  # no base64
        found = next(Path(d) / tool for d in os.environ["PATH"].split(os.pathsep) if (Path(d) / tool).exists())
        (bin_dir / tool).symlink_to(found)
    (logs / "ev_a_1.out").write_bytes(b"a\n")
    with pytest.raises(ObservationError, match="base64 not found"):
        read(logs, OutputCursor(job_id="1", name="ev_a"), commands=LocalCommands({"PATH": str(bin_dir)}))
