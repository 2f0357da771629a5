"""Where scheduler commands run: on this host, or on a login node over ssh (adapters/remote/ssh.py).

The SLURM backend only builds argv lists; a `CommandRunner` executes them. Environment values
(secrets among them) are handed over out of band — the process environment here, stdin over ssh —
so they never appear in any argv, log line or file.

What a job inherits: its submitter's environment (`sbatch --export=ALL`, the local runner) minus every secret
there — the reconciler's own variables (EVALCTL_*, its MLflow login) and every variable that looks like one (named
TOKEN, KEY, SECRET or PASSWORD, holding more than a switch, a number or an existing path: `secrets.looks_secret`) —
plus what the cluster declares (`env`, `secretEnv`, the EVAL_* settings). So a job gets a secret only because its
cluster says so, while PATH, HOME, module and site settings still pass. Over ssh the login shell's environment is
filtered by the same rule, there (`remote.ssh.DROP_SECRETS`): the reconciler's own never travels.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from typing import Protocol

from controller.adapters.secrets import looks_secret
from controller.core.types import Frozen


class CommandResult(Frozen):
    returncode: int
    stdout: str
    stderr: str


class CommandFailed(RuntimeError):
    """A command could not be run at all (not found, timed out, connection lost)."""


class CommandRunner(Protocol):
    def run(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, timeout: float,
            stdin: str | None = None) -> CommandResult:
        """Run argv with `env` added to the environment and `stdin` as its input; raise CommandFailed when it could
        not finish."""
        ...


OWN_VARIABLES = "EVALCTL_"  # the reconciler's settings and every secret it holds (EVALCTL_SECRET_*)
# the reconciler's own MLflow login: it uploads, jobs never do
OWN_CREDENTIALS = frozenset({"MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN"})


def inherited_environment() -> dict[str, str]:
    """This process's environment minus the reconciler's own variables and credentials and every other secret.

    Jobs inherit what their submitter had (`sbatch --export=ALL`, the local runner): without this, every job
    would carry every secret the reconciler can read (an HF_TOKEN in its shell), not just the ones meant for it.
    """
    return {name: value for name, value in os.environ.items()
            if not name.startswith(OWN_VARIABLES) and name not in OWN_CREDENTIALS and not looks_secret(name, value)}


class LocalCommands:
    """Run commands on this host (the reconciler runs on the login node itself)."""

    def __init__(self, base_env: Mapping[str, str] | None = None):
        self.base_env = dict(base_env or {})

    def run(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, timeout: float,
            stdin: str | None = None) -> CommandResult:
        try:
            proc = subprocess.run(
                list(argv), env={**inherited_environment(), **self.base_env, **(env or {})}, capture_output=True,
                text=True, encoding="utf-8", errors="replace",  # a job's log bytes must not fail the decode
                timeout=timeout, check=False, **({"input": stdin} if stdin is not None else {"stdin": subprocess.DEVNULL}),
            )
        except subprocess.TimeoutExpired as exc:
            raise CommandFailed(f"{argv[0]} did not answer within {timeout:g} s") from exc
        except OSError as exc:
            raise CommandFailed(f"{argv[0]}: {exc.strerror or exc}") from exc
        return CommandResult(returncode=proc.returncode, stdout=proc.stdout, stderr=proc.stderr)
