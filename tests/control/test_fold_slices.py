"""A backlog of events is folded in slices: other trio tasks (timers, the gRPC thread's hand-offs, the lease) run
between them, and every event is still folded in order. Real time: the transitions cost real CPU (about 0.6 s in
all) and the stall recorder measures the loop's task steps."""

from __future__ import annotations

import time

import trio

from llmgw.control.looping import ControlLoop
from llmgw.control.state import ControlState
from llmgw.control.stalls import StallRecorder


async def never(action, settings) -> None:
    raise AssertionError("no pass should command anything")


def test_a_backlog_of_slow_transitions_never_holds_the_loop_for_long():
    recorder = StallRecorder(threshold=0.2)
    folded: list[int] = []

    def slow(number: int):
        def transition(state: ControlState):
            time.sleep(0.002)  # a costly fold, as a heartbeat of a 2,000-node fleet under load
            folded.append(number)
            return state, False
        return transition

    async def main() -> None:
        loop = ControlLoop(ControlState(), never, interval=lambda: 3600.0)
        async with trio.open_nursery() as nursery:
            await nursery.start(loop.run)
            for number in range(300):
                loop.update(slow(number), "heartbeat")
            while len(folded) < 300:
                await trio.sleep(0.01)
            nursery.cancel_scope.cancel()

    trio.run(main, instruments=[recorder])
    assert folded == list(range(300))
    assert [(stall.task, round(stall.seconds, 2)) for stall in recorder.stalls] == []
