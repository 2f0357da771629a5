"""Bench: reading 500 running jobs' output per pass, through both schedulers' `read_output`.

Usage: python bench/output_reading.py [--root DIR] [--jobs 500] [--growth 4096] [--passes 7]
Writes one output file per job (vLLM-like access lines, a secret now and then) and, for the local scheduler,
each job's job.json naming it. Then, for SlurmScheduler through LocalCommands (the ONE shell command per pass a
login node runs, here on this host) and for LocalScheduler, measures passes of:
- steady: every file grew by `--growth` bytes since the last pass (appended outside the timing);
- idle: nothing new anywhere (the cost of asking);
- backlog: every file a megabyte behind its cursor, so each read fills OUTPUT_READ_CAP (catching up).
Prints bytes read per pass and ms per pass (median, min, max over `--passes`); asserts nothing about time.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from controller.adapters.scheduler.commands import LocalCommands  # noqa: E402
from controller.adapters.scheduler.local import LocalJob, LocalScheduler  # noqa: E402
from controller.adapters.scheduler.slurm import SlurmOptions, SlurmScheduler  # noqa: E402
from controller.adapters.secrets import SecretMask  # noqa: E402
from controller.core.observed import JobOutput  # noqa: E402
from controller.core.ports import OUTPUT_READ_CAP, OutputCursor  # noqa: E402

SECRETS = ["tok-bench-0a1b2c3d4e", "hf_benchbenchbench0123", "sk-bench-9f8e7d6c"]
LINE = b'INFO:     127.0.0.1:53312 - "POST /v1/chat/completions HTTP/1.1" 200 OK\n'
SECRET_LINE = f"pinggy: authenticated with {SECRETS[0]}\n".encode()

Reader = Callable[[Sequence[OutputCursor]], tuple[JobOutput, ...]]


def lines(size: int) -> bytes:
    """About `size` bytes of whole log lines, one in 20 holding a secret."""
    block = LINE * 19 + SECRET_LINE
    return (block * (size // len(block) + 1))[:size].rsplit(b"\n", 1)[0] + b"\n"


def build(root: Path, jobs: int) -> tuple[Path, Path, list[OutputCursor]]:
    if root.exists():
        shutil.rmtree(root)
    logs, state = root / "logs", root / "state"
    logs.mkdir(parents=True)
    cursors = []
    for i in range(jobs):
        job_id, name = str(1000 + i), f"ev_bench_{i:04d}"
        output = logs / f"{name}_{job_id}.out"  # SlurmScheduler.output_path, and what job.json names
        output.write_bytes(lines(8192))
        job_dir = state / "jobs" / job_id
        job_dir.mkdir(parents=True)
        (job_dir / "job.json").write_text(LocalJob(
            job_id=job_id, name=name, comment="bench", script="/bin/true", args=(), output=str(output),
            time_limit_s=3600, submitted_at=datetime.now(UTC)).model_dump_json())
        cursors.append(OutputCursor(job_id=job_id, name=name))
    return logs, state, cursors


def grow(logs: Path, cursors: Sequence[OutputCursor], size: int) -> None:
    chunk = lines(size)
    for cursor in cursors:
        with open(logs / f"{cursor.name}_{cursor.job_id}.out", "ab") as f:
            f.write(chunk)


def at_end(logs: Path, cursors: Sequence[OutputCursor]) -> list[OutputCursor]:
    return [c.model_copy(update={"offset": (logs / f"{c.name}_{c.job_id}.out").stat().st_size}) for c in cursors]


def timed(read: Reader, cursors: Sequence[OutputCursor]) -> tuple[float, int, list[OutputCursor]]:
    """(ms, bytes read, the cursors moved to where this read ended) of one pass."""
    started = time.perf_counter()
    outputs = read(cursors)
    ms = (time.perf_counter() - started) * 1000
    ends = {out.job_id: out.end for out in outputs}
    return ms, sum(out.end - out.offset for out in outputs), [
        c.model_copy(update={"offset": ends.get(c.job_id, c.offset)}) for c in cursors]


def report(backend: str, scenario: str, runs: list[tuple[float, int]]) -> None:
    ms = [m for m, _ in runs]
    read = statistics.median(b for _, b in runs)
    print(f"{backend:<34} {scenario:<8} {read / 1024:>10.0f} KiB/pass  median {statistics.median(ms):8.1f} ms  "
          f"(min {min(ms):.1f}, max {max(ms):.1f})  {read / 1024 / 1024 / (statistics.median(ms) / 1000):7.1f} MiB/s")


def bench(backend: str, read: Reader, logs: Path, base: list[OutputCursor], growth: int, passes: int) -> None:
    cursors = at_end(logs, base)
    steady = []
    for _ in range(passes):
        grow(logs, cursors, growth)
        ms, read_bytes, cursors = timed(read, cursors)
        steady.append((ms, read_bytes))
    report(backend, "steady", steady)
    idle = []
    for _ in range(passes):
        ms, read_bytes, cursors = timed(read, cursors)
        idle.append((ms, read_bytes))
    report(backend, "idle", idle)
    grow(logs, cursors, 1 << 20)
    behind = cursors
    backlog = []
    for _ in range(max(passes // 2, 1)):  # each pass reads the same cap's worth again, from the same cursors
        ms, read_bytes, _moved = timed(read, behind)
        backlog.append((ms, read_bytes))
    report(backend, "backlog", backlog)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path("/tmp/evalrun-bench-output"))
    parser.add_argument("--jobs", type=int, default=500)
    parser.add_argument("--growth", type=int, default=4096, help="bytes each job prints between passes")
    parser.add_argument("--passes", type=int, default=7)
    args = parser.parse_args()
    logs, state, cursors = build(args.root, args.jobs)
    mask = SecretMask(SECRETS)
    slurm = SlurmScheduler(LocalCommands(), SlurmOptions(command_timeout_s=300), logs_dir=str(logs), user="bench",
                           mask=mask)
    local = LocalScheduler(state, mask=mask)
    print(f"{args.jobs} running jobs' output files, +{args.growth} B each between steady passes, "
          f"cap {OUTPUT_READ_CAP >> 10} KiB per job and pass; {args.passes} passes")
    try:
        bench("SlurmScheduler (1 sh, LocalCommands)", slurm.read_output, logs, cursors, args.growth, args.passes)
        bench("LocalScheduler", local.read_output, logs, cursors, args.growth, args.passes)
    finally:
        shutil.rmtree(args.root, ignore_errors=True)


if __name__ == "__main__":
    main()
