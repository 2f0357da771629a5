"""Bench: the fixed walltime against walltime sized per cell (`spec.walltime: auto`), replayed on a simulated queue.

Usage: python bench/walltime.py [--cells 200] [--nodes 16] [--seed 7] [--background-every 8]
A deterministic (seeded) replay of one synthetic fleet through a FIFO queue with EASY backfill, once per policy,
both in one run: how long until every cell has its result, the GPU-hours it took (and how many went to cold
starts), how many jobs and cut jobs, the queue waits, the median time to a cell's result. Prints figures; asserts
nothing. The model (the output's header repeats it with the run's parameters):
- Fleet: `--cells` cells, each with a true full-attempt wall time (13 min model-server cold start + its trials)
  drawn log-uniform on [2 h, 40 h]. Every job of ours pays the cold start again before its first trial; trial
  work is continuous (a cut job loses none of the work it did, only the cold start is paid twice).
- Cluster: `--nodes` nodes, one job per node for ours, 4 GPUs a job (GPU-hours = elapsed × 4). All our cells are
  submitted at t = 0. Background: every `--background-every` hours (0: none) another user submits one job of half
  the nodes that requests 12 h and runs uniform [3 h, 12 h]. Without it backfill never acts: our one-node jobs
  leave no head waiting while a node is free.
- Scheduler: FIFO with EASY backfill. The queue is ordered by priority, then submit time: other users' jobs come
  before ours (fair share: our fleet has used the most). The head gets a reservation at the earliest time enough
  nodes free up by the running jobs' requested ends; a later job starts now if nodes are free and it ends (by its
  request) before the reservation, or it fits on nodes the head will not need then. A job ends at
  min(its need, its request); the controller cancels ours 15 min before their request (monitor.preWalltimeMinutes)
  and resumes them, so ours end at min(need, request − 15 min).
- A, fixed: every job requests 24 h (timeLimit; maxTimeLimit 48 h unused). A cell that needs more is cut and
  resumed: a new job queued at the back (priority order), paying the cold start again, requesting 24 h again.
- B, sized + shards: the controller's estimate of a cell's attempt is its true wall time × a log-normal error
  (sigma 0.25): the p90 is modelled as that point estimate (`wall_estimate()` of one value: median = p90), an
  attempt's hours as the store's history gives them (its server start in it), the start measured at 13 min. Each
  request is `sized()` of it, within [30 min, 48 h]. A cell whose sized request exceeds 48 h runs as the K shards
  the controller chooses (`shards_needed`: the fewest whose own sized requests fit 48 h, of a benchmark of
  `TASKS` tasks), in parallel, each 1/K of the trials plus its own cold start, sized for 1/K. A cut
  job (an estimate too low) is resumed for what is left of its share, sized again for that share.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import math
import random
import statistics
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Literal

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from controller.core.walltime import WallEstimate, WalltimePolicy, clock, shards_needed, sized, wall_estimate  # noqa: E402

Policy = Literal["fixed", "sized"]
POLICIES: dict[Policy, str] = {"fixed": "A fixed 24 h", "sized": "B sized + shards"}

COLD_H = 13 / 60
GPUS_PER_JOB = 4
SHORTEST_H, LONGEST_H = 2.0, 40.0
ERROR_SIGMA = 0.25
FIXED_H = 24.0
CANCEL_MARGIN_H = 0.25  # monitor.preWalltimeMinutes
SIZING = WalltimePolicy(auto=True, cancel_margin=timedelta(hours=CANCEL_MARGIN_H), minimum=timedelta(minutes=30),
                        maximum=timedelta(hours=48))
TASKS = 500  # a benchmark's tasks (swebench's): at most this many shards, and the share they split
OTHERS, OURS = 0, 1  # queue priority: other users' jobs first
BACKGROUND_REQUEST_H, BACKGROUND_SHORTEST_H = 12.0, 3.0


@dataclass(frozen=True)
class Cell:
    index: int
    attempt_hours: float  # one full attempt's true wall time: the cold start and every trial
    estimate: WallEstimate  # the controller's, with its error

    @property
    def work_hours(self) -> float:
        return self.attempt_hours - COLD_H


@dataclass(frozen=True)
class Job:
    seq: int
    width: int  # nodes
    request: float  # hours asked (--time)
    need: float  # hours it runs if nothing stops it
    limit: float  # hours after which it is stopped
    submit: float
    priority: int
    cell: int | None = None  # ours: the cell; another user's: None
    share: float = 0.0  # ours: the share of the cell's trials it has to run

    @property
    def cut(self) -> bool:
        return self.need > self.limit


@dataclass(frozen=True)
class Run:
    job: Job
    nodes: tuple[int, ...]
    start: float
    end: float
    reserved: float | None  # the earliest reservation it held as the queue's head, if it was one

    @property
    def useful_hours(self) -> float:
        """Trial work done (ours): its time past the cold start."""
        return max(0.0, self.end - self.start - COLD_H) if self.job.cell is not None else 0.0


@dataclass(frozen=True)
class Picked:
    started: list[Job]
    head: Job | None  # the first job left waiting
    reservation: float | None  # when the head is due to start


@dataclass(frozen=True)
class Outcome:
    runs: list[Run]  # every job started, ours and other users', in start order
    done: dict[int, float]  # cell → when its last trial finished

    @property
    def ours(self) -> list[Run]:
        return [run for run in self.runs if run.job.cell is not None]


def fleet(n: int, seed: int) -> list[Cell]:
    """Cells with a log-uniform true wall time and the controller's estimate of it (× a log-normal error)."""
    rng = random.Random(seed)
    cells = []
    for index in range(n):
        hours = math.exp(rng.uniform(math.log(SHORTEST_H), math.log(LONGEST_H)))
        cells.append(Cell(index, hours, estimated(hours * rng.lognormvariate(0, ERROR_SIGMA))))
    return cells


