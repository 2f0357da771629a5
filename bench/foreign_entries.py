"""Bench: a shared jobs dir full of other people's entries costs a pass what its own run dirs cost (issue 18).

Usage: python bench/foreign_entries.py [--root DIR] [--foreign 100000] [--own 20] [--passes 50]
Builds a jobs dir with `--own` finished run dirs of one EvalRun (100 trials each) and `--foreign` run dirs named
like ours but of other cells (empty dirs, as the issue's flood was),
then, in one process as the operator runs, observes it `--passes` times as a pass of that EvalRun does (only its
own run tags wanted) and prints this process's RSS along the way; then one pass that reads every entry, as every
pass did before, for comparison. Prints figures; asserts nothing about time or memory.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from controller.adapters.rundirs.harbor import HarborRunDirs  # noqa: E402
from controller.core.cluster_view import own_run_dir  # noqa: E402
from tests.fixtures.harbor_dirs import REFERENCE_ERRORS, write_synthetic_run_dir  # noqa: E402

OWN_STEM = "ev_org__bench-8B__tiny__0123456789ab__a"


def build(root: Path, own: int, foreign: int) -> None:
    if root.exists():
        shutil.rmtree(root)
    for index in range(own):
        write_synthetic_run_dir(root / f"{OWN_STEM}{index + 1}", 100)
    for index in range(foreign):
        (root / f"ev_x__y__{index:012x}__a1").mkdir()


def rss_mib() -> float:
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path("/tmp/evalrun-bench-foreign"))
    parser.add_argument("--foreign", type=int, default=100_000)
    parser.add_argument("--own", type=int, default=20)
    parser.add_argument("--passes", type=int, default=50)
    args = parser.parse_args()
    started = time.monotonic()
    build(args.root, args.own, args.foreign)
    print(f"jobs dir: {args.own} own run dirs × 100 trials, {args.foreign} foreign entries "
          f"(built in {time.monotonic() - started:.0f} s)")
    wanted = lambda tag: own_run_dir(frozenset({OWN_STEM}), tag)  # noqa: E731
    rss = []
    for index in range(args.passes):
        began = time.monotonic()
        seen = HarborRunDirs(str(args.root), REFERENCE_ERRORS, parallel_from=10**9).observe(wanted)
        took = time.monotonic() - began
        rss.append(rss_mib())
        if index in (0, 1) or (index + 1) % 10 == 0:
            print(f"pass {index + 1:3d}: {len(seen)} run dirs read in {took * 1000:.0f} ms, RSS {rss[-1]:.0f} MiB")
    print(f"RSS over {args.passes} own-tags passes: first {rss[0]:.0f} MiB, last {rss[-1]:.0f} MiB, "
          f"max {max(rss):.0f} MiB")
    began = time.monotonic()
    every = HarborRunDirs(str(args.root), REFERENCE_ERRORS, parallel_from=10**9).observe()
    print(f"one pass reading every entry (before): {len(every)} run dirs in {time.monotonic() - began:.1f} s, "
          f"RSS {rss_mib():.0f} MiB (peak {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB)")


if __name__ == "__main__":
    main()
