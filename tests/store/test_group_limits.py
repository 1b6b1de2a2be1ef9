"""`Groups` itself (llmgw.store.grouping), on plain write functions: the group size bound and the write made
without waiting. The store's use of it is in test_group_commit.py."""

from __future__ import annotations

import trio
import trio.testing

from llmgw.store.grouping import Groups


async def test_a_group_holds_at_most_limit_items_and_the_rest_go_in_the_next_groups() -> None:
    written: list[list[int]] = []
    gate = trio.Event()

    async def write(items: list[int]) -> list[int]:
        written.append(list(items))
        await gate.wait()
        return [item * 10 for item in items]

    groups = Groups(write, limit=2, abandon=False)
    outcomes: dict[int, int] = {}

    async def submit(item: int) -> None:
        outcomes[item] = await groups.submit(item)

    async with trio.open_nursery() as nursery:
        for item in range(5):
            nursery.start_soon(submit, item)
        await trio.testing.wait_all_tasks_blocked()
        gate.set()
    # the first caller writes alone; the four queued meanwhile go two by two (trio picks who starts first)
    assert [len(group) for group in written] == [1, 2, 2] and groups.groups == 3
    assert sorted(item for group in written for item in group) == list(range(5))
    assert outcomes == {item: item * 10 for item in range(5)}


async def test_a_store_that_can_write_without_waiting_writes_the_group_on_the_loops_thread() -> None:
    async def write(items: list[str]) -> list[str]:
        raise AssertionError("write_nowait took the group")

    groups = Groups(write, limit=8, abandon=True, write_nowait=lambda items: [f"{item}!" for item in items])
    assert await groups.submit("a") == "a!"
    assert groups.abandon is True and groups.limit == 8