def estimated(hours: float) -> WallEstimate:
    estimate = wall_estimate([hours], basis="bench: true wall time × a log-normal error", with_start=True,
                             starts=[COLD_H], start_basis="measured", scales=True)  # as history gives them
    if estimate is None:
        raise ValueError("an estimate of one value is never None")
    return estimate


def asked_hours(cell: Cell, share: float, policy: WalltimePolicy) -> float:
    asked = sized(cell.estimate, share, policy, clock(int(FIXED_H * 3600)))
    if asked is None:
        raise ValueError("sizing is on (auto)")
    h, m, s = (int(part) for part in asked.time_limit.split(":"))
    return h + m / 60 + s / 3600


def shards(cell: Cell, policy: Policy) -> int:
    """How many jobs a cell's first launch is split into: the controller's choice (`shards_needed`, RULES §17)."""
    if policy == "fixed":
        return 1
    return shards_needed(cell.estimate, SIZING, TASKS) or 1


def launch(seq: int, cell: Cell, share: float, policy: Policy, now: float) -> Job:
    """A job of ours running `share` of the cell's trials: the fixed request, or one sized for that share."""
    request = FIXED_H if policy == "fixed" else asked_hours(cell, share, SIZING)
    return Job(seq=seq, width=1, request=request, need=COLD_H + share * cell.work_hours,
               limit=request - CANCEL_MARGIN_H, submit=now, priority=OURS, cell=cell.index, share=share)


def pick(now: float, free: int, running: Sequence[tuple[float, int]], queue: Sequence[Job]) -> Picked:
    """EASY backfill over `queue` (in priority order) with `free` nodes and the running jobs' (requested end,
    width): the head starts while it fits; the first that does not gets a reservation at the earliest requested end
    that frees enough nodes; a later job starts if it fits now and ends by then, or fits on the nodes the head will
    not need (those are then taken)."""
    ends = list(running)
    started: list[Job] = []
    waiting = iter(queue)
    for job in waiting:
        if job.width > free:
            head = job
            break
        started.append(job)
        free -= job.width
        ends.append((now + job.request, job.width))
    else:
        return Picked(started, None, None)
    reservation, extra = shadow(head.width, free, ends)
    for job in waiting:
        before = now + job.request <= reservation
        if job.width <= free and (before or job.width <= extra):
            started.append(job)
            free -= job.width
            extra -= 0 if before else job.width
    return Picked(started, head, reservation)


