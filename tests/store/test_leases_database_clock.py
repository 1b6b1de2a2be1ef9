"""Lease expiry reads the database's clock (issue 26, a LOW item): a control plane whose own clock runs an hour
ahead does not take a lease another still holds (with each one's own clock, a skew of D seconds was D seconds of two
leaders), and one whose clock runs behind still sees an expired lease as free. Both backends."""

from __future__ import annotations

import time

import pytest

from llmgw.store import open_store
from llmgw.store import sqlstore

SKEW = 3600.0


class SkewedTime:
    """The `time` module a control plane with a skewed clock would see: `time()` off by `offset` seconds."""

    def __init__(self, offset: float):
        self.offset = offset

    def time(self) -> float:
        return time.time() + self.offset

    def __getattr__(self, name: str):
        return getattr(time, name)


def test_a_clock_an_hour_ahead_does_not_take_a_held_lease(store, store_url, monkeypatch):
    assert store.acquire_lease("leader", "a", 30.0) == 1
    other = open_store(store_url)
    try:
        monkeypatch.setattr(sqlstore, "time", SkewedTime(SKEW))  # b's clock: an hour ahead
        assert other.acquire_lease("leader", "b", 30.0) == 0
        assert other.lease_holder("leader") == "a"
        monkeypatch.setattr(sqlstore, "time", SkewedTime(-SKEW))  # and an hour behind: a released lease is free
        store.release_lease("leader", "a")
        assert other.acquire_lease("leader", "b", 30.0) == 2 and store.lease_holder("leader") == "b"
    finally:
        other.close()


@pytest.mark.parametrize("ttl", [0.3])
def test_a_lease_expires_by_the_databases_clock(store, ttl):
    assert store.acquire_lease("leader", "a", ttl) == 1
    assert store.lease("leader").holder == "a"
    deadline = time.monotonic() + 5
    while store.lease("leader") is not None:
        assert time.monotonic() < deadline, "the lease never expired"
        time.sleep(0.05)
    assert store.acquire_lease("leader", "b", 10.0) == 2
