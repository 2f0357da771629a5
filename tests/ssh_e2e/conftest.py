"""Fixtures for the end-to-end runs over ssh: the lab sshd as the login node of the lab SLURM cluster.

`ssh_lab` is tests/ssh's session fixture (scripts/sshd-up.sh), imported so both suites share one definition;
`slurm_env` and `eval_env` come from tests/conftest.py.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest

from controller.adapters.remote.ssh import SshCommands
from tests.ssh.conftest import SshLab, ssh_lab

__all__ = ["login_node", "ssh_lab"]



def _sinfo_over_ssh(lab: SshLab) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ssh", "-F", lab.config_file, lab.alias, "sinfo", "--noheader"], capture_output=True,
                          text=True, stdin=subprocess.DEVNULL, timeout=60, check=False)


@pytest.fixture(scope="session")
def login_node(ssh_lab: SshLab, slurm_env: dict[str, str]) -> Iterator[SshLab]:
    """The lab sshd as the login node of the lab SLURM cluster (sshd-up.sh gives sessions its SLURM_CONF).

    Afterwards the ssh master connection the reconciler left (ControlPersist) to the lab alias is closed.
    """
    probe = _sinfo_over_ssh(ssh_lab)
    if probe.returncode != 0:
        pytest.fail(f"SLURM commands fail over ssh: {probe.stderr.strip()}", pytrace=False)
    try:
        yield ssh_lab
    finally:
        SshCommands(ssh_lab.alias, config_file=ssh_lab.config_file).close()
