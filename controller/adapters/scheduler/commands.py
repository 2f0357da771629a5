"""Where scheduler commands run: on this host, or on a login node over ssh (adapters/remote/ssh.py).

The SLURM backend only builds argv lists; a `CommandRunner` executes them. Environment values
(secrets among them) are handed over out of band — the process environment here, stdin over ssh —
so they never appear in any argv, log line or file.

What a job inherits: its submitter's environment (`sbatch --export=ALL`, the local runner) minus every secret
there — the reconciler's own variables (EVALCTL_*, its MLflow login) and every variable that looks like one (named
TOKEN, KEY, SECRET or PASSWORD, holding more than a switch, a number or an existing path: `secrets.looks_secret`) —
and minus every name of the job contract (`job_env.CONTRACT_NAMES`), plus what the cluster declares (`env`,
`secretEnv`) and the contract's values for the cell. So a job gets a secret only because its cluster says so, and
runs under the settings its cell names (an EVAL_CONFIG_YAML or EVAL_SHARD exported in a researcher's shell would
change what a cell measures, not its fingerprint), while PATH, HOME, module and site settings still pass. Over ssh
the login shell's environment is filtered by the same rules, there (`remote.ssh.DROP_SECRETS`, `DROP_CONTRACT`):
the reconciler's own never travels.

What a command answers is read as it comes and capped (`capture`): a login node that answers more than
`ANSWER_CAP` on stdout or `ERRORS_CAP` on stderr has its command killed and the read fails (`AnswerTooLarge`, a
CommandFailed: the cluster reads Unknown, never "no jobs"). Read whole, a few hundred MB took the operator past its
memory limit on every pass, and again after every restart.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Protocol

from controller.adapters.secrets import looks_secret
from controller.core.job_env import CONTRACT_NAMES
from controller.core.types import Frozen


class CommandResult(Frozen):
    returncode: int
    stdout: str
    stderr: str


class CommandFailed(RuntimeError):
    """A command could not be run at all (not found, timed out, connection lost, answered too much)."""


class AnswerTooLarge(CommandFailed):
    """A command printed more than its runner reads: it was killed, its answer is not one."""


# One answer: squeue/sacct list at most maxLiveJobs' ceiling (100,000) jobs, lines of ~250 bytes and a free-text
# reason, so 640 bytes a job; a run-dir probe batch (256 dirs) is a few MB; job output is read in batches that stay
# under it (slurm.OUTPUT_BATCH). Decoded, an answer costs about twice its size while it is parsed.
ANSWER_CAP = 64 << 20
ERRORS_CAP = 1 << 20  # stderr: only its last lines are ever read (SLURM's message, ssh's reason)
_CHUNK = 1 << 16


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
    """This process's environment minus the reconciler's own variables and credentials, every other secret, and the
    job contract's names.

    Jobs inherit what their submitter had (`sbatch --export=ALL`, the local runner): without this, every job
    would carry every secret the reconciler can read (an HF_TOKEN in its shell), not just the ones meant for it,
    and a contract setting the cell leaves unset would take the shell's value.
    """
    return {name: value for name, value in os.environ.items()
            if not name.startswith(OWN_VARIABLES) and name not in OWN_CREDENTIALS and name not in CONTRACT_NAMES
            and not looks_secret(name, value)}


class LocalCommands:
    """Run commands on this host (the reconciler runs on the login node itself)."""

    def __init__(self, base_env: Mapping[str, str] | None = None, *, max_answer: int = ANSWER_CAP,
                 max_errors: int = ERRORS_CAP):
        self.base_env = dict(base_env or {})
        self.caps = (max_answer, max_errors)

    def run(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, timeout: float,
            stdin: str | None = None) -> CommandResult:
        try:
            return capture(list(argv), env={**inherited_environment(), **self.base_env, **(env or {})},
                           stdin=stdin, timeout=timeout, caps=self.caps)
        except AnswerTooLarge as exc:
            raise AnswerTooLarge(f"{argv[0]}: {exc}") from None
        except subprocess.TimeoutExpired as exc:
            raise CommandFailed(f"{argv[0]} did not answer within {timeout:g} s") from exc
        except OSError as exc:
            raise CommandFailed(f"{argv[0]}: {exc.strerror or exc}") from exc


class EnvCommands:
    """A cluster's commands with its own variables (its SLURM_CONF), wherever they run."""

    def __init__(self, inner: CommandRunner, env: Mapping[str, str]):
        self.inner, self.env = inner, dict(env)

    def run(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, timeout: float,
            stdin: str | None = None) -> CommandResult:
        return self.inner.run(argv, env={**self.env, **(env or {})}, timeout=timeout, stdin=stdin)


def capture(argv: list[str], *, env: Mapping[str, str] | None = None, stdin: str | None, timeout: float,
            caps: tuple[int, int]) -> CommandResult:
    """Run argv, its stdout and stderr read as they come, each up to its cap (stdout, stderr).

    Past a cap, or past `timeout`, the command's whole process group is killed (a pipeline's every stage) and
    AnswerTooLarge or subprocess.TimeoutExpired is raised. Text is decoded as `subprocess.run(text=True)` did:
    UTF-8 with bad bytes replaced (a job's log must not fail the decode), universal newlines."""
    deadline = time.monotonic() + timeout
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    over: list[str] = []
    streams = {"stdout": (proc.stdout, caps[0]), "stderr": (proc.stderr, caps[1])}
    read: dict[str, list[bytes]] = {name: [] for name in streams}

    def drain(name: str) -> None:
        stream, cap = streams[name]
        assert stream is not None
        size = 0
        while chunk := os.read(stream.fileno(), _CHUNK):
            size += len(chunk)
            if size > cap:
                over.append(f"answer larger than {_size(cap)} on {name}; the command was killed")
                _kill(proc)
                return
            read[name].append(chunk)

    threads = [threading.Thread(target=drain, args=(name,), daemon=True) for name in streams]
    if stdin is not None:
        threads.append(threading.Thread(target=_feed, args=(proc, stdin.encode()), daemon=True))
    for thread in threads:
        thread.start()
    try:
        for thread in threads:
            thread.join(max(deadline - time.monotonic(), 0))
            if thread.is_alive():
                raise subprocess.TimeoutExpired(argv, timeout)
        returncode = proc.wait(max(deadline - time.monotonic(), 0.1))
    except subprocess.TimeoutExpired:
        _kill(proc)
        raise
    finally:
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
    if over:
        raise AnswerTooLarge(over[0])
    return CommandResult(returncode=returncode, stdout=_text(read["stdout"]), stderr=_text(read["stderr"]))


def _feed(proc: subprocess.Popen[bytes], data: bytes) -> None:
    assert proc.stdin is not None
    try:
        proc.stdin.write(data)
        proc.stdin.close()
    except (BrokenPipeError, ValueError):  # it exited (or was killed) without reading all of it
        pass


def _kill(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _text(chunks: list[bytes]) -> str:
    return b"".join(chunks).decode("utf-8", "replace").replace("\r\n", "\n").replace("\r", "\n")


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 and not n % (1 << 20) else f"{n >> 10} KiB" if n >= 1 << 10 else f"{n} B"
