"""The act-lease: one holder at a time, until it expires; the clock is always passed in."""

from __future__ import annotations

from datetime import timedelta

from controller.adapters.store.sqlite import SqliteStore
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
