"""A costly plan is made in a worker thread while the control loop keeps folding events (heartbeats wait for no
plan), and the pass then acts on the state as it is once the plan is ready. Real time and a real thread: the plan
stands in for 2,000 nodes' worth of planning by waiting, in its thread, until the test has seen events folded."""

from __future__ import annotations

import threading
from dataclasses import replace

import trio

from llmgw.control.handling import Handlers, every_command

from llmgw.control.deciding import plan_stage
from llmgw.control.looping import PLAN_ASIDE_AFTER, ControlLoop
from llmgw.control.state import ControlState

from .test_decide_invariants import random_state


async def sent(command) -> None:
    """Every command is answered at once."""


def test_heartbeats_are_folded_while_a_costly_plan_is_made():
    state, _ = random_state(3)
    state = replace(state, plan_basis=None)
    planning, folded_meanwhile = threading.Event(), threading.Event()
    seen: list[int] = []

    def costly_plan(of: ControlState):
        planning.set()
        folded_meanwhile.wait(timeout=3.0)  # on the loop's thread (the old way) nothing can be folded meanwhile
        return plan_stage(of)

    def beat(state: ControlState):
        seen.append(1)
        return state, False

    async def main() -> None:
        loop = ControlLoop(state, Handlers(every_command(sent)), interval=lambda: 3600.0, plan=costly_plan)
        loop.plan_cost = PLAN_ASIDE_AFTER * 10  # the last plan from scratch was costly
        async with trio.open_nursery() as nursery:
            await nursery.start(loop.run)
            loop.kick("a node registered")
            assert await trio.to_thread.run_sync(planning.wait, 5.0)
            for _ in range(50):
                loop.update(beat, "heartbeat")
            with trio.move_on_after(2.0):
                while len(seen) < 50:
                    await trio.sleep(0.01)
            assert len(seen) == 50 and loop.state.passes == state.passes  # folded, and the pass still planning
            folded_meanwhile.set()
            with trio.fail_after(5.0):
                record = await loop.wait_pass()
            nursery.cancel_scope.cancel()
        assert record.number == state.passes + 1 and loop.planned_aside == 1

    trio.run(main)
