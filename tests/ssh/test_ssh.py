"""SshCommands and sftp_filesystem against a real sshd on localhost (scripts/sshd-up.sh).

The "login node" is this machine, so files written here are what sftp must read back, and /proc shows every
process on both ends of the connection: the local ssh client and master, sshd, and the remote shells.
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import paramiko
import pytest

from controller.adapters.remote.sftp import sftp_filesystem
from controller.adapters.remote.ssh import (
    DROP_CONTRACT,
    DROP_SECRETS,
    SshCommands,
    parse_host,
    remote_script,
)
from controller.adapters.scheduler.commands import AnswerTooLarge, CommandFailed
from tests.ssh.conftest import SshLab

# some other ed25519 key: the "changed host key" case
OTHER_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"


@pytest.fixture
def make_runner(ssh_lab: SshLab, control_dir: str) -> Iterator[Callable[..., SshCommands]]:
    """SshCommands factory (defaults: the lab alias and its ssh_config); every runner's master is closed after."""
    made: list[SshCommands] = []

    def make(host: str = ssh_lab.alias, **kwargs: Any) -> SshCommands:
        kwargs.setdefault("config_file", ssh_lab.config_file)
        runner = SshCommands(host, control_dir=control_dir, **kwargs)
        made.append(runner)
        return runner

    yield make
    for runner in made:
        runner.close()


@pytest.fixture
def runner(make_runner: Callable[..., SshCommands]) -> SshCommands:
    return make_runner()


def _master_alive(lab: SshLab, runner: SshCommands) -> bool:
    return subprocess.run(
        ["ssh", "-F", lab.config_file, "-o", f"ControlPath={runner.control_path}", "-O", "check", lab.alias],
        capture_output=True, stdin=subprocess.DEVNULL, timeout=10, check=False,
    ).returncode == 0


# ---------------------------------------------------------------------- commands


def test_remote_stdout_and_exit_codes(runner: SshCommands) -> None:
    ok = runner.run(["echo", "hello world"], timeout=30)
    assert (ok.returncode, ok.stdout, ok.stderr) == (0, "hello world\n", "")
    failed = runner.run(["sh", "-c", "echo out; echo err >&2; exit 7"], timeout=30)
    assert (failed.returncode, failed.stdout, failed.stderr) == (7, "out\n", "err\n")
    # argv reaches the remote command word for word: no remote shell expansion or splitting
    args = ["a b", "$HOME", "'q'", '"dq"', "`id`", "*", "x;y"]
    echoed = runner.run(["printf", "%s|", *args], timeout=30)
    assert echoed.stdout == "".join(f"{a}|" for a in args)


def test_remote_path_has_usr_bin(runner: SshCommands) -> None:
    assert "/usr/bin" in runner.run(["printenv", "PATH"], timeout=30).stdout.strip().split(":")


def test_env_secret_reaches_remote_but_no_argv_and_no_file(
        ssh_lab: SshLab, runner: SshCommands, control_dir: str) -> None:
    secret = f"s3cr3t-{uuid.uuid4().hex}"
    # while this runs, grep every process's argv on the machine (= both ends of the ssh connection) for the
    # secret; the pattern comes from the environment over stdin, so grep's own argv does not hold it
    probe = "printenv EVALRUN_SECRET; printenv EVALRUN_SECRET | grep -lF -f - /proc/[0-9]*/cmdline 2>/dev/null | wc -l"
    result = runner.run(["sh", "-c", probe], env={"EVALRUN_SECRET": secret}, timeout=30)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [secret, "0"]
    # control: the probe does see a secret that IS in an argv (here sh's $1)
    leaked = runner.run(["sh", "-c", probe, "sh", secret], env={"EVALRUN_SECRET": secret}, timeout=30)
    assert int(leaked.stdout.split()[-1]) >= 1
    for root in (ssh_lab.dir, Path(control_dir)):
        for path in root.rglob("*"):
            if path.is_file() and not path.is_symlink():
                assert secret.encode() not in path.read_bytes(), f"secret written to {path}"


