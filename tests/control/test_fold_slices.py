"""A backlog of events is folded in slices: other trio tasks (timers, the gRPC thread's hand-offs, the lease) run
between them, and every event is still folded in order. Counted per trio task step, not timed: the loop folds
`FOLD_CHUNK` events at a time and lets other tasks run once a chunk has taken `FOLD_SLICE` (a timed version of this
test failed once under load, a step of 0.29 s against 0.2 s)."""

from __future__ import annotations

import time

import trio

from llmgw.control.handling import Handlers, every_command

from llmgw.control.looping import FOLD_CHUNK, FOLD_SLICE, ControlLoop
from llmgw.control.state import ControlState


async def never(command) -> None:
    raise AssertionError("no pass should command anything")


class StepCounter(trio.abc.Instrument):
    """Numbers every task step, so a transition can say in which step it ran."""

    def __init__(self) -> None:
        self.step = 0

    def before_task_step(self, task) -> None:
        self.step += 1


def test_a_backlog_of_slow_transitions_is_folded_in_slices_in_order():
    counter = StepCounter()
    folded: list[tuple[int, int]] = []  # (event number, task step it was folded in)
    cost = 0.002  # a costly fold, as a heartbeat of a 2,000-node fleet under load: a chunk takes over FOLD_SLICE
    assert FOLD_CHUNK * cost > FOLD_SLICE

    def slow(number: int):
        def transition(state: ControlState):
            time.sleep(cost)
            folded.append((number, counter.step))
            return state, False
        return transition

    async def main() -> None:
        loop = ControlLoop(ControlState(), Handlers(every_command(never)), interval=lambda: 3600.0)
        async with trio.open_nursery() as nursery:
            await nursery.start(loop.run)
            for number in range(300):
                loop.update(slow(number), "heartbeat")
            while len(folded) < 300:
                await trio.sleep(0.01)
            nursery.cancel_scope.cancel()

    trio.run(main, instruments=[counter])
    assert [number for number, _ in folded] == list(range(300))
    per_step: dict[int, int] = {}
    for _, step in folded:
        per_step[step] = per_step.get(step, 0) + 1
    # One chunk per step (the first step also folds the event that woke the loop): other tasks ran between chunks.
    assert max(per_step.values()) <= FOLD_CHUNK + 1
    assert len(per_step) >= 300 // (FOLD_CHUNK + 1)
