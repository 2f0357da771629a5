"""Bench: run dirs on a login node read by the run-dir probe, at added network latency, beside the same fleet read
locally. Prints figures; asserts nothing (issue 19).

The login node is the lab sshd (scripts/sshd-up.sh) on this machine. Latency is added by an ssh ProxyCommand
(`bench/delay_proxy.py`) that holds every byte RTT/2 each way: no network namespace or `tc` needed, and the
ssh connection itself is the one the reconciler makes. The fleet: N finished run dirs × 100 trials plus 10
running ones (built once under --root). Each figure is one pass of a fresh reader in this process: "first" with
nothing remembered (no memo, no cache), "warm" the next pass, which tells the probe what it knows.

`--sftp` also times the same passes read over sftp, as before the probe (slow: ~1.1 million requests a pass for
200 dirs), at the first RTT only.

Usage: python bench/remote_pass.py [--dirs 200 1000] [--rtt-ms 0 1 10 50] [--sftp]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ["EVALCTL_CACHE_DIR"] = ""  # figures of a reader's own memo: nothing from earlier processes

from controller.adapters.remote.sftp import sftp_filesystem  # noqa: E402
from controller.adapters.remote.ssh import SshCommands  # noqa: E402
from controller.adapters.rundirs import memo  # noqa: E402
from controller.adapters.rundirs.harbor import HarborRunDirs  # noqa: E402
from controller.adapters.rundirs.remote import RunDirProbe  # noqa: E402
from controller.adapters.scheduler.commands import CommandResult  # noqa: E402
from tests.fixtures.harbor_dirs import REFERENCE_ERRORS, write_synthetic_run_dir, write_trial  # noqa: E402

RUNNING = 10
TRIALS = 100


class Counting:
    def __init__(self, commands: SshCommands) -> None:
        self.commands, self.calls, self.bytes = commands, 0, 0

    def run(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, timeout: float,
            stdin: str | None = None) -> CommandResult:
        self.calls += 1
        result = self.commands.run(argv, env=env, timeout=timeout, stdin=stdin)
        self.bytes += len(result.stdout)
        return result


def build(root: Path, dirs: int) -> Path:
    jobs = root / f"fleet-{dirs}" / "jobs"
    stamp = jobs.parent / "built.json"
    if stamp.exists():
        return jobs
    for index in range(dirs):
        write_synthetic_run_dir(jobs / f"ev_org__m{index:04d}-8B__tb__0123456789ab__a1", TRIALS, infra_every=17)
    for index in range(RUNNING):
        run = jobs / f"ev_org__r{index:02d}-8B__tb__0123456789ab__a1"
        write_synthetic_run_dir(run, TRIALS // 2, n_total=TRIALS, finished=False)
        write_trial(run, "late__xxxxxxx", result=False)
    stamp.write_text(json.dumps({"dirs": dirs}))
    return jobs


def ssh_config(lab: Path, rtt_ms: float, into: Path) -> str:
    config = (lab / "ssh_config").read_text()
    if rtt_ms:
        config = config.replace("Host evalrun-login\n", "Host evalrun-login\n  ProxyCommand "
                                f"{sys.executable} {REPO / 'bench' / 'delay_proxy.py'} 127.0.0.1 2222 "
                                f"{rtt_ms / 2000:g}\n")
    path = into / f"ssh_config-{rtt_ms:g}"
    path.write_text(config)
    return str(path)


def timed_pass(reader: HarborRunDirs) -> tuple[float, int]:
    started = time.perf_counter()
    facts = reader.observe()
    return time.perf_counter() - started, len(facts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path("/tmp/evalrun-remote-bench"))
    parser.add_argument("--dirs", type=int, nargs="+", default=[200, 1000])
    parser.add_argument("--rtt-ms", type=float, nargs="+", default=[0, 1, 10, 50])
    parser.add_argument("--sftp", action="store_true")
    args = parser.parse_args()
    lab = Path(subprocess.run(["bash", str(REPO / "scripts" / "sshd-up.sh")], check=True, capture_output=True,
                              text=True).stdout.strip().splitlines()[-1])
    scratch = Path(tempfile.mkdtemp(prefix="evalrun-remote-bench-"))
    for dirs in args.dirs:
        jobs = build(args.root, dirs)
        memo._MEMOS.clear()
        local_first, count = timed_pass(HarborRunDirs(str(jobs), REFERENCE_ERRORS))
        local_warm, _ = timed_pass(HarborRunDirs(str(jobs), REFERENCE_ERRORS))
        print(f"{dirs} finished dirs × {TRIALS} trials + {RUNNING} running ({count} dirs): local first pass "
              f"{local_first:.2f} s, warm {local_warm * 1000:.0f} ms")
        for rtt in args.rtt_ms:
            commands = SshCommands("evalrun-login", config_file=ssh_config(lab, rtt, scratch),
                                   control_dir=tempfile.mkdtemp(prefix="cm-", dir="/tmp"))
            started = time.perf_counter()
            commands.run(["true"], timeout=60)  # the master connection, made once a process (not a pass)
            connect = time.perf_counter() - started
            started = time.perf_counter()
            commands.run(["true"], timeout=60)
            call = time.perf_counter() - started
            counting = Counting(commands)
            probe = RunDirProbe(counting, "evalrun-login")
            memo._MEMOS.clear()
            first, _ = timed_pass(HarborRunDirs(str(jobs), REFERENCE_ERRORS, probe=probe))
            first_calls, first_bytes = counting.calls, counting.bytes
            counting.calls = counting.bytes = 0
            warm, _ = timed_pass(HarborRunDirs(str(jobs), REFERENCE_ERRORS, probe=probe))
            commands.close()
            if args.sftp and rtt == args.rtt_ms[0]:
                sftp = functools.partial(sftp_filesystem, "evalrun-login", config_file=ssh_config(lab, rtt, scratch))
                memo._MEMOS.clear()
                sftp_first, _ = timed_pass(HarborRunDirs(str(jobs), REFERENCE_ERRORS, fs=sftp))
                sftp_warm, _ = timed_pass(HarborRunDirs(str(jobs), REFERENCE_ERRORS, fs=sftp))
                print(f"  sftp at {rtt:g} ms RTT (before the probe): first pass {sftp_first:.1f} s, warm {sftp_warm:.1f} s")
            budget = local_first + first_calls * call
            print(f"  probe at {rtt:g} ms RTT (a command over the master: {call * 1000:.0f} ms; connecting: "
                  f"{connect:.2f} s): first pass {first:.2f} s in {first_calls} calls ({first_bytes / 2**20:.1f} MiB), "
                  f"{first / budget:.2f} × (local first + one call each); warm pass {warm:.3f} s in "
                  f"{counting.calls} calls ({counting.bytes / 1024:.0f} KiB)")


if __name__ == "__main__":
    main()
