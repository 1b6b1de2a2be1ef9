"""The store called from trio: worker threads through `trio.to_thread.run_sync` and directly."""

from __future__ import annotations

import trio

from llmgw.routes import Quota
from llmgw.store import Reservation, Store, UsageRecord

from .conftest import rows

NOW = 1_800_000_000.0


async def test_many_trio_tasks_reserve_and_settle_through_worker_threads(store: Store) -> None:
    scopes = [("project:chat", Quota(concurrent_requests=3, tokens_per_minute=2_000))]
    admitted: list[int] = []

    async def request(index: int) -> None:
        outcome = await trio.to_thread.run_sync(store.reserve, scopes, 100, 0.0, NOW)
        if not isinstance(outcome, Reservation):
            return
        admitted.append(index)
        try:
            await trio.sleep(0.01)
        finally:
            with trio.move_on_after(5, shield=True):
                record = UsageRecord("chat", "gemma", NOW, prompt_tokens=60, completion_tokens=40)
                await trio.to_thread.run_sync(lambda: store.settle(outcome, 100, 0.0, NOW, usage=record))

    async with trio.open_nursery() as nursery:
        for index in range(32):
            nursery.start_soon(request, index)
    assert 3 <= len(admitted) <= 20
    assert store.query_usage()[0].requests == len(admitted)
    assert rows(store, "SELECT count(*) FROM quota_slots") == [(0,)]
    # Directly on the event loop thread works too (a short block).
    assert isinstance(store.reserve(scopes, 100, 0.0, NOW + 60), Reservation)
