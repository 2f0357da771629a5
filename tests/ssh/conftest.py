"""Session fixture for the ssh tests: a real private sshd on 127.0.0.1 standing in for a login node.

Brought up by scripts/sshd-up.sh (idempotent; ~0.3 s when already up, left running afterwards):
state in $SSH_LAB (default /tmp/evalrun-ssh), port $SSH_PORT (default 2222), alias `evalrun-login` in its ssh_config.
Needs root (apt-get, sshd, root login); skipped otherwise.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class SshLab:
    dir: Path
    port: int
    alias: str = "evalrun-login"

    @property
    def config_file(self) -> str:
        """ssh_config with `Host evalrun-login` (HostName, Port, User root, IdentityFile, UserKnownHostsFile)."""
        return str(self.dir / "ssh_config")

    @property
    def known_hosts(self) -> str:
        return str(self.dir / "known_hosts")

    @property
    def identity_file(self) -> str:
        return str(self.dir / "id_ed25519")

    @property
    def host_key(self) -> str:
        """`type base64` of the sshd's host key."""
        return " ".join((self.dir / "ssh_host_ed25519_key.pub").read_text().split()[:2])


def _run_script(script: str, timeout: float) -> str:
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / script)],
        cwd=REPO, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, check=False,
    )
    if proc.returncode != 0:
        pytest.fail(f"{script} failed (rc={proc.returncode}):\n{proc.stdout}\n{proc.stderr}", pytrace=False)
    return proc.stdout


@pytest.fixture(scope="session")
def ssh_lab() -> SshLab:
    """The running test sshd: its state dir, port, alias and client files (starts it if needed)."""
    if os.geteuid() != 0:
        pytest.skip("the test sshd needs root")
    out = _run_script("sshd-up.sh", timeout=600)
    return SshLab(dir=Path(out.strip().splitlines()[-1]), port=int(os.environ.get("SSH_PORT", "2222")))


@pytest.fixture
def control_dir() -> Iterator[str]:
    """A private (0700) dir for ssh ControlMaster sockets, with a short path: AF_UNIX paths max out at 108 bytes,
    too few for pytest's tmp_path plus ssh's socket name."""
    path = tempfile.mkdtemp(prefix="evalrun-cm-")
    yield path
    shutil.rmtree(path, ignore_errors=True)
