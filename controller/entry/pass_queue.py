"""Where the operator's passes run: workers of their own, fed round robin across namespaces, each pass with a
deadline (issue 18).

A pass can hang where Python cannot interrupt it (a FIFO in a scheduler state file, an ssh host that accepts and
never answers). Run in kopf's handler threads, six such passes stopped every namespace. Here the handler waits for
its pass at most `timeout_s` and then reports it Unknown; the hung pass keeps its worker (a new one takes the
worker's place) and its EvalRun (the next pass of that EvalRun is refused at once, never queued behind it), so a
hang costs its own EvalRun, never a handler thread or another namespace's turn.

Threads, not a process per pass: a fresh process costs the imports of a pass (measured in docs/DECISIONS.md) and
would lose the in-process run-dir memo every pass; a thread cannot be killed, so a hung one is left, at most one per
EvalRun.

Fairness: queued passes are taken namespace by namespace in turn; while other namespaces wait, one namespace holds
at most `per_namespace` workers and one lane `per_cluster` (a lane: an ssh login host, shared by every cluster that
reaches it, else the cluster), so a namespace of slow or hung hosts delays only itself.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Generic, TypeVar

T = TypeVar("T")


class PassNotRun(Exception):
    """The pass did not finish within its deadline, or could not start: the EvalRun is Unknown, with why."""


@dataclass(eq=False)
class _Pass(Generic[T]):
    uid: str
    namespace: str
    cluster: str
    work: Callable[[], T]
    future: Future[T] = field(default_factory=Future)
    started: datetime | None = None
    abandoned: bool = False  # its deadline passed while it ran: a replacement worker took its worker's place


class PassQueue:
    def __init__(self, workers: int = 8, per_namespace: int = 4, per_cluster: int = 2) -> None:
        self.per_namespace, self.per_cluster = per_namespace, per_cluster
        self._changed = threading.Condition()
        self._queued: dict[str, deque[_Pass[object]]] = {}  # namespace → its passes, oldest first
        self._turns: deque[str] = deque()  # namespaces with queued passes, next turn first
        self._running: dict[str, _Pass[object]] = {}  # uid → its pass (hung ones included)
        self._by_namespace: Counter[str] = Counter()
        self._by_cluster: Counter[str] = Counter()
        self._stalled_since: datetime | None = None  # a pass was queued then, and no worker has moved since
        for _ in range(workers):
            self._start_worker()

    async def run(self, uid: str, namespace: str, cluster: str, work: Callable[[], T], timeout_s: float) -> T:
        """`work()`'s result, after the EvalRun's pass already queued or running (a timer and a change can fire
        together); PassNotRun when that one hung, or this one did not finish within `timeout_s` in all.

        Awaited on kopf's event loop: the handler waits without a thread of its own, so handlers waiting on slow
        passes never hold kopf's thread pool (six threads here) from another namespace's handler."""
        deadline = time.monotonic() + timeout_s
        ahead = self._ahead(uid, namespace)
        if ahead is not None:
            try:
                await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(ahead)), timeout_s)
            except TimeoutError:
                raise _still_running(timeout_s) from None
            except Exception:  # its own handler reports it
                pass
        job = self._enqueue(uid, namespace, cluster, work)
        try:
            return await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(job.future)),
                                          max(deadline - time.monotonic(), 0.0))
        except TimeoutError:
            return self._expired(job, timeout_s)

    def _ahead(self, uid: str, namespace: str) -> Future[object] | None:
        """The future of this EvalRun's pass queued or running; PassNotRun when that one is past its deadline."""
        with self._changed:
            ahead = self._running.get(uid) or next((q for q in self._queued.get(namespace, ()) if q.uid == uid), None)
        if ahead is not None and ahead.abandoned:
            raise PassNotRun(f"the previous pass has been running since {_at(ahead.started)}, past the pass "
                             "timeout (a read that blocks, or a host that does not answer?)")
        return ahead.future if ahead is not None else None

    def _enqueue(self, uid: str, namespace: str, cluster: str, work: Callable[[], T]) -> _Pass[T]:
        job: _Pass[T] = _Pass(uid, namespace, cluster, work)
        with self._changed:
            self._queued.setdefault(namespace, deque()).append(job)  # type: ignore[arg-type]
            if namespace not in self._turns:
                self._turns.append(namespace)
            self._stalled_since = self._stalled_since or datetime.now(UTC)
            self._changed.notify()
        return job

    def _expired(self, job: _Pass[T], timeout_s: float) -> T:
        """Its deadline passed: its result if it finished meanwhile, else PassNotRun (dropped from the queue, or
        abandoned to its worker, which a new one replaces)."""
        with self._changed:
            if job.future.done():  # it finished as the deadline passed: its worker goes on as before
                return job.future.result()
            if job.started is None:
                self._drop_queued(job)  # type: ignore[arg-type]
                raise PassNotRun(f"no worker was free within the pass timeout ({timeout_s:g} s): "
                                 f"{self.waiting()} passes waiting, {len(self._running)} running")
            job.abandoned = True
            self._start_worker()  # this one's worker may never come back
        raise PassNotRun(f"the pass did not finish within the pass timeout ({timeout_s:g} s; running since "
                         f"{_at(job.started)})")

    def stuck_for(self, now: datetime) -> float:
        """Seconds since a pass was queued with no worker starting or finishing one since (0 when nothing waits
        for a worker): what the liveness probe checks. A pass dropped from the queue at its deadline leaves the
        queue stuck; an EvalRun whose pass hangs is refused, not queued, so it alone never makes it look stuck."""
        with self._changed:
            since = self._stalled_since
        return max((now - since).total_seconds(), 0.0) if since else 0.0

    def wedged(self, now: datetime, limit_s: float) -> str:
        """Why the liveness probe should fail ("" when passes move)."""
        stuck = self.stuck_for(now)
        return (f"a pass has waited {stuck:.0f} s and no worker started or finished one (limit {limit_s:g} s)"
                if stuck > limit_s else "")

    # ------------------------------------------------------------------ workers

    def _start_worker(self) -> None:
        threading.Thread(target=self._work, name="evalrun-pass", daemon=True).start()

    def _work(self) -> None:
        while True:
            with self._changed:
                while (job := self._next()) is None:
                    self._changed.wait()
                job.started = datetime.now(UTC)
                self._stalled_since = None
                self._running[job.uid] = job
                self._by_namespace[job.namespace] += 1
                self._by_cluster[job.cluster] += 1
            try:
                job.future.set_result(job.work())
            except BaseException as exc:
                job.future.set_exception(exc)
            with self._changed:
                del self._running[job.uid]
                self._by_namespace[job.namespace] -= 1
                self._by_cluster[job.cluster] -= 1
                self._stalled_since = None
                self._changed.notify_all()
                if job.abandoned:
                    return  # a replacement took this worker's place while it hung

    def _next(self) -> _Pass[object] | None:
        """The next namespace's oldest pass that its namespace and cluster have room for (under the lock)."""
        contended = len(self._turns) > 1
        for _ in range(len(self._turns)):
            namespace = self._turns[0]
            self._turns.rotate(-1)
            for job in self._queued[namespace]:
                if job.uid in self._running or self._by_cluster[job.cluster] >= self.per_cluster:
                    continue
                if contended and self._by_namespace[namespace] >= self.per_namespace:
                    break
                self._drop_queued(job)
                return job
        return None

    def _drop_queued(self, job: _Pass[object]) -> None:
        queue = self._queued[job.namespace]
        queue.remove(job)
        if not queue:
            del self._queued[job.namespace]
            self._turns.remove(job.namespace)

    def waiting(self) -> int:
        return sum(len(queue) for queue in self._queued.values())


def _still_running(timeout_s: float) -> PassNotRun:
    return PassNotRun(f"the previous pass of this EvalRun did not finish within the pass timeout ({timeout_s:g} s)")


def _at(moment: datetime | None) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ") if moment else "?"
