"""Read a login node's run dirs through sftp (paramiko, via fsspec), with host keys checked and the ssh_config
resolved here, since paramiko does not read it: the file side of what ssh.py does for commands.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import paramiko
from fsspec.implementations.sftp import SFTPFileSystem

from controller.adapters.remote.ssh import SshIdentity, endpoint, log_mask, parse_host, public_failure
from controller.core.ports import ObservationError


class CheckedSFTPFileSystem(SFTPFileSystem):  # type: ignore[misc]  # fsspec ships no type hints
    """fsspec's SFTPFileSystem with host key checking ON.

    The upstream class trusts any host key on first sight (paramiko AutoAddPolicy, no known_hosts loaded).
    Here the key must be in the known_hosts files, like `ssh -o StrictHostKeyChecking=yes`; otherwise
    connecting raises paramiko.SSHException (BadHostKeyException for a changed key).
    """

    def __init__(self, host: str, *, known_hosts: Sequence[str] = (), global_known_hosts: Sequence[str] = (),
                 proxy_command: str | None = None, **ssh_kwargs: Any):
        if self._cached:  # fsspec handed back a cached instance: already set up
            return
        # set before super().__init__, which connects
        self.known_hosts = tuple(known_hosts)
        self.global_known_hosts = tuple(global_known_hosts)
        self.proxy_command = proxy_command
        super().__init__(host, **ssh_kwargs)

    def _connect(self) -> None:
        client = paramiko.SSHClient()
        # load_system_host_keys: read-only sets, never written back
        for path in (*self.global_known_hosts, *self.known_hosts):
            if os.path.isfile(path):
                client.load_system_host_keys(path)
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        sock = paramiko.ProxyCommand(self.proxy_command) if self.proxy_command else None
        client.connect(self.host, sock=sock, **self.ssh_kwargs)
        self.client = client
        self.ftp = client.open_sftp()
        timeout = self.ssh_kwargs.get("timeout")
        if timeout:  # a hung server must fail reads, not block the reconciler forever
            self.ftp.get_channel().settimeout(timeout)

    def connected(self) -> bool:
        transport = self.client.get_transport()
        return transport is not None and transport.is_active()


def sftp_filesystem(host: str, *, config_file: str | None = None, known_hosts: str | None = None,
                    identity_file: str | None = None, identity: SshIdentity | None = None, public_errors: bool = False,
                    mask: Callable[[str], str] | None = None, timeout: float = 30) -> CheckedSFTPFileSystem:
    """An fsspec filesystem over sftp to `host` (as for SshCommands: alias, `user@host:port`), host keys checked.

    paramiko does not read ssh_config itself: the alias is resolved here (HostName, Port, User, IdentityFile,
    UserKnownHostsFile, GlobalKnownHostsFile, ProxyCommand, ProxyJump) from `config_file`, else ~/.ssh/config.
    With `identity` there is no ssh_config at all, and no agent or ~/.ssh key: that key and known_hosts only.
    `public_errors`: a failure to connect raises ObservationError naming only the host (see SshCommands).
    Instances are cached by fsspec per (arguments, thread); one whose connection died is reconnected here.
    """
    if identity is not None and (config_file or known_hosts or identity_file):
        raise ValueError("an ssh identity from Secrets excludes config_file, known_hosts and identity_file")
    user, hostname, port = parse_host(host)
    try:
        if identity is not None:
            fs = CheckedSFTPFileSystem(
                hostname, known_hosts=[identity.known_hosts_file], port=port or 22, timeout=timeout,
                banner_timeout=timeout, auth_timeout=timeout, key_filename=[identity.key_file], look_for_keys=False,
                allow_agent=False, **({"username": user} if user else {}))
        else:
            fs = _configured_sftp(host, config_file, known_hosts, identity_file, timeout)
        if not fs.connected():
            fs._connect()
        return fs
    except Exception as exc:
        if not public_errors:
            raise
        subject = f"sftp to {endpoint(hostname, port, identity is not None)}"
        message = public_failure(subject, type(exc).__name__, f"{type(exc).__name__}: {exc}", log_mask(identity, mask))
        raise ObservationError(message) from None


def _configured_sftp(host: str, config_file: str | None, known_hosts: str | None, identity_file: str | None,
                     timeout: float) -> CheckedSFTPFileSystem:
    user, alias, port = parse_host(host)
    config_path = Path(config_file or "~/.ssh/config").expanduser()
    cfg = paramiko.SSHConfig.from_path(str(config_path)).lookup(alias) if config_path.is_file() else {}
    hostname = cfg.get("hostname", alias)
    port = port or int(cfg.get("port", 22))
    kwargs: dict[str, Any] = {"port": port, "timeout": timeout, "banner_timeout": timeout, "auth_timeout": timeout}
    if user or cfg.get("user"):
        kwargs["username"] = user or cfg["user"]
    keys = [identity_file] if identity_file else [os.path.expanduser(k) for k in cfg.get("identityfile", [])]
    if keys:
        kwargs["key_filename"] = keys
        kwargs["look_for_keys"] = False
    user_files = [known_hosts] if known_hosts else _split_paths(cfg.get("userknownhostsfile"),
                                                                "~/.ssh/known_hosts ~/.ssh/known_hosts2")
    global_files = _split_paths(cfg.get("globalknownhostsfile"), "/etc/ssh/ssh_known_hosts /etc/ssh/ssh_known_hosts2")
    proxy = cfg.get("proxycommand")
    if not proxy and cfg.get("proxyjump", "none").lower() != "none":
        # OpenSSH makes the hops (checking their keys); paramiko talks to the target through its stdio
        *via, last = cfg["proxyjump"].split(",")
        target = f"[{hostname}]:{port}" if ":" in hostname else f"{hostname}:{port}"
        proxy = shlex.join(["ssh", *(["-F", str(config_path)] if config_file else []), "-o", "BatchMode=yes",
                            "-o", "StrictHostKeyChecking=yes", *(["-J", ",".join(via)] if via else []),
                            "-W", target, f"ssh://{last}"])
    return CheckedSFTPFileSystem(hostname, known_hosts=user_files, global_known_hosts=global_files,
                                 proxy_command=proxy if proxy and proxy.lower() != "none" else None, **kwargs)


def _split_paths(value: str | None, default: str) -> list[str]:
    return [os.path.expanduser(p) for p in (value or default).split()]