def test_env_values_arrive_verbatim_and_names_are_checked(runner: SshCommands, tmp_path: Path) -> None:
    canary = tmp_path / "injected"
    tricky = f"a'b\"c $(touch {canary}) `touch {canary}` ; touch {canary}\nline2 \\ é"
    result = runner.run(["printenv", "TRICKY"], env={"TRICKY": tricky, "EMPTY": ""}, timeout=30)
    assert result.stdout == tricky + "\n"
    assert not canary.exists()
    with pytest.raises(ValueError, match="invalid environment variable name"):
        runner.run(["true"], env={"BAD-NAME; touch x": "1"}, timeout=30)


def test_one_master_connection_is_reused_until_close(ssh_lab: SshLab, runner: SshCommands) -> None:
    first = runner.run(["printenv", "SSH_CONNECTION"], timeout=30).stdout
    assert _master_alive(ssh_lab, runner)
    second = runner.run(["printenv", "SSH_CONNECTION"], timeout=30).stdout
    assert first == second != ""  # same client port: the same TCP connection
    runner.close()
    assert not _master_alive(ssh_lab, runner)
    assert runner.run(["printenv", "SSH_CONNECTION"], timeout=30).stdout != first  # a new connection


def test_timeout_raises_and_runner_stays_usable(runner: SshCommands) -> None:
    runner.run(["true"], timeout=30)  # connect first: the 1 s below is the command's alone
    with pytest.raises(CommandFailed, match="did not answer within 1 s"):
        runner.run(["sleep", "5"], timeout=1)
    assert runner.run(["echo", "still here"], timeout=30).stdout == "still here\n"


def test_dead_host_raises(ssh_lab: SshLab, make_runner: Callable[..., SshCommands]) -> None:
    dead = make_runner("root@127.0.0.1:2299", config_file=None, known_hosts=ssh_lab.known_hosts,
                       identity_file=ssh_lab.identity_file, connect_timeout=5)
    with pytest.raises(CommandFailed, match=r"(?i)connection refused"):
        dead.run(["echo", "hi"], timeout=30)


def test_plain_user_host_port_without_config(ssh_lab: SshLab, make_runner: Callable[..., SshCommands]) -> None:
    direct = make_runner(f"root@127.0.0.1:{ssh_lab.port}", config_file=None, known_hosts=ssh_lab.known_hosts,
                         identity_file=ssh_lab.identity_file)
    assert direct.run(["id", "-un"], timeout=30).stdout == "root\n"


@pytest.mark.parametrize("known", ["", f"[127.0.0.1]:{{port}} {OTHER_KEY}\n"], ids=["unknown", "changed"])
@pytest.mark.parametrize("options", [(), ("-o", "StrictHostKeyChecking=no")], ids=["default", "relax-attempt"])
def test_bad_host_key_is_refused(ssh_lab: SshLab, make_runner: Callable[..., SshCommands], tmp_path: Path,
                                 known: str, options: tuple[str, ...]) -> None:
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(known.format(port=ssh_lab.port))
    runner = make_runner(known_hosts=str(known_hosts), options=options)
    with pytest.raises(CommandFailed, match="host key") as failed:
        runner.run(["echo", "hi"], timeout=30)
    assert "known_hosts" in str(failed.value) and "ssh-keyscan" in str(failed.value)


def test_parse_host() -> None:
    assert parse_host("login") == (None, "login", None)
    assert parse_host("alice@login.hpc.example:2200") == ("alice", "login.hpc.example", 2200)
    assert parse_host("bob@[::1]:22") == ("bob", "::1", 22)
    for bad in ("-oProxyCommand=touch /tmp/x", "a b", "", "host:port"):
        with pytest.raises(ValueError):
            parse_host(bad)
    assert remote_script(["echo", "a b"], {"X": "1 2"}) == \
        f"{DROP_SECRETS}{DROP_CONTRACT}export X='1 2'\nexec echo 'a b'\n"


# ---------------------------------------------------------------------- sftp


def test_sftp_reads_local_files(ssh_lab: SshLab, tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "trial-1").mkdir(parents=True)
    (run / "config.json").write_text('{"a": 1}')
    (run / "trial-1" / "result.json").write_bytes(b"\x00binary\xff")
    fs = sftp_filesystem(ssh_lab.alias, config_file=ssh_lab.config_file)
    assert fs.cat_file(str(run / "config.json")) == b'{"a": 1}'
    assert fs.cat(str(run / "trial-1" / "result.json")) == b"\x00binary\xff"
    assert fs.cat_file(f"sftp://{ssh_lab.alias}{run}/config.json") == b'{"a": 1}'  # URL-style path
    assert fs.ls(str(run)) == [str(run / "config.json"), str(run / "trial-1")]
    assert fs.info(str(run / "trial-1"))["type"] == "directory"
    assert fs.info(str(run / "config.json"))["size"] == 8
    assert fs.find(str(run)) == [str(run / "config.json"), str(run / "trial-1" / "result.json")]
    with pytest.raises(FileNotFoundError):
        fs.cat_file(str(run / "missing"))


