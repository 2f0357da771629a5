"""The act-lease: one holder at a time, until it expires; the clock is always passed in."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from controller.adapters.store.sqlite import SqliteStore
from controller.core.types import TunnelLease
from tests.store.builders import T0


def test_a_held_lease_excludes_others_until_it_expires(store: SqliteStore) -> None:
    assert store.try_lease("qwen-evals", "operator", 60, T0)
    assert not store.try_lease("qwen-evals", "cli", 60, T0 + timedelta(seconds=59))
    assert store.try_lease("qwen-evals", "cli", 60, T0 + timedelta(seconds=61))
    assert not store.try_lease("qwen-evals", "operator", 60, T0 + timedelta(seconds=62))


def test_the_holder_renews_its_own_lease(store: SqliteStore) -> None:
    assert store.try_lease("qwen-evals", "operator", 60, T0)
    assert store.try_lease("qwen-evals", "operator", 60, T0 + timedelta(seconds=50))

    assert not store.try_lease("qwen-evals", "cli", 60, T0 + timedelta(seconds=100))


def test_release_frees_the_lease_only_for_its_holder(store: SqliteStore) -> None:
    store.try_lease("qwen-evals", "operator", 60, T0)

    store.release_lease("qwen-evals", "cli")
    assert not store.try_lease("qwen-evals", "cli", 60, T0)

    store.release_lease("qwen-evals", "operator")
    store.release_lease("qwen-evals", "operator")
    assert store.try_lease("qwen-evals", "cli", 60, T0)


def test_leases_are_per_name(store: SqliteStore) -> None:
    assert store.try_lease("qwen-evals", "operator", 60, T0)
    assert store.try_lease("other-evals", "cli", 60, T0)


def test_naive_now_is_utc(store: SqliteStore) -> None:
    naive = T0.replace(tzinfo=None)
    assert store.try_lease("qwen-evals", "operator", 60, naive)
    assert not store.try_lease("qwen-evals", "cli", 60, T0 + timedelta(seconds=30))


# --------------------------------------------------------------------------- pinggy tunnel leases


def tunnel(pair: str, holder: str, evalrun: str = "qwen-evals") -> TunnelLease:
    return TunnelLease(pair=pair, holder=holder, evalrun=evalrun, leased_at=T0)


def test_two_stores_on_one_file_never_lease_the_same_pair_twice(store: SqliteStore, db_path: Path) -> None:
    other = SqliteStore(db_path)  # a second reconciler: its own connection to the same file
    try:
        assert store.take_tunnel(tunnel("pair-a", "ev_job_1"))
        assert not other.take_tunnel(tunnel("pair-a", "ev_job_2", evalrun="other-evals"))
        assert other.take_tunnel(tunnel("pair-b", "ev_job_2", evalrun="other-evals"))
        assert store.take_tunnel(tunnel("pair-a", "ev_job_1")), "taking a pair you hold again is a no-op success"
        leases = other.observe("qwen-evals", [], []).tunnel_leases
    finally:
        other.close()
    assert leases == (tunnel("pair-a", "ev_job_1"), tunnel("pair-b", "ev_job_2", evalrun="other-evals"))


def test_a_pair_is_released_only_by_its_holder(store: SqliteStore) -> None:
    store.take_tunnel(tunnel("pair-a", "ev_job_1"))
    store.release_tunnel("pair-a", "ev_job_2")
    assert not store.take_tunnel(tunnel("pair-a", "ev_job_2"))
    store.release_tunnel("pair-a", "ev_job_1")
    store.release_tunnel("pair-a", "ev_job_1")
    assert store.take_tunnel(tunnel("pair-a", "ev_job_2"))
