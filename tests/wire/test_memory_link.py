"""The in-process link used by `llmgw up` behaves like the gRPC one."""

from __future__ import annotations

import pytest
import trio

from llmgw.errors import WireError
from llmgw.wire import agent_message, control_message, memory_link_pair, pb


async def test_messages_round_trip_in_both_directions_as_copies() -> None:
    agent_end, control_end = memory_link_pair()
    register = agent_message(register=pb.Register(node_id="n1", cpu_cores=16, labels={"rack": "a"}))
    await agent_end.send(register)
    received = await control_end.receive()
    assert received == register and received is not register
    await control_end.send(control_message(command_id="c1", stop_shard=pb.StopShard(shard_id="m-0/0")))
    reply = await agent_end.receive()
    assert (reply.command_id, reply.stop_shard.shard_id, agent_end.peer_protocol) == ("c1", "m-0/0", 1)


async def test_agent_closing_ends_the_control_planes_receive_after_buffered_messages() -> None:
    agent_end, control_end = memory_link_pair()
    for t in range(3):
        await agent_end.send(agent_message(heartbeat=pb.Heartbeat(time=t)))
    await agent_end.aclose()
    times = [message.heartbeat.time async for message in control_end]
    assert times == [0, 1, 2]
    with pytest.raises(trio.EndOfChannel):
        await control_end.receive()


async def test_control_plane_closing_wakes_a_waiting_agent_receive() -> None:
    agent_end, control_end = memory_link_pair()
    async with trio.open_nursery() as nursery:
        ended = trio.Event()

        async def wait_for_end() -> None:
            with pytest.raises(trio.EndOfChannel):
                await agent_end.receive()
            ended.set()

        nursery.start_soon(wait_for_end)
        await trio.testing.wait_all_tasks_blocked()
        await control_end.aclose()
        with trio.fail_after(1):
            await ended.wait()


async def test_sending_to_a_closed_peer_raises_wire_error() -> None:
    agent_end, control_end = memory_link_pair()
    await control_end.aclose()
    with pytest.raises(WireError, match="closed"):
        await agent_end.send(agent_message(heartbeat=pb.Heartbeat()))


async def test_a_link_is_an_async_context_manager_that_closes_it() -> None:
    agent_end, control_end = memory_link_pair()
    async with agent_end:
        await agent_end.send(agent_message(heartbeat=pb.Heartbeat(time=1)))
    assert [m.heartbeat.time async for m in control_end] == [1]


async def test_sending_the_other_directions_message_type_is_a_type_error() -> None:
    agent_end, _ = memory_link_pair()
    with pytest.raises(TypeError, match="sends AgentMessage, not ControlMessage"):
        await agent_end.send(control_message(restart=pb.Restart()))


async def test_statistics_say_what_the_peer_has_not_taken_whether_it_waits_and_whether_it_closed() -> None:
    agent_end, control_end = memory_link_pair()
    for t in range(2):
        await agent_end.send(agent_message(heartbeat=pb.Heartbeat(time=t)))
    sent = agent_end.statistics()
    assert (sent.current_buffer_used, sent.tasks_waiting_receive, sent.open_receive_channels) == (2, 0, 1)
    async with trio.open_nursery() as nursery:
        async def drain() -> None:
            async for _message in control_end:
                pass

        nursery.start_soon(drain)
        await trio.testing.wait_all_tasks_blocked()
        sent = agent_end.statistics()
        assert (sent.current_buffer_used, sent.tasks_waiting_receive) == (0, 1)  # it took both and waits
        nursery.cancel_scope.cancel()
    await control_end.aclose()
    assert agent_end.statistics().open_receive_channels == 0
