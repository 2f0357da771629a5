"""Process identity on this host: a pid plus its /proc start time, so a reused pid is not mistaken."""

from __future__ import annotations

import os
import socket
from pathlib import Path


def proc_start_ticks(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] == "Z":  # a zombie has exited; its parent has not reaped it yet
        return None
    return fields[19]


def process_identity() -> str:
    """`host:pid:start` of this process, e.g. as a lease holder."""
    return f"{socket.gethostname()}:{os.getpid()}:{proc_start_ticks(os.getpid())}"


def identity_is_dead(identity: str) -> bool:
    """True only when `identity` is a process on THIS host that no longer exists; elsewhere we cannot know."""
    host, _, rest = identity.partition(":")
    pid, _, ticks = rest.partition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    return proc_start_ticks(int(pid)) != ticks
