"""Stores that cannot be used: one clear line, cells Unknown or planned only, nothing launched, no traceback."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest

from controller.adapters.store import open_store
from controller.adapters.store.sqlite import SqliteStore
from controller.core.cluster_view import ClusterPorts
from controller.core.ports import ObservationError, StoreUnavailable
from controller.core.reconcile import reconcile_pass
from controller.core.run_target import RunTarget
from controller.core.store import Store
from controller.core.types import ClusterRef
from controller.core.vocabulary import Phase
from tests.core.builders import POLICY, cell
from tests.fixtures.evalctl import run_evalctl

NOW = datetime.now(UTC)


def _garbage(path: Path) -> None:
    path.write_bytes(b"\x00\xffnot sqlite at all" * 100)


def _truncated(path: Path) -> None:
    SqliteStore(path).close()
    data = path.read_bytes()
    path.write_bytes(data[:100] + b"\xde\xad" * 2000)  # a valid header, then garbage pages


def _directory(path: Path) -> None:
    path.mkdir()


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _parent_is_a_file(path: Path) -> None:
    path.parent.rmdir()
    path.parent.write_text("a file where the store's directory should be")


BROKEN: dict[str, Callable[[Path], None]] = {
    "garbage bytes": _garbage,
    "valid header, garbage pages": _truncated,
    "a directory": _directory,
    "a FIFO": _fifo,
    "parent is a file": _parent_is_a_file,
}


@pytest.fixture
def store_path(tmp_path: Path) -> Path:
    (tmp_path / "state").mkdir()
    return tmp_path / "state" / "store.db"


@pytest.mark.parametrize("make", BROKEN.values(), ids=BROKEN.keys())
def test_a_store_that_is_not_a_database_fails_in_one_line(store_path: Path, make: Callable[[Path], None]) -> None:
    make(store_path)
    with pytest.raises((StoreUnavailable, ObservationError)) as raised:
        store = open_store(f"sqlite:///{store_path}")
        store.observe("r", ["m"], ["b"])
    message = str(raised.value)
    assert str(store_path) in message and "\n" not in message and "(" in message, "path, what to check, one line"


@pytest.mark.parametrize("make", BROKEN.values(), ids=BROKEN.keys())
def test_reading_a_broken_store_makes_cells_unknown(store_path: Path, make: Callable[[Path], None]) -> None:
    make(store_path)
    try:
        store = open_store(f"sqlite:///{store_path}", readonly=True)
        store.observe("r", ["m"], ["b"])
    except ObservationError as error:
        assert str(store_path) in str(error)
    else:
        assert make is _parent_is_a_file, "only a missing store reads as empty"


class _NoCluster:
    """Ports that would fail the test if the pass launched anything: the store is locked, nothing may act."""

    def observe(self, *_: object) -> tuple:
        return ()

    def usable_nodes(self) -> None:
        return None

    def actor_for(self, target: RunTarget):  # pragma: no cover - reaching it is the failure
        raise AssertionError("acted although the store could not be written")


def test_a_lock_held_longer_than_the_busy_timeout_means_planned_only(store_path: Path) -> None:
    SqliteStore(store_path).close()
    holder = sqlite3.connect(store_path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    # a writable open adds missing tables, so it needs the lock too: it fails in one line
    with pytest.raises(StoreUnavailable, match=r"locked.*another process holds a write lock"):
        SqliteStore(store_path, busy_timeout_s=0.05)
    holder.execute("ROLLBACK")
    store = SqliteStore(store_path, busy_timeout_s=0.05)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        fake = _NoCluster()
        ports = ClusterPorts(scheduler=fake, run_dirs=fake, actor_for=fake.actor_for,  # type: ignore[arg-type]
                             submissions_per_minute=6)
        target = RunTarget(evalrun="r", cluster="c1", cells=(cell(),), policy=POLICY)
        [result] = reconcile_pass([target], Store(store, store), {ClusterRef(name="c1"): ports}, NOW, act=True,
                                  holder="me")
    finally:
        holder.execute("ROLLBACK")
        store.close()
    assert not result.acted and "planned only" in result.note and "locked" in result.note
    assert result.plan.cells[0].phase in (Phase.PENDING, Phase.UNKNOWN)


def test_evalctl_on_a_garbage_store_exits_3_with_one_line_and_submits_nothing(tmp_path: Path) -> None:
    store_path = tmp_path / "store.db"
    _garbage(store_path)
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"""
apiVersion: evalrun.io/v1alpha1
kind: EvalCluster
metadata: {{name: local}}
spec: {{scheduler: {{type: local}}, jobsDir: {tmp_path}/jobs, logsDir: {tmp_path}/logs, jobScript: /bin/true}}
---
apiVersion: evalrun.io/v1alpha1
kind: EvalRun
metadata: {{name: r}}
spec: {{cluster: local, models: [org/m-8B], datasets: [DCAgent/tiny]}}
""")
    done = run_evalctl(("reconcile", "--once"), spec=spec, store=f"sqlite:///{store_path}", env=os.environ,
                       check=False)
    assert done.returncode == 3 and "Traceback" not in done.stderr, "a store that cannot be read is not observed"
    store_line, cause = done.stderr.strip().splitlines()  # which store, then why, in one line
    assert store_line == f"store: sqlite:///{store_path} (--store)" and "not a database" in cause
    assert not (tmp_path / "logs").exists(), "nothing was submitted"
