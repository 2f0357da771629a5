"""The cold pass over many never-read run dirs reads them in worker processes: same facts, same order, same memo
as reading them here, and a worker that fails is an unknown observation, never a run dir read as absent.

`parallel_from` forces the worker path on a small fleet; `parallel.cpus` is pinned to 2 so it does not depend on
the machine. Functions that stand in for the workers' reader are module-level: a spawned worker imports them.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from controller.adapters.rundirs import harbor, memo, parallel
from controller.adapters.rundirs.harbor import HarborRunDirs
from controller.core.observed import ErrorKind, QuietFailure, RunDirFacts
from controller.core.ports import ObservationError
from controller.core.trial_errors import ErrorClasses
from tests.fixtures.harbor_dirs import REFERENCE_ERRORS, write_synthetic_run_dir, write_trial

SERIAL = 10**9  # more never-read run dirs than any test has: read here
PINGGY = "https://abc-1-2-3-4.a.pinggy.link/v1"
INSTANT = QuietFailure(exception_type="APIConnectionError", kind=ErrorKind.INFRA, agent_seconds=0.5, task="instant")
# the model answered, then timed out without one output token: quiet, not instant (240 s of agent time)
QUIET = QuietFailure(exception_type="AgentTimeoutError", kind=ErrorKind.BENIGN, agent_seconds=240.0, reward=0.0,
                     answered=True, task="zz-quiet")


@pytest.fixture(autouse=True)
def two_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parallel, "cpus", lambda: 2)



def trial_reads(reads: list[str]) -> list[str]:
    """The trial results read (not the first trial's config.json, read once per scanned run dir for api_base)."""
    return [p for p in reads if "__" in os.path.basename(os.path.dirname(p)) and p.endswith("/result.json")]


def observe(jobs: Path, parallel_from: int) -> tuple[RunDirFacts, ...]:
    """`workers_from_s=0`: from `parallel_from` cold dirs on, workers read them all, however fast this host is."""
    return HarborRunDirs(str(jobs), REFERENCE_ERRORS, parallel_from=parallel_from, workers_from_s=0).observe()


def forget_everything(monkeypatch: pytest.MonkeyPatch) -> None:
    """As in a new process that never read anything yet (without the run-dir cache of earlier processes)."""
    monkeypatch.setattr(memo, "_MEMOS", {})
    monkeypatch.setenv("EVALCTL_CACHE_DIR", "")


def mixed_fleet(jobs: Path) -> Path:
    """Finished and running dirs, and one of each way a run dir or a file in it cannot be read."""
    for i in range(6):
        done = write_synthetic_run_dir(jobs / f"ev_done_{i}", 5 + i, n_total=6 + i, infra_every=3, benign_every=4,
                                       api_base=PINGGY).path
        write_trial(done, "zz-quiet__zzzzzzz", reward=0.0, exception="AgentTimeoutError", output_tokens=0,
                    input_tokens=900)  # the last trial: the first one's api_base stays PINGGY
    for i in range(4):
        run = write_synthetic_run_dir(jobs / f"ev_running_{i}", 3 + i, n_total=20, finished=False).path
        write_trial(run, "pending__zzzzzzz", result=False)
        write_trial(run, "working__zzzzzzz", result=False, steps=2)
        write_trial(run, "instant__zzzzzzz", exception="APIConnectionError", output_tokens=None, agent_seconds=0.5)
    bad_json = write_synthetic_run_dir(jobs / "ev_bad_json", 6).path
    (bad_json / "task-000002__0000002" / "result.json").write_bytes(b"{not json")
    empty = write_synthetic_run_dir(jobs / "ev_empty_trial", 4, n_total=9, finished=False).path
    (empty / "task-000001__0000001" / "result.json").write_bytes(b"")
    fifo = write_synthetic_run_dir(jobs / "ev_fifo_trial", 4).path
    os.mkfifo(write_trial(fifo, "zz-fifo__0000009", result=False) / "result.json")
    dir_config = write_synthetic_run_dir(jobs / "ev_dir_config", 2).path
    (dir_config / "config.json").unlink()
    (dir_config / "config.json").mkdir()
    (jobs / "ev_a_file").write_text("not a dir")
    os.symlink("ev_loop", jobs / "ev_loop")
    os.symlink("other_loop", jobs / "other_loop")  # another tool's, unlistable: skipped
    (jobs / "other_tool").mkdir()
    return jobs


def test_workers_give_the_facts_and_the_memo_of_a_serial_pass(tmp_path: Path, reads: list[str],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    jobs = mixed_fleet(tmp_path / "jobs")
    serial = observe(jobs, SERIAL)
    serial_memo = dict(memo.memo_for(str(jobs), REFERENCE_ERRORS)._runs)
    forget_everything(monkeypatch)
    reads.clear()

    in_workers = observe(jobs, parallel_from=1)

    assert in_workers == serial
    assert reads == [], "read in the workers, not in this process"
    assert dict(memo.memo_for(str(jobs), REFERENCE_ERRORS)._runs) == serial_memo
    by_tag = {f.run_tag: f for f in in_workers}
    assert "other_loop" not in by_tag and by_tag["other_tool"].unreadable == ""
    assert {tag for tag, f in by_tag.items() if f.unreadable} == {
        "ev_bad_json", "ev_empty_trial", "ev_fifo_trial", "ev_dir_config", "ev_a_file", "ev_loop"}
    assert by_tag["ev_done_5"].n_completed == 11 and by_tag["ev_running_3"].n_trial_dirs == 9
    # what the launch-health rules read came back from the workers too
    assert by_tag["ev_done_5"].api_base == PINGGY and by_tag["ev_done_5"].quiet_failures == (QUIET,)
    assert by_tag["ev_running_3"].quiet_failures == (INSTANT,) and by_tag["ev_running_3"].n_started_trials == 8


def test_after_workers_the_next_pass_reads_only_changed_trials(tmp_path: Path, reads: list[str],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    jobs = tmp_path / "jobs"
    for i in range(5):
        write_synthetic_run_dir(jobs / f"ev_done_{i}", 10)
    running = write_synthetic_run_dir(jobs / "ev_running", 10, n_total=20, finished=False).path
    write_trial(running, "late__xxxxxxx", result=False)
    write_trial(running, "instant__xxxxxxx", exception="APIConnectionError", output_tokens=None, agent_seconds=0.5)
    observe(jobs, parallel_from=1)
    reads.clear()

    write_trial(running, "late__xxxxxxx", reward=1.0)  # it finishes
    write_trial(running, "new__yyyyyyy", reward=0.0)  # and another one lands
    again = observe(jobs, parallel_from=1)  # every run dir is known now: read here, incrementally

    assert sorted(os.path.basename(os.path.dirname(p)) for p in trial_reads(reads)) == ["late__xxxxxxx",
                                                                                      "new__yyyyyyy"]
    assert [p for p in reads if "ev_done" in p] == [], "the finished dirs were settled by the workers' pass"
    assert {f.run_tag: f for f in again}["ev_running"].quiet_failures == (INSTANT,), "recalled from the workers'"
    forget_everything(monkeypatch)
    assert again == observe(jobs, SERIAL), "what the workers handed back gives the facts of reading it all"


@contextmanager
def no_workers_started() -> Iterator[None]:
    raise AssertionError("no worker pool for this pass")
    yield  # pragma: no cover


@pytest.mark.parametrize("case", ["small fleet", "warm pass", "one cpu"])
def test_small_fleets_and_warm_passes_stay_in_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      case: str) -> None:
    jobs = tmp_path / "jobs"
    for i in range(3):
        write_synthetic_run_dir(jobs / f"ev_done_{i}", 2)
    just_started = write_synthetic_run_dir(jobs / "ev_just_started", 0, n_total=5, finished=False).path
    write_trial(just_started, "pending__zzzzzzz", result=False)  # no trial result to remember: still known
    if case == "warm pass":
        observe(jobs, SERIAL)
    if case == "one cpu":
        monkeypatch.setattr(parallel, "cpus", lambda: 1)
    monkeypatch.setattr(parallel, "worker_pool", no_workers_started)

    facts = observe(jobs, parallel_from=5 if case == "small fleet" else 1)

    assert [f.n_completed for f in facts] == [2, 2, 2, 0]


def die(root: str, run_tags: list[str], errors: ErrorClasses) -> list[harbor.ColdRead]:
    """A worker killed mid-read (the OOM killer, a signal)."""
    os._exit(9)


def read_cold_timing_out(root: str, run_tags: list[str], errors: ErrorClasses) -> list[harbor.ColdRead]:
    """The real reader in a worker whose disk times out on one trial result."""
    os.open = timing_out_open(os.open)  # this worker process only
    return harbor.read_cold(root, run_tags, errors)


def timing_out_open(real_open: Callable[..., int]) -> Callable[..., int]:
    def flaky_open(path: str, flags: int, *args: object) -> int:
        if str(path).endswith("task-000001__0000001/result.json"):
            raise TimeoutError(errno.ETIMEDOUT, "Connection timed out")
        return real_open(path, flags, *args)

    return flaky_open


def test_a_worker_that_dies_is_an_observation_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    jobs = tmp_path / "jobs"
    for i in range(3):
        write_synthetic_run_dir(jobs / f"ev_done_{i}", 2)
    monkeypatch.setattr(harbor, "read_cold", die)

    with pytest.raises(ObservationError, match="worker process"):
        observe(jobs, parallel_from=1)

    assert not memo.memo_for(str(jobs), REFERENCE_ERRORS).knows(str(jobs / "ev_done_0")), "nothing of the failed pass was kept"


def test_a_transport_error_in_a_worker_is_the_error_a_serial_pass_raises(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    jobs = tmp_path / "jobs"
    write_synthetic_run_dir(jobs / "ev_done", 3)
    monkeypatch.setattr(harbor, "read_cold", read_cold_timing_out)
    with pytest.raises(ObservationError) as in_worker:
        observe(jobs, parallel_from=1)

    monkeypatch.setattr(os, "open", timing_out_open(os.open))
    with pytest.raises(ObservationError) as here:
        observe(jobs, SERIAL)

    assert str(in_worker.value) == str(here.value) and "timed out" in str(here.value)


def refusing_pool(error: Exception) -> Callable[[], Any]:
    """A pool whose workers cannot be started (`submit` starts them), with `error`."""

    class Refusing(Executor):
        def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
            raise error

    @contextmanager
    def pool() -> Iterator[Executor]:
        yield Refusing()

    return pool


def test_workers_that_cannot_be_started_leave_the_pass_to_this_process(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A process limit would otherwise fail every pass: nothing would ever be read."""
    jobs = mixed_fleet(tmp_path / "jobs")
    serial = observe(jobs, SERIAL)
    forget_everything(monkeypatch)
    monkeypatch.setattr(parallel, "worker_pool", refusing_pool(BlockingIOError(errno.EAGAIN, "fork refused")))

    assert observe(jobs, parallel_from=1) == serial
    assert memo.memo_for(str(jobs), REFERENCE_ERRORS).knows(str(jobs / "ev_done_0"))


def test_a_pool_broken_while_starting_is_an_observation_error(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    write_synthetic_run_dir(tmp_path / "jobs" / "ev_done", 2)
    monkeypatch.setattr(parallel, "worker_pool", refusing_pool(BrokenProcessPool("a worker died starting")))

    with pytest.raises(ObservationError, match="worker process"):
        observe(tmp_path / "jobs", parallel_from=1)


def test_workers_start_only_when_the_first_dirs_say_reading_here_would_take_longer(
        tmp_path: Path, reads: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """From the page cache, workers lost (their start costs more than they win): the first cold dirs are read here
    and timed, and the rest go to workers only when reading them here would take longer than `workers_from_s`."""
    jobs = tmp_path / "jobs"
    for i in range(harbor.SAMPLE_DIRS + 8):
        write_synthetic_run_dir(jobs / f"ev_done_{i:02d}", 5)
    serial = observe(jobs, SERIAL)
    run_dirs_read = lambda: {Path(p).parent.parent.name for p in reads  # noqa: E731 - whose trial results were read
                             if p.endswith("/result.json") and "__" in Path(p).parent.name}
    started: list[bool] = []
    real_pool = parallel.worker_pool

    def pool() -> Any:
        started.append(True)
        return real_pool()

    monkeypatch.setattr(parallel, "worker_pool", pool)
    forget_everything(monkeypatch)
    reads.clear()
    fast = HarborRunDirs(str(jobs), REFERENCE_ERRORS, parallel_from=1, workers_from_s=3600.0).observe()
    assert (fast, started) == (serial, []), "a fleet read quickly here starts no worker"
    assert len(run_dirs_read()) == len(serial)

    forget_everything(monkeypatch)
    reads.clear()
    slow = HarborRunDirs(str(jobs), REFERENCE_ERRORS, parallel_from=1, workers_from_s=1e-9).observe()
    assert (slow, started) == (serial, [True])
    assert run_dirs_read() == {f"ev_done_{i:02d}" for i in range(harbor.SAMPLE_DIRS)}, "the sample here, the rest there"
