"""The leader lease while the trio loop is busy: renewed from its own thread, a lease outlives task steps longer
than itself, and a standby cannot take it; a store that stops answering still makes the leader step down before the
store's lease ends. Real SQLite store, real threads: a blocked loop cannot be simulated on MockClock, so the loop is
blocked for real (`time.sleep` inside a task step) with a lease of 0.6 s; each test takes about 2 s. A loop that
takes no answer at all (hung) stops the renewals."""

from __future__ import annotations

import threading
import time

import trio

from llmgw.control.leading import LEASE_NAME, LeaseKeeper
from llmgw.control.renewing import RenewalThread
from llmgw.control.state import ControlState
from llmgw.errors import TemporaryError
from llmgw.store import open_store

TTL = 0.6


class Plane:
    """The leadership a control plane folds from its keeper, with every change (trio seconds, leader or not)."""

    def __init__(self, store, holder: str, *, threaded: bool):
        self.store, self.holder = store, holder
        self.state = ControlState()
        self.changes: list[tuple[float, bool]] = []
        self.failing = False
        self.keeper = LeaseKeeper(self.acquire, self.update, ttl=TTL, holder=holder,
                                  acquire_sync=self.acquire_sync if threaded else None)

    def acquire_sync(self) -> tuple[int, str | None]:
        if self.failing:
            raise TemporaryError("the store did not answer")
        token = self.store.acquire_lease(LEASE_NAME, self.holder, TTL)
        return token, self.holder if token else self.store.lease_holder(LEASE_NAME)

    async def acquire(self) -> tuple[int, str | None]:
        return await trio.to_thread.run_sync(self.acquire_sync)

    def update(self, transition, reason: str) -> None:
        old = self.state.leadership.leader
        self.state, _ = transition(self.state)
        if self.state.leadership.leader != old:
            self.changes.append((trio.current_time(), self.state.leadership.leader))


def standby_tries(store, results: list[int]) -> None:
    """Another control plane's attempts to take the lease, from a thread, while the loop is blocked."""
    for _ in range(6):
        results.append(store.acquire_lease(LEASE_NAME, "cp-b", TTL))
        time.sleep(TTL / 3)


async def run_blocked(plane: Plane, block: float, standby: list[int]) -> None:
    async with trio.open_nursery() as nursery:
        await nursery.start(plane.keeper.run)
        await trio.sleep(TTL)
        threading.Thread(target=standby_tries, args=(plane.store, standby), daemon=True).start()
        time.sleep(block)  # one task step of `block` seconds: the loop looks at no timer meanwhile
        await trio.sleep(TTL / 2)
        nursery.cancel_scope.cancel()


async def test_a_loop_busy_longer_than_the_lease_keeps_leading_and_no_standby_takes_over(tmp_path):
    store = open_store(str(tmp_path / "s.sqlite3"))
    plane, standby = Plane(store, "cp-a", threaded=True), []
    await run_blocked(plane, 3 * TTL, standby)
    assert plane.changes[0][1] and [leader for _, leader in plane.changes] == [True]  # never stepped down
    assert standby and set(standby) == {0}  # the lease stayed held in the store all along


async def test_without_the_thread_the_same_busy_loop_lets_the_lease_lapse(tmp_path):
    store = open_store(str(tmp_path / "s.sqlite3"))
    plane, standby = Plane(store, "cp-a", threaded=False), []
    await run_blocked(plane, 3 * TTL, standby)
    assert [leader for _, leader in plane.changes][:2] == [True, False]  # stepped down once the loop woke
    assert any(standby)  # and the standby took the lease meanwhile


async def test_a_leader_whose_store_fails_in_the_thread_steps_down_before_its_lease_ends(tmp_path):
    store = open_store(str(tmp_path / "s.sqlite3"))
    plane = Plane(store, "cp-a", threaded=True)
    async with trio.open_nursery() as nursery:
        await nursery.start(plane.keeper.run)
        await trio.sleep(TTL)
        plane.failing = True
        failed_after = trio.current_time()
        last = store.lease(LEASE_NAME)
        assert last is not None
        await trio.sleep(2 * TTL)
        nursery.cancel_scope.cancel()
    assert [leader for _, leader in plane.changes] == [True, False]
    stepped_down_at = plane.changes[1][0]
    # the store's lease ends at most TTL after the last renewal asked before the failures began
    assert stepped_down_at - failed_after <= TTL - plane.keeper.margin + 0.05
    assert store.lease(LEASE_NAME) is None  # it did lapse in the store: nothing renewed it


def test_a_hung_loop_is_not_kept_leading():
    attempts: list[float] = []

    def acquire() -> tuple[int, str | None]:
        attempts.append(time.monotonic())
        return 1, "cp-a"

    thread = RenewalThread(acquire, lambda: None, interval=0.02, hang_limit=0.1)  # the loop never takes an answer
    thread.start()
    time.sleep(0.4)
    thread.stop(wait=1.0)
    assert attempts and attempts[-1] - attempts[0] <= 0.15  # it stopped asking once the loop looked hung
