"""The stall recorder names the trio task that held the loop, for how long, and where it was meanwhile."""

from __future__ import annotations

import time

import trio

from llmgw.control.stalls import StallRecorder, from_environment


def hold_the_loop(seconds: float) -> None:
    time.sleep(seconds)  # a synchronous step, as a status document built on the loop thread


async def busy_task() -> None:
    await trio.sleep(0)
    hold_the_loop(0.3)
    await trio.sleep(0)


async def quick_task() -> None:
    for _ in range(20):
        await trio.sleep(0)


def test_a_long_task_step_is_recorded_with_its_task_and_a_stack_sample():
    recorder = StallRecorder(threshold=0.1)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(busy_task, name="busy-task")
            nursery.start_soon(quick_task, name="quick-task")

    trio.run(main, instruments=[recorder])
    assert [stall.task for stall in recorder.stalls] == ["busy-task"]
    stall = recorder.stalls[0]
    assert 0.3 <= stall.seconds < 1.0
    assert any("hold_the_loop" in line for line in stall.stack)


def test_the_environment_turns_it_on(monkeypatch):
    monkeypatch.delenv("LLMGW_STALL_MS", raising=False)
    assert from_environment() == []
    monkeypatch.setenv("LLMGW_STALL_MS", "50")
    [recorder] = from_environment()
    assert recorder.threshold == 0.05
