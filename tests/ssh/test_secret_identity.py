"""An ssh identity from Secrets (a namespaced EvalCluster under the operator): that key and known_hosts only,
against the real lab sshd; and the public-errors mode, where ssh's and paramiko's own text never reaches a message.

The key is generated here and authorised for the lab sshd's user for this module only. What the operator itself
holds is played by a hostile environment: $HOME with an authorised key and an ssh_config that would act if read,
and an ssh-agent holding an authorised key.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import signal
import stat
import subprocess
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paramiko
import pytest

from controller.adapters.remote.sftp import sftp_filesystem
from controller.adapters.remote.ssh import (
    SshCommands,
    SshIdentity,
    materialize_identity,
    materialize_known_hosts,
)
from controller.adapters.scheduler.commands import CommandFailed
from controller.adapters.secrets import SecretMask
from controller.api.fields import SecretRef
from controller.api.loader import LoadedCluster, load_specs
from controller.core.ports import ObservationError
from controller.core.types import ClusterRef
from controller.entry.wiring import run_dirs_fs, scheduler_for
from tests.ssh.conftest import SshLab
from tests.ssh.test_ssh import OTHER_KEY

PUBLIC = "see the operator's log"


@dataclass(frozen=True)
class Keys:
    authorised: str  # private key text, its public half in the lab's authorized_keys for this module
    unauthorised: str


def _keygen(where: Path, name: str) -> Path:
    path = where / name
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"evalrun-{name}", "-f", str(path)],
                   check=True, capture_output=True, stdin=subprocess.DEVNULL, timeout=30)
    return path


@pytest.fixture(scope="module")
def keys(ssh_lab: SshLab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Keys]:
    """Two fresh key pairs; the first is authorised while the module runs. sshd-up.sh rewrites authorized_keys
    under `$SSH_LAB.lock`, so that lock is held meanwhile: another session's sshd-up waits instead of dropping it."""
    where = tmp_path_factory.mktemp("keys")
    good, bad = _keygen(where, "tenant"), _keygen(where, "stranger")
    authorized = ssh_lab.dir / "authorized_keys"
    line = (good.with_suffix(".pub")).read_text().strip()
    with open(f"{ssh_lab.dir}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        before = authorized.read_text()
        authorized.write_text(before.rstrip("\n") + "\n" + line + "\n")
        try:
            yield Keys(authorised=good.read_text(), unauthorised=bad.read_text())
        finally:
            kept = [entry for entry in authorized.read_text().splitlines() if entry.strip() != line]
            authorized.write_text("\n".join(kept) + "\n")


@pytest.fixture
def base_dir() -> Iterator[str]:
    """Where identities and ControlMaster sockets go: a short path (AF_UNIX), removed after."""
    path = tempfile.mkdtemp(prefix="evalrun-id-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@dataclass(frozen=True)
class Hostile:
    """What the operator's own environment holds: it must never be what lets a tenant's cluster in."""

    home: Path
    canary: Path  # touched by the ProxyCommand of $HOME/.ssh/config, if anything reads it


@pytest.fixture
def hostile(ssh_lab: SshLab, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Hostile]:
    """$HOME/.ssh with the lab's authorised key and a config whose ProxyCommand leaves a canary; SSH_AUTH_SOCK
    an ssh-agent holding the lab's authorised key. (OpenSSH takes ~ from the passwd entry, not $HOME: for ssh
    that part is shown by the effective config instead; paramiko does read $HOME.)"""
    home, canary = tmp_path / "home", tmp_path / "canary"
    (home / ".ssh").mkdir(parents=True, mode=0o700)
    shutil.copy(ssh_lab.identity_file, home / ".ssh" / "id_ed25519")
    (home / ".ssh" / "config").write_text(f"Host *\n  ProxyCommand sh -c 'touch {canary}; exit 1'\n")
    monkeypatch.setenv("HOME", str(home))
    sock_dir = tempfile.mkdtemp(prefix="evalrun-agent-")
    started = subprocess.run(["ssh-agent", "-s", "-a", f"{sock_dir}/agent"], capture_output=True, text=True,
                             stdin=subprocess.DEVNULL, timeout=30, check=True).stdout
    pid = int(started.split("SSH_AGENT_PID=")[1].split(";")[0])
    try:
        monkeypatch.setenv("SSH_AUTH_SOCK", f"{sock_dir}/agent")
        subprocess.run(["ssh-add", "-q", ssh_lab.identity_file], capture_output=True, stdin=subprocess.DEVNULL,
                       timeout=30, check=True)
        yield Hostile(home=home, canary=canary)
    finally:
        os.kill(pid, signal.SIGTERM)
        shutil.rmtree(sock_dir, ignore_errors=True)


@pytest.fixture
def make_runner(ssh_lab: SshLab, base_dir: str) -> Iterator[Callable[..., SshCommands]]:
    """SshCommands to the lab sshd by user@host:port (no alias: an identity has no ssh_config); closed after."""
    made: list[SshCommands] = []

    def make(identity: SshIdentity | None = None, **kwargs: Any) -> SshCommands:
        runner = SshCommands(f"root@127.0.0.1:{ssh_lab.port}", identity=identity, control_dir=base_dir, **kwargs)
        made.append(runner)
        return runner

    yield make
    for runner in made:
        runner.close()


def _identity(lab: SshLab, key: str, base_dir: str, known_hosts: str | None = None) -> SshIdentity:
    return materialize_identity(key, Path(lab.known_hosts).read_text() if known_hosts is None else known_hosts,
                                base_dir=base_dir)


def _effective(runner: SshCommands) -> dict[str, list[str]]:
    """`ssh -G`: the configuration ssh would really use, every config file and option applied."""
    out = subprocess.run([*runner._ssh, "-G", "--", runner.hostname], capture_output=True, text=True,
                         stdin=subprocess.DEVNULL, timeout=30, check=True).stdout
    found: dict[str, list[str]] = {}
    for line in out.splitlines():
        key, _, value = line.partition(" ")
        found.setdefault(key, []).append(value)
    return found


@pytest.fixture
def ssh_log() -> Iterator[list[logging.LogRecord]]:
    """What evalctl.ssh logs (a handler of its own: configure_logging may have stopped propagation)."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("evalctl.ssh")
    logger.addHandler(handler)
    yield records
    logger.removeHandler(handler)


# ---------------------------------------------------------------------- files


def test_identity_files_are_private_atomic_and_content_addressed(tmp_path: Path) -> None:
    base = str(tmp_path / "ids")
    key = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW\n" \
          "-----END OPENSSH PRIVATE KEY-----"
    known = f"[login.example]:2200 {OTHER_KEY}"
    first = materialize_identity(key, known, base_dir=base)
    assert stat.S_IMODE(os.stat(first.dir).st_mode) == 0o700 and stat.S_IMODE(os.stat(base).st_mode) == 0o700
    files = [first.key_file, first.known_hosts_file, first.config_file]
    assert sorted(os.listdir(first.dir)) == sorted(os.path.basename(f) for f in files)  # no temp file left
    for path in files:
        st = os.lstat(path)
        assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.getuid(), path
    assert Path(first.key_file).read_text() == key + "\n"  # OpenSSH wants the final newline a Secret often lacks
    assert Path(first.known_hosts_file).read_text() == known + "\n"
    assert "BEGIN" not in repr(first) and OTHER_KEY.split()[1] not in repr(first)

    inodes = {path: os.stat(path).st_ino for path in files}
    again = materialize_identity(key.replace("\n", "\r\n") + "\r\n", known + "\n", base_dir=base)
    assert again == first and {path: os.stat(path).st_ino for path in files} == inodes  # same files, untouched
    assert materialize_identity(key, "", base_dir=base).dir != first.dir  # other content, other files

    Path(first.key_file).chmod(0o644)  # someone widened it, or left other bytes: checked, not trusted
    Path(first.known_hosts_file).write_text("tampered\n")
    materialize_identity(key, known, base_dir=base)
    assert stat.S_IMODE(os.stat(first.key_file).st_mode) == 0o600
    assert Path(first.known_hosts_file).read_text() == known + "\n"

    masked = first.mask(f"x {key} y {key.splitlines()[1]} z {OTHER_KEY.split()[1]}")
    assert "PRIVATE KEY" not in masked and "b3Blbn" not in masked and "AAAAC3" not in masked, masked

    only_known = materialize_known_hosts(known, base_dir=base)
    assert Path(only_known).read_text() == known + "\n" and stat.S_IMODE(os.stat(only_known).st_mode) == 0o600

    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    with pytest.raises(CommandFailed, match="not a private directory"):
        materialize_identity(key, known, base_dir=str(shared))


# ---------------------------------------------------------------------- the identity alone


@pytest.mark.parametrize("agent", ["authorised-agent", "garbage-agent"])
def test_secret_key_alone_runs_commands_and_reads_over_sftp(
        ssh_lab: SshLab, keys: Keys, hostile: Hostile, base_dir: str, tmp_path: Path,
        make_runner: Callable[..., SshCommands], monkeypatch: pytest.MonkeyPatch, agent: str) -> None:
    if agent == "garbage-agent":
        monkeypatch.setenv("SSH_AUTH_SOCK", str(tmp_path / "no-such-agent"))
    identity = _identity(ssh_lab, keys.authorised, base_dir)
    runner = make_runner(identity)
    assert runner.run(["id", "-un"], timeout=30).stdout == "root\n"

    config = _effective(runner)  # what ssh uses: our files only
    assert config["identityfile"] == [identity.key_file]
    assert config["userknownhostsfile"] == [identity.known_hosts_file]
    assert config["globalknownhostsfile"] == ["/dev/null"]
    assert config["identityagent"] == ["none"] and config["identitiesonly"] == ["yes"]
    assert "proxycommand" not in config and "proxyjump" not in config
    assert (config["hostname"], config["port"], config["user"]) == (["127.0.0.1"], [str(ssh_lab.port)], ["root"])
    assert "-F" in runner._ssh and runner._ssh[runner._ssh.index("-F") + 1] == identity.config_file

    (tmp_path / "result.json").write_text('{"ok": 1}')
    fs = sftp_filesystem(f"root@127.0.0.1:{ssh_lab.port}", identity=identity)
    assert fs.cat_file(str(tmp_path / "result.json")) == b'{"ok": 1}'
    assert not hostile.canary.exists()  # $HOME/.ssh/config was never read


def test_wrong_secret_key_is_refused_though_the_agent_and_home_hold_an_authorised_one(
        ssh_lab: SshLab, keys: Keys, hostile: Hostile, base_dir: str,
        make_runner: Callable[..., SshCommands]) -> None:
    # control: the agent's key does get in when nothing shuts it out
    assert make_runner(known_hosts=ssh_lab.known_hosts).run(["true"], timeout=30).returncode == 0

    wrong = _identity(ssh_lab, keys.unauthorised, base_dir)
    with pytest.raises(CommandFailed, match="Permission denied"):
        make_runner(wrong).run(["true"], timeout=30)
    with pytest.raises(paramiko.AuthenticationException):
        sftp_filesystem(f"root@127.0.0.1:{ssh_lab.port}", identity=wrong, timeout=10)
    assert not hostile.canary.exists()


@pytest.mark.parametrize("known", ["", f"[127.0.0.1]:{{port}} {OTHER_KEY}\n"], ids=["unknown", "changed"])
def test_host_key_not_in_the_secret_is_refused(ssh_lab: SshLab, keys: Keys, base_dir: str, known: str,
                                               make_runner: Callable[..., SshCommands]) -> None:
    identity = _identity(ssh_lab, keys.authorised, base_dir, known.format(port=ssh_lab.port))
    with pytest.raises(CommandFailed, match="host key") as failed:
        make_runner(identity).run(["true"], timeout=30)
    assert "known_hosts Secret" in str(failed.value)  # the fix goes in the Secret, not in our private file
    with pytest.raises(paramiko.SSHException):
        sftp_filesystem(f"root@127.0.0.1:{ssh_lab.port}", identity=identity, timeout=10)


def test_same_secret_reuses_the_master_connection(ssh_lab: SshLab, keys: Keys, base_dir: str,
                                                  make_runner: Callable[..., SshCommands]) -> None:
    """Each pass builds its runner anew: the same Secret content must find the master the last pass left."""
    first = make_runner(_identity(ssh_lab, keys.authorised, base_dir))
    connection = first.run(["printenv", "SSH_CONNECTION"], timeout=30).stdout
    second = make_runner(_identity(ssh_lab, keys.authorised, base_dir))
    assert second.control_path == first.control_path
    assert second.run(["printenv", "SSH_CONNECTION"], timeout=30).stdout == connection != ""


# ---------------------------------------------------------------------- public errors


def _fingerprint(lab: SshLab) -> str:
    out = subprocess.run(["ssh-keygen", "-lf", str(lab.dir / "ssh_host_ed25519_key.pub")], capture_output=True,
                         text=True, stdin=subprocess.DEVNULL, timeout=30, check=True).stdout
    return out.split()[1]  # SHA256:…


def test_public_errors_carry_no_ssh_text_and_log_it_masked(
        ssh_lab: SshLab, keys: Keys, base_dir: str, make_runner: Callable[..., SshCommands],
        ssh_log: list[logging.LogRecord]) -> None:
    """A changed host key: ssh prints a distinctive warning and the server's fingerprint, paramiko quotes the
    known_hosts key; none of it is in the message, all of it is in the log, masked."""
    changed = f"[127.0.0.1]:{ssh_lab.port} {OTHER_KEY}\n"
    identity = _identity(ssh_lab, keys.authorised, base_dir, changed)
    fingerprint = _fingerprint(ssh_lab)

    with pytest.raises(CommandFailed) as failed:
        make_runner(identity, public_errors=True, mask=SecretMask(values=[fingerprint])).run(["true"], timeout=30)
    assert str(failed.value) == (f"ssh to 127.0.0.1:{ssh_lab.port} failed (exit 255, host key unknown or changed); "
                                 f"{PUBLIC}")
    [logged] = ssh_log
    detail = logged.__dict__["detail"]
    assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in detail and "***" in detail, detail
    assert fingerprint not in detail and keys.authorised.splitlines()[1] not in detail

    with pytest.raises(ObservationError) as refused:
        sftp_filesystem(f"root@127.0.0.1:{ssh_lab.port}", identity=identity, public_errors=True, timeout=10)
    assert str(refused.value) == (f"sftp to 127.0.0.1:{ssh_lab.port} failed (BadHostKeyException, host key unknown "
                                  f"or changed); {PUBLIC}")
    assert refused.value.__cause__ is None and refused.value.__suppress_context__
    detail = ssh_log[-1].__dict__["detail"]
    assert "does not match" in detail and OTHER_KEY.split()[1] not in detail and "***" in detail, detail

    for message in (str(failed.value), str(refused.value)):
        assert "IDENTIFICATION" not in message and fingerprint not in message and identity.dir not in message


def test_public_errors_never_quote_the_file_ssh_was_pointed_at(
        ssh_lab: SshLab, tmp_path: Path, make_runner: Callable[..., SshCommands],
        ssh_log: list[logging.LogRecord]) -> None:
    """The incident: sshConfig pointing at a service-account token, which ssh and paramiko quote back."""
    token = f"eyJhbGciOiJSUzI1NiJ9.{uuid.uuid4().hex}"
    token_file = tmp_path / "token"
    token_file.write_text(token)
    host = f"root@127.0.0.1:{ssh_lab.port}"

    with pytest.raises(CommandFailed) as quoted:  # control: the plain mode shows ssh's text, the token in it
        make_runner(config_file=str(token_file)).run(["true"], timeout=30)
    assert token.lower() in str(quoted.value).lower()
    with pytest.raises(CommandFailed) as public:
        make_runner(config_file=str(token_file), public_errors=True).run(["true"], timeout=30)
    assert token.lower() not in str(public.value).lower() and PUBLIC in str(public.value)

    with pytest.raises(Exception, match="Unparsable") as unparsable:
        sftp_filesystem(host, config_file=str(token_file))
    assert token in str(unparsable.value)
    with pytest.raises(ObservationError) as hidden:
        sftp_filesystem(host, config_file=str(token_file), public_errors=True)
    assert token not in str(hidden.value) and PUBLIC in str(hidden.value)
    assert len(ssh_log) == 2  # the detail went to the operator's log instead


# ---------------------------------------------------------------------- wiring


class DictSecrets:
    """A SecretSource over a dict, speaking like KubernetesSecrets."""

    def __init__(self, values: dict[tuple[str, str], str]) -> None:
        self.values = values

    def get(self, ref: SecretRef) -> str | None:
        return self.values.get((ref.name, ref.key))

    def where(self, ref: SecretRef) -> str:
        return f"add key {ref.key!r} to Secret tenant-a/{ref.name}"


def _cluster(lab: SshLab, tmp_path: Path) -> LoadedCluster:
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"""
apiVersion: evalrun.io/v1alpha1
kind: EvalCluster
metadata: {{name: tenant}}
spec:
  scheduler:
    type: slurm
    ssh: "root@127.0.0.1:{lab.port}"
    sshKeySecretRef: {{name: login, key: id_ed25519}}
    knownHostsSecretRef: {{name: login, key: known_hosts}}
  jobsDir: {tmp_path}/jobs
  logsDir: {tmp_path}/logs
  jobScript: /bin/true
  timeLimit: "60"
---
apiVersion: evalrun.io/v1alpha1
kind: EvalRun
metadata: {{name: nightly}}
spec: {{cluster: tenant, models: [org/m1-8B], datasets: [DCAgent/tiny]}}
""")
    return load_specs([spec]).clusters[ClusterRef(name="tenant")]


@pytest.fixture
def runtime_dir(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """$XDG_RUNTIME_DIR for what the wiring writes by default (identity files, sockets): short, removed after."""
    path = tempfile.mkdtemp(prefix="evalrun-xdg-")
    monkeypatch.setenv("XDG_RUNTIME_DIR", path)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_wiring_reaches_the_login_node_with_the_secret_identity(
        ssh_lab: SshLab, keys: Keys, hostile: Hostile, runtime_dir: str, tmp_path: Path) -> None:
    cluster = _cluster(ssh_lab, tmp_path)
    secrets = DictSecrets({("login", "id_ed25519"): keys.authorised,
                           ("login", "known_hosts"): Path(ssh_lab.known_hosts).read_text()})
    scheduler = scheduler_for(cluster, str(tmp_path / "logs"), SecretMask(), secrets)
    try:
        assert scheduler.user == "root"  # type: ignore[attr-defined]  # `id -un`, over ssh with the Secret's key
        assert scheduler.commands.identity.dir.startswith(runtime_dir)  # type: ignore[attr-defined]
    finally:
        scheduler.commands.close()  # type: ignore[attr-defined]
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "marker").write_text("over sftp")
    fs = run_dirs_fs(cluster, str(tmp_path / "jobs"), secrets)
    assert fs is not None and fs().cat_file(str(tmp_path / "jobs" / "marker")) == b"over sftp"
    assert not hostile.canary.exists()


def test_wiring_missing_secret_makes_observation_fail_naming_it(ssh_lab: SshLab, runtime_dir: str,
                                                                 tmp_path: Path) -> None:
    cluster = _cluster(ssh_lab, tmp_path)
    scheduler = scheduler_for(cluster, str(tmp_path / "logs"), SecretMask(), DictSecrets({}))
    with pytest.raises(ObservationError, match=r"sshKeySecretRef: add key 'id_ed25519' to Secret tenant-a/login"):
        scheduler.observe()
    fs = run_dirs_fs(cluster, str(tmp_path / "jobs"), DictSecrets({}))
    assert fs is not None
    with pytest.raises(ObservationError, match="Secret tenant-a/login"):
        fs()


def test_wiring_public_errors_reach_the_adapters(ssh_lab: SshLab, keys: Keys, runtime_dir: str, tmp_path: Path,
                                                 ssh_log: list[logging.LogRecord]) -> None:
    cluster = _cluster(ssh_lab, tmp_path)
    secrets = DictSecrets({("login", "id_ed25519"): keys.authorised,
                           ("login", "known_hosts"): f"[127.0.0.1]:{ssh_lab.port} {OTHER_KEY}\n"})
    scheduler = scheduler_for(cluster, str(tmp_path / "logs"), SecretMask(), secrets, public_errors=True)
    with pytest.raises(ObservationError) as failed:
        scheduler.observe()
    assert PUBLIC in str(failed.value) and "IDENTIFICATION" not in str(failed.value)
    fs = run_dirs_fs(cluster, str(tmp_path / "jobs"), secrets, public_errors=True)
    assert fs is not None
    with pytest.raises(ObservationError, match=PUBLIC):
        fs()
    assert ssh_log, "the detail is logged"
