"""Worker processes for one pass: the cold pass over a big local fleet reads and parses ~100k JSON files, and
threads would take turns on the GIL for every parse.

Measured on 2 CPUs, 1,000 run dirs × 100 trials, memo empty (bench/incremental_pass.py): serial 17.4-22.8 s from
disk, 2.1 s from the page cache; 4 threads 10.0-10.3 s and 5.0 s (the GIL: worse than serial once files are
cached); 2 processes 12.2-13.2 s and 1.75 s; 4 processes 8.7-9.9 s and 2.0-2.15 s. Reads wait on the disk about a
third of the time, so two workers per CPU keep the CPUs busy while others wait.

A pool lives for one pass and is shut down at its end: the passes that need one are rare in a long-lived process
(its first pass, a burst of new run dirs), so starting the workers (~0.5 s) is paid rarely, and no idle processes
are kept between them (nor left behind by a one-shot `reconcile --once`). Workers are started with "spawn", never
fork: the operator runs threads, and a forked child inherits the locks other threads held. Spawn imports the main
module in each worker, so a program observing run dirs must guard its entry (`if __name__ == "__main__"`, as
console scripts do); else the workers die starting, which is an `ObservationError`.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import BrokenExecutor, Executor, Future, ProcessPoolExecutor
from contextlib import contextmanager
from typing import Any, TypeVar

from controller.core.ports import ObservationError

log = logging.getLogger(__name__)
R = TypeVar("R")
WORKERS_PER_CPU = 2
MAX_WORKERS = 4  # a container sees all of the node's CPUs; each worker is another interpreter (~40 MB)


def cpus() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


@contextmanager
def worker_pool() -> Iterator[Executor]:
    """A process pool for the `with` block; at its end, work not started is dropped and the workers are joined."""
    workers = min(WORKERS_PER_CPU * cpus(), MAX_WORKERS)
    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))
    try:
        yield pool
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def submit_all(pool: Executor, work: Callable[..., R], jobs: Sequence[tuple[Any, ...]]) -> list[Future[R]] | None:
    """`work(*job)` for each job, in the pool's workers, which this starts. None when they cannot be started (a
    process or memory limit): the caller then does the work itself, as failing would fail every pass alike. A worker
    that started and died already is an `ObservationError`."""
    try:
        return [pool.submit(work, *job) for job in jobs]
    except BrokenExecutor as exc:
        raise _failed(exc) from exc
    except (OSError, RuntimeError) as exc:  # fork/exec refused; or no thread for the pool's manager
        log.warning("cannot start worker processes, working in this one: %s", exc)
        return None


def result(future: Future[R]) -> R:
    """What the worker returned. Whatever it raised, or a worker that died, is an `ObservationError`: never a value
    (a run dir read as absent)."""
    try:
        return future.result()
    except ObservationError:
        raise
    except Exception as exc:  # BrokenProcessPool: a worker was killed (OOM, a signal) or died starting
        raise _failed(exc) from exc


def _failed(exc: BaseException) -> ObservationError:
    return ObservationError(f"a worker process reading run dirs failed: {exc!r}")
