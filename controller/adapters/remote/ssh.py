"""Reach a cluster's login node over ssh: run scheduler commands there (run dirs are read through sftp.py).

Commands go through the system OpenSSH client, so the user's ~/.ssh/config (aliases, ProxyJump, keys, agent)
applies exactly as on their shell. Host keys are always checked: a login node whose key is unknown or changed
is refused, never trusted on first use. Environment values may be secrets, so they travel only on the ssh
channel's stdin, as a script the remote `sh -s` runs; no argv (local or remote) and no file ever holds them. That
script first unsets the login shell's own secrets (`DROP_SECRETS`) and the job contract's names (`DROP_CONTRACT`): a
job submitted there inherits, as one submitted here, only the secrets its cluster declares and the settings its cell
names.

A cluster whose key and known_hosts come from Secrets (an `SshIdentity`, see `materialize_identity`) runs with
that identity ONLY: a config file written here instead of any ssh_config, no agent, no default keys, no other
known_hosts. With `public_errors` a failure says which host and what failed, never ssh's or paramiko's own text
(it may quote a file ssh was pointed at); that detail goes to the log, masked.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import secrets
import shlex
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

from controller.adapters.scheduler.commands import (
    ANSWER_CAP,
    ERRORS_CAP,
    AnswerTooLarge,
    CommandFailed,
    CommandResult,
    capture,
)
from controller.adapters.secrets import SecretMask
from controller.core.job_env import CONTRACT_NAMES

log = logging.getLogger("evalctl.ssh")
_HOST = re.compile(r"(?:(?P<user>[^@\s]+)@)?(?P<host>\[[^\]\s]+\]|[A-Za-z0-9_.%][^:@\s\[\]]*)(?::(?P<port>\d{1,5}))?")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def parse_host(text: str) -> tuple[str | None, str, int | None]:
    """`host`, `user@host`, `user@host:port` or `user@[v6addr]:port` → (user, host, port).

    The host may not start with '-': it ends up in ssh's argv, where it must not read as an option.
    """
    match = _HOST.fullmatch(text.strip())
    if not match:
        raise ValueError(f"not an ssh host: {text!r} (expected host, user@host or user@host:port)")
    port = int(match["port"]) if match["port"] else None
    return match["user"], match["host"].strip("[]"), port


# The login shell's own secrets stay out of what its commands pass on (`sbatch --export=ALL`): `looks_secret` in sh,
# every exported variable named TOKEN, KEY, SECRET or PASSWORD unset unless it holds a blank, a switch, a number or a
# path that exists there. It runs before the exports: what the cluster declares is set again after it.
DROP_SECRETS = r"""_evalctl_names=$(env | sed -n 's/^\([A-Za-z_][A-Za-z0-9_]*\)=.*/\1/p' |
  grep -i -e TOKEN -e KEY -e SECRET -e PASSWORD)
