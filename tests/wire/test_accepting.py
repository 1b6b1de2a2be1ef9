"""A control plane whose trio loop is busy still accepts a burst of agents at once (real gRPC between processes).

grpc.aio's server takes the next incoming call only after the previous one reached Python, and gRPC's core cancels
a call left waiting 30 s (`grpc.server_max_unrequested_time_in_server`): the agent sees `CANCELLED`. With grpc.aio on
a trio-asyncio loop, every step of that waited for a turn of trio's scheduler, so a loop with 50 ms of work per turn
accepted about one agent a second, and a fleet joining at once reconnected in a storm (docs/scale.md, issue 18).
"""

from __future__ import annotations

import time

import trio

from llmgw.errors import WireError
from llmgw.wire import agent_message, connect, pb

AGENTS = 100
ALL_REGISTERED_WITHIN = 15.0  # seconds; about 1 s here with grpc.aio on its own thread, > 30 s before


async def test_a_busy_control_plane_accepts_a_burst_of_agents(busy_control_plane) -> None:
    waited: list[float] = []
    failures: list[str] = []
    started = time.monotonic()

    async def agent(n: int) -> None:
        try:
            async with connect(busy_control_plane.address, timeout=60) as link:
                await link.send(agent_message(register=pb.Register(node_id=f"node-{n}")))
                answer = await link.receive()
                assert answer.registered.node_id == f"node-{n}"
                waited.append(time.monotonic() - started)
        except WireError as exc:  # e.g. "the stream ended with an error (CANCELLED: CANCELLED)"
            failures.append(str(exc))

    with trio.move_on_after(ALL_REGISTERED_WITHIN):
        async with trio.open_nursery() as nursery:
            for n in range(AGENTS):
                nursery.start_soon(agent, n)
    assert not failures, f"{len(failures)} streams failed, e.g. {failures[0]}"
    assert len(waited) == AGENTS, (
        f"only {len(waited)} of {AGENTS} agents were registered within {ALL_REGISTERED_WITHIN:g} s"
    )
