"""The operator's pass queue (issue 18): a hung pass costs its own EvalRun only; namespaces take turns; a cluster
holds a bounded number of workers. Synchronised on events and on the queue's own counts, never on sleeps."""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from controller.entry.pass_queue import PassNotRun, PassQueue
from tests.fixtures.evalctl import wait_until
from tests.fixtures.threads import in_thread


def _wait(queue: PassQueue, *args: Any, **kwargs: Any) -> Any:
    """A handler's wait for its pass, on an event loop of the calling thread's own."""
    return asyncio.run(queue.run(*args, **kwargs))


def test_a_hung_pass_is_unknown_its_next_pass_is_refused_and_others_still_run() -> None:
    queue, hang = PassQueue(workers=1), threading.Event()
    with pytest.raises(PassNotRun, match="did not finish within the pass timeout"):
        _wait(queue, "hung", "tenant", "c1", hang.wait, timeout_s=0.2)
    with pytest.raises(PassNotRun, match="previous pass has been running since"):
        _wait(queue, "hung", "tenant", "c1", lambda: "never", timeout_s=30)
    assert _wait(queue, "innocent", "other", "c2", lambda: "done", timeout_s=30) == "done", "a worker took its place"
    hang.set()


def test_namespaces_take_turns_for_a_worker() -> None:
    queue, gate, order = PassQueue(workers=1), threading.Event(), []
    running = threading.Event()
    blocker, _ = in_thread(lambda: _wait(queue, "gate", "g", "c0", lambda: (running.set(), gate.wait()), timeout_s=30))
    running.wait(timeout=30)
    callers = []
    for queued, (uid, namespace) in enumerate((("a1", "a"), ("a2", "a"), ("a3", "a"), ("b1", "b")), start=1):
        callers.append(in_thread(lambda uid=uid, ns=namespace: _wait(queue, uid, ns, uid, lambda: order.append(uid),
                                                                          timeout_s=30))[0])
        wait_until(lambda n=queued: queue.waiting() == n, f"{uid} queued")
    gate.set()
    for caller in (blocker, *callers):
        caller.join(timeout=30)
    assert order == ["a1", "b1", "a2", "a3"]


def test_one_cluster_never_holds_more_than_its_share_of_workers() -> None:
    queue, lock, now_running, most = PassQueue(workers=4, per_cluster=1), threading.Lock(), [0], [0]
    release = threading.Event()

    def work() -> None:
        with lock:
            now_running[0] += 1
            most[0] = max(most[0], now_running[0])
        release.wait()
        with lock:
            now_running[0] -= 1

    callers = [in_thread(lambda uid=uid: _wait(queue, uid, "ns", "slow-host", work, timeout_s=30))[0]
               for uid in ("r1", "r2", "r3")]
    wait_until(lambda: queue.waiting() == 2, "two passes held back behind the cluster's one")
    release.set()
    for caller in callers:
        caller.join(timeout=30)
    assert most[0] == 1


def test_a_second_pass_of_an_evalrun_waits_for_the_first_then_runs() -> None:
    queue, first_started, release = PassQueue(workers=2), threading.Event(), threading.Event()
    first, first_out = in_thread(lambda: _wait(queue, "r", "ns", "c", lambda: (first_started.set(), release.wait(),
                                                                               "first")[-1], timeout_s=30))
    first_started.wait(timeout=30)
    second, second_out = in_thread(lambda: _wait(queue, "r", "ns", "c", lambda: "second", timeout_s=30))
    release.set()
    first.join(timeout=30)
    second.join(timeout=30)
    assert (first_out, second_out) == (["first"], ["second"])


def test_liveness_sees_a_queue_that_does_not_drain_and_not_a_single_hung_evalrun() -> None:
    queue, hang = PassQueue(workers=1), threading.Event()
    later = datetime.now(UTC) + timedelta(hours=1)
    with pytest.raises(PassNotRun):
        _wait(queue, "hung", "ns", "c", hang.wait, timeout_s=0.2)
    with pytest.raises(PassNotRun):
        _wait(queue, "hung", "ns", "c", lambda: None, timeout_s=30)  # refused, not queued
    assert queue.stuck_for(later) == 0.0, "one hung EvalRun is contained, not a reason to restart"
    hang.set()

    stuck, busy, gate = PassQueue(workers=1), threading.Event(), threading.Event()
    in_thread(lambda: _wait(stuck, "busy", "ns", "c", lambda: (busy.set(), gate.wait()), timeout_s=30))
    busy.wait(timeout=30)
    in_thread(lambda: _wait(stuck, "next", "ns", "c2", lambda: None, timeout_s=30))
    wait_until(lambda: stuck.waiting() == 1, "a pass waiting behind a busy worker")
    assert stuck.stuck_for(later) > 3000
    assert "no worker started or finished one" in stuck.wedged(later, limit_s=600)
    assert stuck.wedged(datetime.now(UTC), limit_s=600) == ""
    gate.set()
    wait_until(lambda: stuck.stuck_for(later) == 0.0, "the queue drained")


def test_clusters_on_one_ssh_host_share_one_lane_and_others_keep_their_own() -> None:
    from controller.entry.operator import pass_lane

    on_login = {"scheduler": {"type": "slurm", "ssh": "alice@login-1.hpc:2222"}}
    assert pass_lane("evalclusters", "team-a", "a", on_login) == pass_lane(
        "evalclusters", "team-b", "b", {"scheduler": {"type": "slurm", "ssh": "login-1.hpc"}}) == "ssh:login-1.hpc"
    assert pass_lane("clusterevalclusters", None, "hpc", {"scheduler": {"type": "local"}}) == \
        "clusterevalclusters/None/hpc"


def test_a_hung_worker_that_comes_back_leaves_the_pool_its_size() -> None:
    def workers() -> int:
        return sum(1 for thread in threading.enumerate() if thread.name == "evalrun-pass")

    before = workers()
    queue, hang = PassQueue(workers=2), threading.Event()
    wait_until(lambda: workers() == before + 2, "the pool started")
    with pytest.raises(PassNotRun):
        _wait(queue, "hung", "ns", "c", hang.wait, timeout_s=0.2)
    assert workers() == before + 3, "a replacement while the hung one holds its worker"
    hang.set()
    wait_until(lambda: workers() == before + 2, "the hung worker gone once its pass returned")
    assert _wait(queue, "hung", "ns", "c", lambda: "again", timeout_s=30) == "again"
