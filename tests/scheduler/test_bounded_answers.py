"""What a command answers is capped on the operator's side: past the cap it is killed and the read fails.

Real commands that print without end (`yes`): if the cap did not stop them, only the generous timeout would, and
the error would say so instead. No timing is asserted.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from controller.adapters.scheduler.commands import AnswerTooLarge, CommandFailed, LocalCommands
from controller.adapters.scheduler.slurm import SlurmOptions, SlurmScheduler
from controller.adapters.secrets import SecretMask
from controller.core.ports import ObservationError

TIMEOUT_S = 60.0  # never reached when the cap works


def test_an_endless_answer_is_cut_at_the_cap_and_the_command_killed():
    runner = LocalCommands(max_answer=1 << 20)

    with pytest.raises(AnswerTooLarge, match=r"^yes: answer larger than 1 MiB on stdout; the command was killed"):
        runner.run(["yes"], timeout=TIMEOUT_S)


def test_every_stage_of_a_pipeline_is_killed():
    # the pipe's other end stays open while any stage lives: killing `sh` alone would leave the read to the timeout
    runner = LocalCommands(max_answer=1 << 20)

    with pytest.raises(AnswerTooLarge, match="1 MiB on stdout"):
        runner.run(["sh", "-c", "yes | head -c 200000000; sleep 600"], timeout=TIMEOUT_S)


def test_stderr_has_its_own_smaller_cap():
    runner = LocalCommands(max_errors=64 << 10)

    with pytest.raises(AnswerTooLarge, match="answer larger than 64 KiB on stderr"):
        runner.run(["sh", "-c", "yes >&2"], timeout=TIMEOUT_S)


def test_an_answer_within_the_cap_arrives_whole_as_text():
    runner = LocalCommands(max_answer=1 << 20)
    size = (1 << 20) - 15  # exactly the cap, with what follows

    result = runner.run(["sh", "-c", f"head -c {size} /dev/zero | tr '\\0' x; printf 'a\\r\\nb\\377'; cat; exit 3"],
                        timeout=TIMEOUT_S, stdin="from stdin")

    assert result.returncode == 3
    assert result.stdout == "x" * size + "a\nb\ufffdfrom stdin"


def test_a_timeout_is_still_a_timeout():
    with pytest.raises(CommandFailed, match=r"did not answer within 0\.5 s") as caught:
        LocalCommands().run(["sleep", "30"], timeout=0.5)
    assert not isinstance(caught.value, AnswerTooLarge)


def test_a_huge_squeue_answer_makes_the_queue_unknown_never_empty(tmp_path: Path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for command in ("squeue", "sacct"):
        (bin_dir / command).write_text("#!/bin/sh\nexec yes '1|ev_x|RUNNING||||||n1|None'\n")
        (bin_dir / command).chmod(0o755)
    runner = LocalCommands({"PATH": f"{bin_dir}:{os.environ['PATH']}"}, max_answer=1 << 20)
    slurm = SlurmScheduler(runner, SlurmOptions(), logs_dir=str(tmp_path), user="alice", mask=SecretMask([]))

    with pytest.raises(ObservationError, match="answer larger than 1 MiB"):
        slurm.observe()