def shadow(width: int, free: int, ends: Sequence[tuple[float, int]]) -> tuple[float, int]:
    """When `width` nodes are free by the running jobs' requested ends, and how many more are free then."""
    for end, used in sorted(ends):
        free += used
        if free >= width:
            return end, free - width
    raise ValueError(f"a job of {width} nodes never fits")


@dataclass
class Replay:
    """One policy's replay: the queue, the running jobs, and the events (ends, arrivals) in time order."""

    cells: Sequence[Cell]
    policy: Policy
    nodes: int
    background_every: float
    background: random.Random
    now: float = 0.0
    free: list[int] = field(default_factory=list)
    queue: list[Job] = field(default_factory=list)
    running: dict[int, Run] = field(default_factory=dict)
    events: list[tuple[float, int, int]] = field(default_factory=list)  # (time, 0 end / 1 arrival, seq or k)
    runs: list[Run] = field(default_factory=list)
    pending: dict[int, int] = field(default_factory=dict)  # cell → its jobs not yet finished
    done: dict[int, float] = field(default_factory=dict)
    head: tuple[int, float] | None = None  # the waiting head's seq and earliest reservation
    seqs: itertools.count[int] = field(default_factory=itertools.count)

    def run(self) -> Outcome:
        self.free = list(range(self.nodes))
        for cell in self.cells:
            k = shards(cell, self.policy)
            self.pending[cell.index] = k
            for _ in range(k):
                self.submit(launch(next(self.seqs), cell, 1 / k, self.policy, 0.0))
        if self.background_every:
            heapq.heappush(self.events, (0.0, 1, 0))
        self.schedule()
        while len(self.done) < len(self.cells):
            self.now = self.events[0][0]
            while self.events and self.events[0][0] == self.now:
                _, kind, key = heapq.heappop(self.events)
                if kind == 0:
                    self.ended(key)
                else:
                    self.arrived(key)
            self.schedule()
        return Outcome(self.runs, self.done)

    def submit(self, job: Job) -> None:
        self.queue.append(job)
        self.queue.sort(key=lambda j: (j.priority, j.submit, j.seq))

    def arrived(self, k: int) -> None:
        """Another user's job k, and the next one's arrival."""
        hours = self.background.uniform(BACKGROUND_SHORTEST_H, BACKGROUND_REQUEST_H)
        self.submit(Job(seq=next(self.seqs), width=max(1, self.nodes // 2), request=BACKGROUND_REQUEST_H,
                        need=hours, limit=BACKGROUND_REQUEST_H, submit=self.now, priority=OTHERS))
        heapq.heappush(self.events, ((k + 1) * self.background_every, 1, k + 1))

    def ended(self, seq: int) -> None:
        """A job's nodes are free; ours is resumed for what it left, or its cell is one job nearer done."""
        run = self.running.pop(seq)
        for node in run.nodes:
            heapq.heappush(self.free, node)
        job = run.job
        if job.cell is None:
            return
        cell = self.cells[job.cell]
        if job.cut:
            left = job.share - run.useful_hours / cell.work_hours
            self.submit(launch(next(self.seqs), cell, left, self.policy, self.now))
            return
        self.pending[cell.index] -= 1
        if not self.pending[cell.index]:
            self.done[cell.index] = self.now

    def schedule(self) -> None:
        ends = [(run.start + run.job.request, run.job.width) for run in self.running.values()]
        picked = pick(self.now, len(self.free), ends, self.queue)
        for job in picked.started:
            held = self.head[1] if self.head and self.head[0] == job.seq else None
            nodes = tuple(heapq.heappop(self.free) for _ in range(job.width))
            run = Run(job, nodes, self.now, self.now + min(job.need, job.limit), held)
            self.running[job.seq] = run
            self.runs.append(run)
            heapq.heappush(self.events, (run.end, 0, job.seq))
        started = {job.seq for job in picked.started}
        self.queue = [job for job in self.queue if job.seq not in started]
        if picked.head is None or picked.reservation is None:
            self.head = None
        elif self.head and self.head[0] == picked.head.seq:
            self.head = (picked.head.seq, min(self.head[1], picked.reservation))
        else:
            self.head = (picked.head.seq, picked.reservation)


def simulate(cells: Sequence[Cell], policy: Policy, nodes: int, background_every: float = 8.0,
             seed: int = 7) -> Outcome:
    """Every cell of `cells` run to its result under `policy` on `nodes` nodes, beside other users' stream."""
    return Replay(cells, policy, nodes, background_every, random.Random(seed + 1)).run()


def makespan(outcome: Outcome) -> float:
    return max(outcome.done.values())


def gpu_hours(outcome: Outcome) -> float:
    return sum(run.end - run.start for run in outcome.ours) * GPUS_PER_JOB


def figures(outcome: Outcome) -> dict[str, str]:
    ours = outcome.ours
    cold = sum(min(COLD_H, run.end - run.start) for run in ours) * GPUS_PER_JOB
    waits = [run.start - run.job.submit for run in ours]
    chains = Counter(run.job.cell for run in ours)
    return {
        "time until all results (makespan), h": f"{makespan(outcome):.1f}",
        "GPU-hours, total": f"{gpu_hours(outcome):,.0f}",
        "  of which in cold starts": f"{cold:,.0f}",
        "jobs": f"{len(ours)}",
        "  cut and resumed": f"{sum(run.job.cut for run in ours)}",
        "  most jobs for one cell": f"{max(chains.values())}",
        "queue wait, mean, h": f"{statistics.fmean(waits):.1f}",
        "queue wait, p90, h": f"{statistics.quantiles(waits, n=10, method='inclusive')[8]:.1f}",
        "time to a cell's result, median, h": f"{statistics.median(outcome.done.values()):.1f}",
    }


def header(args: argparse.Namespace, cells: Sequence[Cell]) -> list[str]:
    wide = max(1, args.nodes // 2)
    background = (f"every {args.background_every:g} h another user's job of {wide} nodes requesting "
                  f"{BACKGROUND_REQUEST_H:g} h, running uniform [{BACKGROUND_SHORTEST_H:g}, {BACKGROUND_REQUEST_H:g}] h, "
                  "ahead of ours in the queue (fair share)" if args.background_every else "none")
    sharded = sum(shards(cell, "sized") > 1 for cell in cells)
    return [
        f"{len(cells)} cells (seed {args.seed}): true attempt wall time log-uniform on [{SHORTEST_H:g} h, "
        f"{LONGEST_H:g} h] (sum {sum(c.attempt_hours for c in cells):,.0f} h), each job pays a "
        f"{COLD_H * 60:.0f} min cold start; work is continuous (a cut loses only the cold start)",
        f"{args.nodes} nodes, one job of ours per node, {GPUS_PER_JOB} GPUs a job; all cells submitted at t = 0",
        f"background load: {background}",
        "scheduler: FIFO (priority, then submit time) with EASY backfill on requested walltimes; ours are "
        f"cancelled {CANCEL_MARGIN_H * 60:.0f} min before their request (preWalltimeMinutes) and resumed at the back",
        f"A: every job requests {FIXED_H:g} h (maxTimeLimit 48 h unused); a longer cell is resumed in 24 h chunks",
        f"B: sized() of estimate = true × log-normal error (sigma {ERROR_SIGMA:g}; p90 = that estimate), within "
        f"[30 min, 48 h]; over 48 h: the fewest parallel shards whose sized requests fit ({sharded} cells, "
        f"{TASKS} tasks each); a cut job resumed, "
        "sized for its share left",
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cells", type=int, default=200)
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--background-every", type=float, default=8.0, help="hours between other users' jobs; 0: none")
    args = parser.parse_args()
    cells = fleet(args.cells, args.seed)
    for line in header(args, cells):
        print(f"# {line}")
    outcomes = {policy: simulate(cells, policy, args.nodes, args.background_every, args.seed) for policy in POLICIES}
    table = {policy: figures(outcome) for policy, outcome in outcomes.items()}
    print(f"\n{'':38}" + "".join(f"{name:>20}" for name in POLICIES.values()))
    for row in table["fixed"]:
        print(f"{row:38}" + "".join(f"{table[policy][row]:>20}" for policy in POLICIES))
    a, b = outcomes["fixed"], outcomes["sized"]
    print(f"\nB/A: makespan {makespan(b) / makespan(a):.2f}, GPU-hours {gpu_hours(b) / gpu_hours(a):.2f}")


if __name__ == "__main__":
    main()
