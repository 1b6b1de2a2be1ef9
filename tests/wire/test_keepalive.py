"""The control plane's gRPC ping policy accepts the agents' keepalive: a real grpc.aio server and client in one
process, both built from the same constants (llmgw.wire.grpc_link), with the ping interval made 1 s."""

from __future__ import annotations

import trio

from llmgw.wire import agent_message, connect, grpc_link, pb, serve_agents

from .control_plane_script import handler

PING_SECONDS = 1.0  # gRPC's client sends pings at most once a second, whatever its keepalive time
QUIET_INTERVALS = 6


async def test_a_quiet_stream_outlives_many_agent_pings(monkeypatch) -> None:
    # Before the server's policy followed the agents' interval it allowed one ping per 10 s and closed the
    # connection after the third early one ("UNAVAILABLE: Too many pings"), here after about 3 s.
    monkeypatch.setattr(grpc_link, "AGENT_KEEPALIVE_SECONDS", PING_SECONDS)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve_agents, handler, "127.0.0.1", 0)
        async with connect(f"127.0.0.1:{port}") as link:
            await link.send(agent_message(heartbeat=pb.Heartbeat(time=1)))
            with trio.fail_after(10):
                assert (await link.receive()).command_id == "1:1"
            # Neither side writes now: only the agent's keepalive pings cross the connection. A stream the server
            # closed would end this receive with a WireError naming the status.
            with trio.move_on_after(QUIET_INTERVALS * PING_SECONDS) as quiet:
                unexpected = await link.receive()
            assert quiet.cancelled_caught, f"the control plane sent {unexpected} during the quiet time"
            await link.send(agent_message(heartbeat=pb.Heartbeat(time=2)))
            with trio.fail_after(10):
                assert (await link.receive()).command_id == "1:2"  # the same stream still carries messages
        nursery.cancel_scope.cancel()
