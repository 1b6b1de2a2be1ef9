"""A SQLite store takes the gateway's per-request writes on the event loop's own thread when they need not wait, and
in a worker thread, as before, when another connection holds the file's write lock."""

from __future__ import annotations

import sqlite3
import threading
import time

import trio
import trio.testing

from llmgw.routes import Quota
from llmgw.store import Reservation, SqliteStore, StoreBoundary, UsageSpool

from .test_spool import NOW, settlement

SCOPES = [("project:chat", Quota(concurrent_requests=2, tokens_per_minute=10_000))]


class _ThreadsSeen(SqliteStore):
    """A real SQLite store that notes which thread ran each reservation group and settlement group it wrote."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.threads: list[tuple[str, int]] = []

    def reserve_many(self, requests):
        outcomes = super().reserve_many(requests)
        self.threads.append(("reserve", threading.get_ident()))
        return outcomes

    def apply_settlements(self, settlements):
        taken = super().apply_settlements(settlements)
        self.threads.append(("settle", threading.get_ident()))
        return taken


async def test_a_free_store_reserves_and_settles_on_the_event_loop_thread_and_frees_the_slot(tmp_path) -> None:
    store = _ThreadsSeen(tmp_path / "llmgw.sqlite3")
    boundary = StoreBoundary(store, UsageSpool(tmp_path / "spool"))
    try:
        reservation = await boundary.reserve(SCOPES, 100, 0.0, NOW)
        assert isinstance(reservation, Reservation)
        assert await boundary.settle(settlement("req_1", reservation, tokens=7, with_charges=True)) is True
        loop = threading.get_ident()
        assert store.threads == [("reserve", loop), ("settle", loop)]
        assert boundary.statistics()["threads_busy"] == 0
        assert boundary.statistics()["pending"] == 0 and store.usage_of_request("req_1") is not None
        assert store.headroom(SCOPES, NOW + 1).tokens.remaining == 10_000 - 7
        assert list(store.table_rows("quota_slots")) == []
    finally:
        boundary.close()
        store.close()


async def test_settles_made_in_one_scheduler_pass_are_one_group_written_on_the_event_loop_thread(tmp_path) -> None:
    scopes = [("project:chat", Quota(concurrent_requests=20, tokens_per_minute=100_000))]
    store = _ThreadsSeen(tmp_path / "llmgw.sqlite3")
    reservations = [store.reserve(scopes, 100, 0.0, NOW) for _ in range(20)]
    store.threads.clear()
    boundary = StoreBoundary(store, UsageSpool(tmp_path / "spool"))
    taken: list[bool] = []

    async def settle(index: int) -> None:
        taken.append(await boundary.settle(settlement(f"req_{index}", reservations[index], tokens=5)))

    try:
        async with trio.open_nursery() as nursery:
            for index in range(20):
                nursery.start_soon(settle, index)
        assert taken == [True] * 20
        assert store.threads == [("settle", threading.get_ident())]  # one transaction, no worker thread
        assert len(store.recent_usage(limit=100)) == 20 and list(store.table_rows("quota_slots")) == []
        assert store.headroom(scopes, NOW + 2).tokens.remaining == 100_000 - 20 * 5
    finally:
        boundary.close()
        store.close()


async def test_a_write_that_would_wait_on_another_connection_waits_in_a_worker_thread_and_lands(tmp_path) -> None:
    """Another connection (another process, say) holds the write lock: `call_nowait` refuses at once instead of
    waiting out the busy timeout on the event loop, the reservation and settlement wait in worker threads (the
    loop keeps running meanwhile), and both land once the lock is free."""
    store = _ThreadsSeen(tmp_path / "llmgw.sqlite3", busy_timeout=10.0)
    boundary = StoreBoundary(store, UsageSpool(tmp_path / "spool"), settle_wait=10.0)
    other = sqlite3.connect(tmp_path / "llmgw.sqlite3", isolation_level=None)
    got: list[object] = []
    try:
        other.execute("BEGIN IMMEDIATE")
        began = time.monotonic()
        try:
            store.call_nowait(store.reserve_many, [(SCOPES, 100, 0.0, NOW)])
            raise AssertionError("call_nowait wrote through another connection's lock")
        except trio.WouldBlock:
            assert time.monotonic() - began < 1.0  # refused at once, not after the 10 s busy timeout

        async def reserve_and_settle() -> None:
            reservation = await boundary.reserve(SCOPES, 100, 0.0, NOW)
            got.append(reservation)
            got.append(await boundary.settle(settlement("req_2", reservation, tokens=9)))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(reserve_and_settle)
            with trio.fail_after(5):
                while not boundary.statistics()["threads_busy"]:  # the loop runs while the write waits in a thread
                    await trio.sleep(0.01)
            await trio.sleep(0.2)
            assert got == []
            other.execute("COMMIT")  # the other writer is done: the waiting write goes through
        assert isinstance(got[0], Reservation) and got[1] is True
        loop = threading.get_ident()
        assert [kind for kind, _thread in store.threads] == ["reserve", "settle"]
        assert store.threads[0][1] != loop  # waited in a worker thread; the settlement found the lock free
        assert store.usage_of_request("req_2") is not None and list(store.table_rows("quota_slots")) == []
    finally:
        other.close()
        boundary.close()
        store.close()