def test_sftp_instance_is_cached_and_reconnects(ssh_lab: SshLab, tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    fs = sftp_filesystem(ssh_lab.alias, config_file=ssh_lab.config_file)
    assert sftp_filesystem(ssh_lab.alias, config_file=ssh_lab.config_file) is fs
    fs.client.close()  # the connection dies (sshd restart, idle timeout)
    again = sftp_filesystem(ssh_lab.alias, config_file=ssh_lab.config_file)
    assert again.cat_file(str(tmp_path / "f")) == b"x"


def test_sftp_plain_host_with_explicit_files(ssh_lab: SshLab, tmp_path: Path) -> None:
    (tmp_path / "f").write_text("plain")
    fs = sftp_filesystem(f"root@127.0.0.1:{ssh_lab.port}", known_hosts=ssh_lab.known_hosts,
                         identity_file=ssh_lab.identity_file)
    assert fs.cat_file(str(tmp_path / "f")) == b"plain"


@pytest.mark.parametrize("known", ["", f"[127.0.0.1]:{{port}} {OTHER_KEY}\n"], ids=["unknown", "changed"])
def test_sftp_bad_host_key_is_refused(ssh_lab: SshLab, tmp_path: Path, known: str) -> None:
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(known.format(port=ssh_lab.port))
    with pytest.raises(paramiko.SSHException):
        sftp_filesystem(ssh_lab.alias, config_file=ssh_lab.config_file, known_hosts=str(known_hosts))
    good = sftp_filesystem(ssh_lab.alias, config_file=ssh_lab.config_file, known_hosts=ssh_lab.known_hosts)
    assert good.ls(str(ssh_lab.dir))


def test_sftp_dead_host_raises(ssh_lab: SshLab) -> None:
    with pytest.raises(OSError):  # paramiko's NoValidConnectionsError is a socket.error
        sftp_filesystem("root@127.0.0.1:2299", known_hosts=ssh_lab.known_hosts,
                        identity_file=ssh_lab.identity_file, timeout=5)


def test_proxy_jump_is_honoured(ssh_lab: SshLab, make_runner: Callable[..., SshCommands], tmp_path: Path) -> None:
    config = tmp_path / "ssh_config"
    target = (f"  HostName 127.0.0.1\n  Port {ssh_lab.port}\n  User root\n  IdentityFile {ssh_lab.identity_file}\n"
              f"  UserKnownHostsFile {ssh_lab.known_hosts}\n  GlobalKnownHostsFile /dev/null\n")
    config.write_text(Path(ssh_lab.config_file).read_text()
                      + f"Host via-jump\n{target}  ProxyJump {ssh_lab.alias}\n"
                      + f"Host via-dead-jump\n{target}  ProxyJump root@127.0.0.1:2299\n")
    (tmp_path / "f").write_text("jumped")
    assert sftp_filesystem("via-jump", config_file=str(config)).cat_file(str(tmp_path / "f")) == b"jumped"
    jumped = make_runner("via-jump", config_file=str(config))
    assert jumped.run(["cat", str(tmp_path / "f")], timeout=30).stdout == "jumped"
    with pytest.raises((paramiko.SSHException, OSError)):  # proves the jump is used at all
        sftp_filesystem("via-dead-jump", config_file=str(config), timeout=2)
    with pytest.raises(CommandFailed):
        make_runner("via-dead-jump", config_file=str(config)).run(["true"], timeout=30)



def test_an_answer_over_the_cap_kills_the_remote_command_and_fails_the_read(
        make_runner: Callable[..., SshCommands]) -> None:
    runner = make_runner(max_answer=1 << 20)

    with pytest.raises(AnswerTooLarge, match=r"yes on evalrun-login: answer larger than 1 MiB on stdout"):
        runner.run(["yes"], timeout=60)  # endless: only the cap ends it before the timeout
    assert runner.run(["echo", "ok"], timeout=30).stdout == "ok\n"
