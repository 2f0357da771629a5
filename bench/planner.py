"""Bench: the pure planner alone, `plan()` over 10,000 cells in-process (no I/O), median of 5.

Usage: python bench/planner.py [--cells 10000]
Four fleets: fresh cells (nothing observed: the first pass of a large EvalRun), cells with a finished, scored row
of ours (the steady state), cells with a live job each making progress, and the same jobs stalled at launch (every
cell remedied at once: the worst case). Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from controller.core.observed import JobState, Observation  # noqa: E402
from controller.core.planner import plan  # noqa: E402
from controller.core.types import Cell  # noqa: E402
from tests.core.builders import NOW, POLICY, RUN, SCORED, ago, cell, facts, job, obs, row, sub  # noqa: E402


def fleets(n: int) -> dict[str, tuple[list, list[Observation]]]:
    cells = [cell(model=f"org/Model{i}-8B") for i in range(n)]
    finished = [obs(rows=(row("Finished", metrics=SCORED, job_name=c.run_tag(1)),), subs=(sub(c),)) for c in cells]
    return {"fresh": (cells, [obs() for _ in cells]), "finished": (cells, finished),
            "running": (cells, [live(c, progress=True) for c in cells]),
            "stalled": (cells, [live(c, progress=False) for c in cells])}


def live(c: Cell, *, progress: bool) -> Observation:
    """A job running for an hour: with 4 of 10 trials scored, the last 2 minutes ago (healthy), or with no run dir
    at all (a stalled launch: every cell is cancelled and refired, the remedy path)."""
    dirs = (facts(c.run_tag(1), completed=4, finished=False, last_progress=ago(minutes=2)),) if progress else ()
    return obs(rows=(row("Started", job_name=c.run_tag(1), started=ago(hours=1)),), subs=(sub(c),),
               jobs=(job(sub(c).name, JobState.RUNNING, started=ago(hours=1), time_left_s=36_000),), dirs=dirs)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cells", type=int, default=10_000)
    args = parser.parse_args()
    print(f"Python {platform.python_version()}")  # the figures depend on it: docs/PERFORMANCE.md
    for name, (cells, observations) in fleets(args.cells).items():
        times = []
        for _ in range(5):
            started = time.perf_counter()
            plan(RUN, cells, observations, POLICY, NOW)
            times.append(time.perf_counter() - started)
        print(f"plan() over {args.cells:,} {name} cells: median {statistics.median(times) * 1e3:.0f} ms "
              f"(min {min(times) * 1e3:.0f}, max {max(times) * 1e3:.0f})")


if __name__ == "__main__":
    main()
