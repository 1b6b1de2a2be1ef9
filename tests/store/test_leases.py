"""Leases: one holder at a time, renewable by its holder, free again after its TTL or when released."""

from __future__ import annotations

from pathlib import Path

from llmgw.store import Store, open_store

NOW = 1_800_000_000.0


def test_a_lease_has_one_holder_until_it_expires(store: Store) -> None:
    assert store.acquire_lease("leader", "cp-a", 10.0, NOW)
    assert not store.acquire_lease("leader", "cp-b", 10.0, NOW + 5)
    assert store.lease_holder("leader", NOW + 5) == "cp-a"
    assert store.acquire_lease("leader", "cp-a", 10.0, NOW + 9)  # renewed to NOW + 19
    assert not store.acquire_lease("leader", "cp-b", 10.0, NOW + 18)
    assert store.acquire_lease("leader", "cp-b", 10.0, NOW + 19)
    assert store.lease_holder("leader", NOW + 20) == "cp-b"
    assert store.lease_holder("leader", NOW + 30) is None


def test_only_the_holder_can_release_a_lease(store: Store) -> None:
    store.acquire_lease("apply", "cp-a", 60.0, NOW)
    assert not store.release_lease("apply", "cp-b")
    assert store.release_lease("apply", "cp-a")
    assert store.acquire_lease("apply", "cp-b", 60.0, NOW + 1)
    assert store.acquire_lease("other", "cp-a", 60.0, NOW + 1)  # leases are independent


def test_two_stores_on_one_database_see_each_others_leases(store_url: str) -> None:
    a, b = open_store(store_url), open_store(store_url)
    try:
        assert a.acquire_lease("leader", "cp-a", 10.0, NOW)
        assert not b.acquire_lease("leader", "cp-b", 10.0, NOW + 1)
        a.release_lease("leader", "cp-a")
        assert b.acquire_lease("leader", "cp-b", 10.0, NOW + 1)
    finally:
        a.close()
        b.close()


def test_the_fencing_token_stays_with_its_holder_and_rises_with_every_new_holder(store: Store) -> None:
    first = store.acquire_lease("leader", "cp-a", 10.0, NOW)
    assert first >= 1
    assert store.acquire_lease("leader", "cp-a", 10.0, NOW + 5) == first  # renewal keeps the token
    assert store.acquire_lease("leader", "cp-b", 10.0, NOW + 6) == 0
    second = store.acquire_lease("leader", "cp-b", 10.0, NOW + 15)  # cp-a's lease ended at NOW + 15
    assert second == first + 1
    lease = store.lease("leader", NOW + 16)
    assert lease is not None and (lease.holder, lease.token, lease.expires_at) == ("cp-b", second, NOW + 25)
    # taken again by its holder after it lapsed: nobody else held it in between, so cp-b's commands and audit
    # writes of before the lapse are still the newest term's (a busy leader that renewed late loses nothing)
    assert store.acquire_lease("leader", "cp-b", 10.0, NOW + 40) == second
    assert store.release_lease("leader", "cp-b")
    assert store.lease("leader", NOW + 41) is None
    assert store.acquire_lease("leader", "cp-a", 10.0, NOW + 41) == second + 1  # another holder: higher


def test_two_control_planes_racing_for_an_expired_lease_get_one_token(store_url: str) -> None:
    a, b = open_store(store_url), open_store(store_url)
    try:
        assert a.acquire_lease("leader", "cp-a", 10.0, NOW) == 1
        tokens = [a.acquire_lease("leader", "cp-a2", 10.0, NOW + 11), b.acquire_lease("leader", "cp-b", 10.0, NOW + 11)]
        assert sorted(tokens) == [0, 2]
    finally:
        a.close()
        b.close()