for _evalctl_name in $_evalctl_names; do
  eval "_evalctl_value=\${$_evalctl_name-}"
  case $_evalctl_value in
    *[![:space:]]*) ;;
    *) continue ;;
  esac
  case $_evalctl_value in
    [Tt][Rr][Uu][Ee]|[Ff][Aa][Ll][Ss][Ee]|[Yy][Ee][Ss]|[Nn][Oo]|[Oo][Nn]|[Oo][Ff][Ff]) continue ;;
    [Nn][Oo][Nn][Ee]|[Nn][Uu][Ll][Ll]) continue ;;
    /*) ! [ -e "$_evalctl_value" ] || continue ;;
    *[!0-9.+-]*) ;;
    *) continue ;;
  esac
  (unset "$_evalctl_name") 2>/dev/null && unset "$_evalctl_name"
done
"""


# Nor do the job contract's names (`job_env.CONTRACT_NAMES`): a job gets them from its cell only, as locally.
DROP_CONTRACT = (f"for _evalctl_name in {' '.join(sorted(CONTRACT_NAMES))}; do\n"
                 '  (unset "$_evalctl_name") 2>/dev/null && unset "$_evalctl_name"\ndone\n')


def remote_script(argv: Sequence[str], env: Mapping[str, str] | None, stdin: str | None = None) -> str:
    """The stdin of the remote `sh -s`: DROP_SECRETS, DROP_CONTRACT, exports, then exec argv (so its exit code is the command's),
    its own input (`stdin`) in a quoted here-document: no expansion, and a terminator it does not contain."""
    if not argv:
        raise ValueError("empty argv")
    lines = [DROP_SECRETS.rstrip("\n"), DROP_CONTRACT.rstrip("\n")]
    for name, value in (env or {}).items():
        if not _ENV_NAME.fullmatch(name):
            raise ValueError(f"invalid environment variable name: {name!r}")
        if "\0" in value:
            raise ValueError(f"environment variable {name} holds a NUL byte")  # never the value: a secret
        lines.append(f"export {name}={shlex.quote(value)}")
    if stdin is None:
        lines.append(f"exec {shlex.join(argv)}")
        return "\n".join(lines) + "\n"
    marker = f"EVALCTL_{secrets.token_hex(8)}"
    if marker in stdin:  # 2**-64: refuse rather than cut the input short
        raise ValueError("the command's input holds its here-document terminator")
    lines += [f"exec {shlex.join(argv)} <<'{marker}'", stdin.rstrip("\n"), marker]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------- identity from Secrets

_EMPTY_CONFIG = "# written by evalrun-controller: ssh reads this instead of ~/.ssh/config and /etc/ssh/ssh_config\n"


@dataclass(frozen=True)
class SshIdentity:
    """A private key and known_hosts given as values (a Secret's), as the files ssh and paramiko read.

    `mask` hides both values in what is logged; repr never shows it."""

    dir: str
    key_file: str
    known_hosts_file: str
    config_file: str  # empty: with `-F` it, no user or system ssh_config applies
    mask: SecretMask = field(repr=False, compare=False)


def materialize_identity(private_key: str, known_hosts: str, *, base_dir: str | None = None) -> SshIdentity:
    """Write the key and known_hosts into a private (0700) dir named after their content, files 0600.

    Same content, same files: the ssh argv (and so the ControlMaster socket and fsspec's cached sftp instance)
    stays the same from pass to pass, and a rotated Secret gets new files, so no master outlives the key it
    used. Written atomically (a reader never sees half a key); existing files are checked, not trusted.
    `base_dir`: where that dir goes (default: where SshCommands keeps its sockets).
    """
    key = private_key.replace("\r\n", "\n").strip() + "\n"  # OpenSSH refuses a key without its final newline
    known = _lines(known_hosts)
    where = _materialize({"id": key, "known_hosts": known, "ssh_config": _EMPTY_CONFIG}, base_dir)
    # the key's lines too (a key is never printed whole), and the keys and hashed names in known_hosts, which
    # paramiko quotes ("does not match: got …, expected …"); not the host names, which every message names
    known_keys = [word for line in known.splitlines() for word in line.split() if len(word) >= 40]
    mask = SecretMask(values=[key, key.strip(), known, known.strip(), *key.splitlines(), *known_keys])
    return SshIdentity(dir=str(where), key_file=str(where / "id"), known_hosts_file=str(where / "known_hosts"),
                       config_file=str(where / "ssh_config"), mask=mask)


def materialize_known_hosts(known_hosts: str, *, base_dir: str | None = None) -> str:
    """known_hosts lines alone (a Secret's), for a cluster that otherwise keeps its ssh setup: the file's path."""
    return str(_materialize({"known_hosts": _lines(known_hosts)}, base_dir) / "known_hosts")


def _lines(text: str) -> str:
    text = text.replace("\r\n", "\n").strip()
    return text + "\n" if text else ""


def _materialize(files: Mapping[str, str], base_dir: str | None) -> Path:
    """The private dir `id-<hash of files>` holding `files`, each 0600."""
    digest = hashlib.sha256()
    for name, content in sorted(files.items()):
        digest.update(f"{name}\0{len(content.encode())}\0".encode() + content.encode())
    root = _private_dir(Path(base_dir) if base_dir else _default_control_dir())
    where = _private_dir(root / f"id-{digest.hexdigest()[:32]}")
    for name, content in files.items():
        _write_private_file(where / name, content.encode())
    return where


def _write_private_file(path: Path, content: bytes) -> None:
    """`path` holds exactly `content`, mode 0600, ours: kept if it already does, else replaced atomically."""
    try:
        st = path.lstat()
        if (stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077
                and path.read_bytes() == content):
            return
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise CommandFailed(f"ssh identity file {path}: {exc.strerror or exc}") from None
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".new-")  # mkstemp: O_EXCL, 0600
    try:
        with os.fdopen(fd, "wb") as out:
            os.fchmod(out.fileno(), 0o600)
            out.write(content)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise CommandFailed(f"ssh identity file {path}: {exc.strerror or exc}") from None


def _failure_kind(text: str) -> str:
    """A fixed phrase for what went wrong, picked from ssh's/paramiko's text but never quoting it."""
    lowered = text.lower()
    for needles, kind in ((("host key", "host identification", "known_hosts"), "host key unknown or changed"),
                          (("permission denied", "authentication"), "authentication refused"),
                          (("connection refused",), "connection refused"),
                          (("unable to connect",), "no connection"),
                          (("timed out", "timeout"), "timed out"),
                          (("could not resolve", "name or service not known"), "host name not resolved"),
                          (("no route to host", "network is unreachable"), "host unreachable")):
        if any(needle in lowered for needle in needles):
            return kind
    return ""


def public_failure(subject: str, code: str, detail: str, mask: Callable[[str], str], *, what: str = "") -> str:
    """What a tenant may see: "ssh to HOST:PORT failed (exit 255, host key unknown or changed); see the
    operator's log". ssh's/paramiko's own `detail` may quote any file they were pointed at (a bad ssh_config line,
    a token), so it goes to the log only, masked."""
    log.warning(f"{subject} failed", extra={"what": what or subject, "code": code,
                                            "detail": mask(detail) or "(no output)"})
    return f"{subject} failed ({', '.join(part for part in (code, _failure_kind(detail)) if part)}); see the operator's log"


def log_mask(identity: SshIdentity | None, mask: Callable[[str], str] | None) -> Callable[[str], str]:
    first: Callable[[str], str] = identity.mask if identity is not None else SecretMask()
    return first if mask is None else (lambda text: mask(first(text)))


class SshCommands:
    """Run commands on a login node with the system `ssh`, one multiplexed connection for many commands.

    The master connection (ControlMaster) persists `control_persist` s after the last command, so a
    reconciler pass opens one TCP connection however many squeue/sacct/sbatch calls it makes; `close()`
    ends it early. Its socket lives in a private (0700) dir, named after this runner's host string and options
    too, so runners with different aliases, known_hosts or keys never share a master.
    """

    def __init__(self, host: str, *, config_file: str | None = None, known_hosts: str | None = None,
                 identity_file: str | None = None, identity: SshIdentity | None = None, public_errors: bool = False,
                 mask: Callable[[str], str] | None = None, options: Sequence[str] = (), connect_timeout: int = 10,
                 control_persist: int = 300, control_dir: str | None = None, max_answer: int = ANSWER_CAP,
                 max_errors: int = ERRORS_CAP):
        """`identity`: ssh runs with it alone (no ssh_config, agent, default key or other known_hosts), so it
        excludes config_file, known_hosts and identity_file. `public_errors`: CommandFailed says only which
        host and what failed; ssh's text is logged, masked with `identity.mask`, then `mask`."""
        if identity is not None and (config_file or known_hosts or identity_file):
            raise ValueError("an ssh identity from Secrets excludes config_file, known_hosts and identity_file")
        user, self.hostname, self.port = parse_host(host)
        self.host = host
        self.identity = identity
        self.public_errors = public_errors
        self._mask = log_mask(identity, mask)
        self.control_persist = control_persist
        self.caps = (max_answer, max_errors)  # what one command's stdout and stderr may hold (commands.capture)
        # ssh keeps the FIRST value of an option: ours come first, so `options` and ssh_config cannot relax them.
        # ServerAlive*: a master whose network died would otherwise still answer `-O check` and hang every command
        argv = ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
                "-o", f"ConnectTimeout={int(connect_timeout)}", "-o", "ServerAliveInterval=15",
                "-o", "ServerAliveCountMax=3"]
        if identity is not None:
            # -F: never ~/.ssh/config nor /etc/ssh/ssh_config; IdentityAgent=none: not even an agent's keys;
            # IdentityFile set: no default ~/.ssh/id_* either; nothing the operator's own setup could lend
            argv += ["-F", identity.config_file, "-o", "IdentitiesOnly=yes", "-o", "IdentityAgent=none",
                     "-o", f"IdentityFile={identity.key_file}", "-o", f"UserKnownHostsFile={identity.known_hosts_file}",
                     "-o", "GlobalKnownHostsFile=/dev/null", "-o", "UpdateHostKeys=no", "-o", "ProxyCommand=none",
                     "-o", "ProxyJump=none", "-o", "ForwardAgent=no", "-o", "PermitLocalCommand=no"]
        if config_file:
            argv += ["-F", config_file]
        if known_hosts:
            argv += ["-o", f"UserKnownHostsFile={known_hosts}"]
        if identity_file:
            argv += ["-o", "IdentitiesOnly=yes", "-i", identity_file]
        if user:
            argv += ["-l", user]
        if self.port:
            argv += ["-p", str(self.port)]
        argv += list(options)
        # %C (a hash of local host, remote host, port, user) keeps the path short enough for AF_UNIX, but alone
        # it would let two aliases of one host:port:user (say, with different ProxyJumps) share a master.
        digest = hashlib.sha256("\0".join([host, *argv]).encode()).hexdigest()[:8]
        self.control_dir = _private_dir(Path(control_dir) if control_dir else _default_control_dir())
        self.control_path = f"{self.control_dir}/{digest}-%C"
        self._ssh = [*argv, "-o", f"ControlPath={self.control_path}"]

    def run(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, timeout: float,
            stdin: str | None = None) -> CommandResult:
        script = remote_script(argv, env, stdin)
        deadline = time.monotonic() + timeout
        self._ensure_master(timeout)
        try:
            # ControlMaster=no: a command never becomes the persisting master itself (see _ensure_master)
            proc = capture([*self._ssh, "-o", "ControlMaster=no", "--", self.hostname, "sh -s"], stdin=script,
                           timeout=max(deadline - time.monotonic(), 0.1), caps=self.caps)
        except AnswerTooLarge as exc:
            raise AnswerTooLarge(f"{argv[0]} on {self.host}: {exc}") from None
        except subprocess.TimeoutExpired as exc:
            raise CommandFailed(f"{argv[0]} on {self.host} did not answer within {timeout:g} s") from exc
        except OSError as exc:
            raise CommandFailed(f"ssh: {exc.strerror or exc}") from exc
        # 255 is ssh's own failure (connection, auth, host key); a remote command exiting 255 looks the same
        if proc.returncode == 255:
            raise CommandFailed(self._ssh_error(proc.stderr, f"{argv[0]} on {self.host}", 255))
        return proc

    def close(self) -> None:
        """End the master connection now rather than after ControlPersist (no-op when there is none)."""
        subprocess.run(
            [*self._ssh, "-O", "exit", "--", self.hostname], stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=10, check=False,
        )

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _ensure_master(self, timeout: float) -> None:
        """Start the persisting master unless one answers.

        Started apart from any command, with stderr in an anonymous file: the backgrounded master keeps the
        stderr it was started with open for ControlPersist seconds, so on a pipe the caller would wait that long.
        """
        check = [*self._ssh, "-O", "check", "--", self.hostname]
        try:
            if subprocess.run(check, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, timeout=timeout, check=False).returncode == 0:
                return
            with tempfile.TemporaryFile() as err:
                proc = subprocess.run(
                    [*self._ssh, "-o", "ControlMaster=auto", "-o", f"ControlPersist={self.control_persist}",
                     "--", self.hostname, "true"],
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, timeout=timeout, check=False,
                )
                err.seek(0)
                message = err.read().decode("utf-8", "replace")
        except subprocess.TimeoutExpired:
            raise CommandFailed(f"ssh to {self.host} did not answer within {timeout:g} s") from None
        except OSError as exc:
            raise CommandFailed(f"ssh: {exc.strerror or exc}") from exc
        if proc.returncode != 0:
            raise CommandFailed(self._ssh_error(message, f"ssh to {self.host}", proc.returncode))

    def _ssh_error(self, stderr: str, what: str, returncode: int) -> str:
        lines = [line.strip() for line in stderr.replace("\r", "").splitlines() if line.strip()]
        if self.public_errors:
            subject = f"ssh to {endpoint(self.hostname, self.port, self.identity is not None)}"
            return public_failure(subject, f"exit {returncode}", " / ".join(lines), self._mask, what=what)
        text = f"{what} failed: {' / '.join(lines[-6:]) or 'ssh exited with 255'}"
        host_key = any("host key" in line.lower() or "host identification" in line.lower() for line in lines)
        if host_key and self.identity is not None:  # the file is ours: the fix goes in the Secret
            return (f"{text} — the login node's host key is unknown or changed: check its fingerprint, then put its "
                    f"line (`ssh-keyscan -p {self.port or 22} {self.hostname}`) in the known_hosts Secret")
        if host_key:
            host, port, known = self._resolved()
            name = host if port == "22" else f"'[{host}]:{port}'"
            text += (f" — the login node's host key is unknown or changed: check its fingerprint, then add it to "
                     f"known_hosts, e.g. `ssh-keyscan -p {port} {host} >> {known}` (if it changed, first "
                     f"`ssh-keygen -R {name} -f {known}`)")
        return text

    def _resolved(self) -> tuple[str, str, str]:
        """(HostName, Port, first UserKnownHostsFile) as ssh resolves them: ssh-keyscan reads no ssh_config."""
        found = {"hostname": self.hostname, "port": str(self.port or 22), "userknownhostsfile": "~/.ssh/known_hosts"}
        try:
            out = subprocess.run([*self._ssh, "-G", "--", self.hostname], capture_output=True, text=True,
                                 stdin=subprocess.DEVNULL, timeout=10, check=False).stdout
        except (OSError, subprocess.TimeoutExpired):
            out = ""
        for line in out.splitlines():
            key, _, value = line.partition(" ")
            if key in found and value:
                found[key] = value.split()[0]
        return found["hostname"], found["port"], found["userknownhostsfile"]


def _default_control_dir() -> Path:
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and Path(runtime).is_dir():
        return Path(runtime) / "evalrun-ssh"
    return Path(tempfile.gettempdir()) / f"evalrun-ssh-{os.getuid()}"


def _private_dir(path: Path) -> Path:
    """Create `path` 0700, or accept it only if it already is ours and private (in /tmp anyone could make it)."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = path.lstat()
    except OSError as exc:
        raise CommandFailed(f"ssh control dir {path}: {exc.strerror or exc}") from exc
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise CommandFailed(f"ssh control dir {path} is not a private directory of ours (want mode 0700)")
    return path


def endpoint(hostname: str, port: int | None, fixed: bool) -> str:
    """HOST:PORT as a message names it; an alias alone when its port comes from an ssh_config."""
    if port is None and not fixed:
        return hostname
    return f"[{hostname}]:{port or 22}" if ":" in hostname else f"{hostname}:{port or 22}"
