"""Reading job output on a login node over ssh: one command, and the bytes arrive intact.

The ssh runner decodes what it receives as text (bad UTF-8 replaced); the read script base64-encodes each file,
so offsets still count the file's own bytes. The "login node" is the lab sshd on this machine (scripts/sshd-up.sh),
so the files written here are the ones read there. `ssh_lab` and `control_dir` are tests/ssh's fixtures.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.adapters.remote.ssh import SshCommands
from controller.adapters.scheduler.slurm import SlurmOptions, SlurmScheduler
from controller.adapters.secrets import SecretMask
from controller.core.ports import OutputCursor
from tests.ssh.conftest import SshLab, control_dir, ssh_lab

__all__ = ["control_dir", "ssh_lab"]
SECRET = "tok-31d4a0c5e9"


@pytest.fixture
def remote(ssh_lab: SshLab, control_dir: str, tmp_path: Path) -> Iterator[SlurmScheduler]:
    commands = SshCommands(ssh_lab.alias, config_file=ssh_lab.config_file, control_dir=control_dir)
    yield SlurmScheduler(commands, SlurmOptions(), logs_dir=str(tmp_path), user="root", mask=SecretMask([SECRET]))
    commands.close()


def test_output_read_over_ssh_keeps_every_byte_and_offset(remote: SlurmScheduler, tmp_path: Path) -> None:
    content = b"".join(b"%d \xff\xfe\x80 \xe2\x82 \r\n%s\n" % (i, SECRET.encode()) for i in range(2000))
    (tmp_path / "ev_a_1.out").write_bytes(content)
    (tmp_path / "ev_b_2.out").write_bytes(b"other job\n")
    cursors = [OutputCursor(job_id="1", name="ev_a", offset=7), OutputCursor(job_id="2", name="ev_b"),
               OutputCursor(job_id="3", name="ev_missing")]
    a, b = remote.read_output(cursors)
    assert (a.offset, a.end, b.end) == (7, len(content), 10)
    assert a.text == SecretMask([SECRET])(content[7:].decode("utf-8", errors="replace")) and b.text == "other job\n"
