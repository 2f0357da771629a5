"""Calls to servers a tenant names, each with a total deadline and in a lane of its own.

httpx's and requests' timeouts are per read: a server that answers a byte every few seconds holds a call for as long
as it likes. A call here runs on a worker thread under its lane's lock (one lane per server, e.g. a webhook's host);
the caller waits at most the deadline in all, for the lane and then for the call, and gets `DeadlineExceeded`. A
call past its deadline keeps its lane until the server lets it go, so the lane's next calls wait and give up at their
deadline too, while other lanes are served: a slow server delays only the calls to it, and holds one thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, wait
from typing import TypeVar

T = TypeVar("T")


class DeadlineExceeded(TimeoutError):
    """The call (or the one before it in its lane) did not finish within the deadline."""


class Lanes:
    def __init__(self, deadline_s: float) -> None:
        self.deadline_s = deadline_s
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def call(self, lane: str, fn: Callable[[], T], deadline_s: float | None = None) -> T:
        """`fn()` in `lane`, or DeadlineExceeded after `deadline_s` (default: the lanes') in all; fn's own errors
        are raised as they are."""
        limit = self.deadline_s if deadline_s is None else deadline_s
        deadline = time.monotonic() + limit
        with self._guard:
            lock = self._locks.setdefault(lane, threading.Lock())
        if not lock.acquire(timeout=limit):
            raise DeadlineExceeded(f"an earlier call to the same server was still running after {limit:g} s")
        done: Future[T] = Future()

        def run() -> None:
            try:
                done.set_result(fn())
            except BaseException as exc:  # handed to the caller, whatever it is
                done.set_exception(exc)
            finally:
                lock.release()

        threading.Thread(target=run, name=f"evalctl-lane-{lane[:40]}", daemon=True).start()
        if not wait([done], timeout=max(deadline - time.monotonic(), 0)).done:
            raise DeadlineExceeded(f"no complete answer within {limit:g} s")
        return done.result()
