"""Bench: a pass costs what is active. 1,000 run dirs × 100 trials, 1% of them running.

Usage: python bench/incremental_pass.py [--root DIR] [--dirs 1000] [--trials 100] [--serial]
In one process (the memo is per process, as in `reconcile --loop` and the operator), measures:
- cold pass: `HarborRunDirs.observe()` with the page cache dropped, against its floor, reading every trial
  `result.json` once in this process (page cache dropped too; worker processes can beat it), and its CPU time
  (this process plus its worker processes) against its wall time: above 1 means it used more than one core;
- warm pass: the next `observe()` after a trial landed in each running dir, against its floor, `stat`-ing the
  running dirs' trial results, plus the fixed cost of a pass: listing the jobs dir and stat-ing each run dir and
  its three job files.
`--serial` reads every run dir in this process, as before the cold pass used worker processes.
Prints figures and ratios; asserts nothing about time. Dropping the page cache needs root (else it says so).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fleet import drop_page_cache  # noqa: E402

os.environ["EVALCTL_CACHE_DIR"] = ""  # an in-process memo's figures: a cold pass with nothing from earlier runs

from controller.adapters.rundirs.harbor import PARALLEL_FROM, HarborRunDirs  # noqa: E402
from controller.adapters.rundirs.localfs import JOB_FILES  # noqa: E402
from tests.fixtures.harbor_dirs import REFERENCE_ERRORS, write_synthetic_run_dir, write_trial  # noqa: E402


def build(root: Path, dirs: int, trials: int) -> list[Path]:
    if root.exists():
        shutil.rmtree(root)
    running = []
    for i in range(dirs):
        is_running = i % 100 == 0
        run = root / f"ev_bench_{i:04d}"
        write_synthetic_run_dir(run, trials - 1 if is_running else trials, n_total=trials, finished=not is_running,
                                infra_every=17, benign_every=9)
        if is_running:
            write_trial(run, "pending__zzzzzzz", result=False)
            running.append(run)
    return running


def timed(work) -> float:
    started = time.perf_counter()
    work()
    return time.perf_counter() - started


def timed_cpu(work) -> tuple[float, float]:
    """Wall and CPU seconds of `work()`; CPU counts this process and its children that ended (a pass's workers)."""
    before, started = os.times(), time.perf_counter()
    work()
    wall, after = time.perf_counter() - started, os.times()
    cpu = sum(getattr(after, f) - getattr(before, f) for f in ("user", "system", "children_user", "children_system"))
    return wall, cpu


def read_every_trial(root: Path) -> None:
    for run in os.scandir(root):
        for trial in os.scandir(run.path):
            if "__" in trial.name:
                try:
                    with open(os.path.join(trial.path, "result.json"), "rb") as f:
                        f.read()
                except FileNotFoundError:
                    pass


def stat_running_trials(running: list[Path]) -> None:
    for run in running:
        for trial in os.scandir(run):
            if "__" in trial.name:
                try:
                    os.stat(os.path.join(trial.path, "result.json"))
                except FileNotFoundError:
                    pass


def fixed_cost(root: Path) -> None:
    for run in sorted(e.path for e in os.scandir(root)):
        os.stat(run)
        for name in JOB_FILES:
            os.stat(os.path.join(run, name))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path("/tmp/evalrun-bench-incremental"))
    parser.add_argument("--dirs", type=int, default=1000)
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--serial", action="store_true", help="no worker processes for the cold pass")
    args = parser.parse_args()
    parallel_from = sys.maxsize if args.serial else PARALLEL_FROM

    def a_pass() -> None:
        HarborRunDirs(str(args.root), REFERENCE_ERRORS, parallel_from=parallel_from).observe()

    started = time.perf_counter()
    running = build(args.root, args.dirs, args.trials)
    print(f"fleet: {args.dirs} run dirs × {args.trials} trials, {len(running)} running; cold pass "
          f"{'serial' if args.serial else f'in worker processes from {PARALLEL_FROM} never-read run dirs'} "
          f"(built in {time.perf_counter() - started:.0f} s)")

    cold_is_cold = drop_page_cache()
    floor_cold = timed(lambda: read_every_trial(args.root))
    drop_page_cache()
    cold, cold_cpu = timed_cpu(a_pass)
    warm_runs, floors = [], []
    for round_ in range(5):
        for run in running:  # a trial lands in each running dir between passes
            write_trial(run, f"landed{round_}__aaaaaaa", reward=1.0)
        warm_runs.append(timed(a_pass))
        floors.append(timed(lambda: stat_running_trials(running)) + timed(lambda: fixed_cost(args.root)))
    warm, floor_warm = statistics.median(warm_runs), statistics.median(floors)
    fixed = statistics.median(timed(lambda: fixed_cost(args.root)) for _ in range(5))

    note = "" if cold_is_cold else " (page cache NOT dropped: not root)"
    print(f"cold pass: {cold:.2f} s; floor, reading every trial result.json once: {floor_cold:.2f} s; "
          f"ratio {cold / floor_cold:.2f}{note}")
    print(f"cold pass CPU: {cold_cpu:.2f} s (this process + workers) over {cold:.2f} s wall: {cold_cpu / cold:.2f} "
          f"cores busy, of {os.cpu_count()}")
    print(f"warm pass (median of 5): {warm * 1000:.1f} ms; floor, stat-ing the running dirs' trials plus the fixed "
          f"cost: {floor_warm * 1000:.1f} ms (fixed cost alone: {fixed * 1000:.1f} ms, listing the jobs dir and "
          f"stat-ing {len(JOB_FILES) + 1} paths per run dir); ratio {warm / floor_warm:.2f}")


if __name__ == "__main__":
    main()
