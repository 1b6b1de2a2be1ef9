"""The console's sampler (`Console.sample`, which `run_sampler` calls every `sample_interval` seconds): it folds
each heartbeat's GPU readings once and remembers every pass it sees."""

from __future__ import annotations

from dataclasses import replace

from llmgw.console import Console, Login
from llmgw.control.readings import GpuSample, NodeReadings
from llmgw.control.registry import FleetRegistry
from llmgw.control.state import ControlState, PassRecord
from llmgw.plan.types import GpuState, NodeState

from .test_console_security import no_history


async def nobody(token: str) -> Login | None:
    """A token check that lets nobody in."""
    return None


GIB = 1 << 30


async def test_the_sampler_folds_new_readings_and_keeps_the_passes_it_saw():
    registry, _ = FleetRegistry(30.0).register(NodeState("n1", gpus=(GpuState("0", "h200-141g", GIB, GIB),)), 0.0)
    state = {"now": ControlState(fleet=registry)}
    wall = {"now": 60.0 * 1000}

    def beat(at: float, util: float, number: int) -> None:
        fleet, _ = state["now"].fleet.heartbeat("n1", at, readings=NodeReadings(at=at, gpus=(
            GpuSample(0, utilization_percent=util),)))
        state["now"] = replace(state["now"], fleet=fleet, last_pass=PassRecord(number, "timer", None, at, 0.1))

    console = Console(lambda: state["now"], authorise=nobody, history=no_history, sample_interval=5.0,
                      wall=lambda: wall["now"])
    # Samples are taken by hand, as `run_sampler` takes them every 5 s: a clock that jumps after real idleness
    # raced the fold's worker thread on a loaded machine (seen once: a sample was skipped).
    beat(1.0, 80.0, 1)
    for _ in range(3):  # three samples of the same heartbeat: folded once
        await console.sample()
    beat(13.0, 40.0, 2)
    await console.sample()
    wall["now"] += 60.0  # the next minute
    beat(19.0, 10.0, 3)
    await console.sample()
    means = console.gpu_history.node("n1")[0].means(1001)
    assert [m[1] for m in means[-2:]] == [60.0, 10.0]  # (80 + 40) / 2, then 10 in the next minute
    assert [p.number for p in console.passes] == [1, 2, 3]
