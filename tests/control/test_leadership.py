"""The leader lease on trio's MockClock: a leader that cannot renew stops commanding before its lease ends in the
store, and the next holder gets a higher fencing token. The store is a real SQLite file; its clock is the mock one."""

from __future__ import annotations

from dataclasses import replace

import pytest
import trio
import trio.testing

from llmgw.control.leading import LEASE_NAME, LeaseKeeper, following, lease_ended, leading
from llmgw.control.state import ControlState, Leadership
from llmgw.errors import TemporaryError
from llmgw.store import open_store

TTL = 15.0
BASE = 1_800_000_000.0  # the store's unix seconds at mock time 0


@pytest.fixture
def autojump_clock():
    return trio.testing.MockClock(autojump_threshold=0)


class Plane:
    """What a control plane keeps of its leadership: the state folded from the keeper's transitions, with when
    each change happened (mock seconds)."""

    def __init__(self, store, holder: str):
        self.store, self.holder = store, holder
        self.state = ControlState()
        self.changes: list[tuple[float, Leadership]] = []
        self.answering = True
        self.keeper = LeaseKeeper(self.acquire, self.update, ttl=TTL, holder=holder)

    async def acquire(self) -> tuple[int, str | None]:
        if not self.answering:
            await trio.sleep_forever()  # a database that stopped answering
        now = BASE + trio.current_time()
        token = self.store.acquire_lease(LEASE_NAME, self.holder, TTL, now)
        return token, self.holder if token else self.store.lease_holder(LEASE_NAME, now)

    def update(self, transition, reason: str) -> None:
        old = self.state.leadership
        self.state, _ = transition(self.state)
        if self.state.leadership != old:
            self.changes.append((trio.current_time(), self.state.leadership))


async def test_a_leader_whose_store_stops_answering_stops_commanding_before_its_lease_ends(tmp_path, autojump_clock):
    store = open_store(str(tmp_path / "s.sqlite3"))
    a, b = Plane(store, "cp-a"), Plane(store, "cp-b")
    async with trio.open_nursery() as nursery:
        await nursery.start(a.keeper.run)
        await nursery.start(b.keeper.run)
        assert a.state.leadership.leader and a.state.leadership.token == 1
        assert not b.state.leadership.leader and b.state.leadership.holder == "cp-a"
        await trio.sleep(31)  # between two renewals (every 5 s), so which one was last is certain
        assert a.state.leadership.leader and len(a.changes) >= 1  # renewed all along
        last_renewal = 30.0
        assert store.lease(LEASE_NAME, BASE + 31).expires_at == BASE + last_renewal + TTL
        a.answering = False
        await trio.sleep(TTL * 2)
        nursery.cancel_scope.cancel()
    stepped_down_at = next(t for t, leadership in a.changes if not leadership.leader)
    lease_end = last_renewal + TTL
    assert stepped_down_at <= lease_end - a.keeper.margin  # before the store's lease ended, by the margin
    took_over_at, taken = next((t, s) for t, s in b.changes if s.leader)
    assert took_over_at >= lease_end and taken.token == 2 and taken.holder == "cp-b"
    assert stepped_down_at < took_over_at  # never two leaders at once


async def test_a_renewal_that_raises_is_a_missed_renewal_and_the_next_one_restores_the_term(autojump_clock):
    calls = []

    async def flaky() -> tuple[int, str | None]:
        calls.append(trio.current_time())
        if len(calls) in (2, 3, 4):
            raise TemporaryError("the store did not answer")
        return 5, "me"

    plane = Plane(None, "me")
    keeper = LeaseKeeper(flaky, plane.update, ttl=TTL, holder="me")
    async with trio.open_nursery() as nursery:
        await nursery.start(keeper.run)
        await trio.sleep(TTL * 2)
        nursery.cancel_scope.cancel()
    assert [(t, s.leader, s.token) for t, s in plane.changes] == [
        (0.0, True, 5),                            # won at 0
        (TTL - keeper.margin, False, 0),           # 5, 10 and 15 s failed: stepped down at 12 s
        (20.0, True, 5),                           # the renewal at 20 s held the same term again
    ] + [(t, True, 5) for t, _ in plane.changes[3:]]


def test_a_late_lease_end_leaves_a_renewed_or_newer_term_alone():
    state = ControlState()
    state, relevant = leading("me", 3, 12.0)(state)
    assert relevant and state.leadership == Leadership(True, "me", 3, 12.0)
    assert leading("me", 3, 17.0)(state)[1] is False  # a plain renewal wakes no pass
    renewed = replace(state, leadership=Leadership(True, "me", 3, 17.0))
    assert lease_ended(3, 12.0)(renewed) == (renewed, False)
    newer = replace(state, leadership=Leadership(True, "me", 4, 12.0))
    assert lease_ended(3, 12.0)(newer) == (newer, False)
    ended, relevant = lease_ended(3, 12.0)(state)
    assert relevant and ended.leadership == Leadership(False, None)
    assert following("cp-b")(ended)[0].leadership == Leadership(False, "cp-b")
