"""Real gRPC between two processes on 127.0.0.1: the Connect stream as a Link, its ends and its failures."""

from __future__ import annotations

import subprocess
import sys

import pytest
import trio

from llmgw.errors import WireError
from llmgw.wire import agent_message, connect, pb, serve_agents

from .conftest import HERE, ControlPlaneProcess
from .test_mixed_versions import newer_agent_heartbeat_bytes


async def test_agent_messages_round_trip_with_the_protocol_version(plain_control_plane: ControlPlaneProcess) -> None:
    async with connect(plain_control_plane.address) as link:
        await link.send(agent_message(register=pb.Register(node_id="n1")))
        reply = await link.receive()
        assert reply.registered.node_id == "n1"
        assert reply.registered.control_plane_version == "cert=None"  # plaintext: no certificate
        assert link.peer_protocol == 1
        for t in range(20):
            await link.send(agent_message(heartbeat=pb.Heartbeat(time=t)))
        answers = [(await link.receive()).command_id for _ in range(20)]
        assert answers == [f"1:{t}" for t in range(20)]


async def test_message_from_a_newer_agent_with_unknown_fields_is_accepted(
    plain_control_plane: ControlPlaneProcess,
) -> None:
    async with connect(plain_control_plane.address) as link:
        await link.send(pb.AgentMessage.FromString(newer_agent_heartbeat_bytes(protocol=2)))
        reply = await link.receive()
        assert reply.command_id == "2:7"  # the server saw version 2 and the known fields


async def test_agent_closing_its_side_ends_the_handlers_receive(plain_control_plane: ControlPlaneProcess) -> None:
    async with connect(plain_control_plane.address) as link:
        await link.send(agent_message(heartbeat=pb.Heartbeat(time=1)))
        await link.receive()
    assert (await plain_control_plane.next_event()).startswith("closed ipv4:127.0.0.1:")


async def test_handler_returning_ends_the_agents_receive(plain_control_plane: ControlPlaneProcess) -> None:
    async with connect(plain_control_plane.address) as link:
        await link.send(agent_message(heartbeat=pb.Heartbeat(time=1)))
        await link.send(agent_message(log_lines=pb.LogLines(lines=["bye"])))
        assert (await link.receive()).command_id == "1:1"  # sent before the handler returned: still delivered
        with trio.fail_after(5), pytest.raises(trio.EndOfChannel):
            await link.receive()
        with pytest.raises(WireError, match="the control plane ended the stream"):
            await link.send(agent_message(heartbeat=pb.Heartbeat(time=2)))


async def test_handler_raising_reaches_the_agent_as_a_wire_error_with_its_sentence(
    plain_control_plane: ControlPlaneProcess,
) -> None:
    async with connect(plain_control_plane.address) as link:
        await link.send(agent_message(log_lines=pb.LogLines(lines=["fail"])))
        with trio.fail_after(5), pytest.raises(WireError, match="the test asked this stream to fail"):
            await link.receive()
        with pytest.raises(WireError):
            await link.send(agent_message(heartbeat=pb.Heartbeat()))


async def test_cancelled_receive_loses_no_message(plain_control_plane: ControlPlaneProcess) -> None:
    async with connect(plain_control_plane.address) as link:
        with trio.move_on_after(0.2):
            await link.receive()  # nothing comes: times out without harming the stream
        await link.send(agent_message(heartbeat=pb.Heartbeat(time=3)))
        with trio.fail_after(5):
            assert (await link.receive()).command_id == "1:3"


async def test_unreachable_control_plane_raises_a_wire_error_naming_the_address() -> None:
    with trio.socket.socket() as sock:  # a port nobody listens on
        await sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with trio.fail_after(15), pytest.raises(WireError, match=f"cannot reach the control plane at 127.0.0.1:{port}"):
        async with connect(f"127.0.0.1:{port}", timeout=5):
            pass


async def test_agent_process_killed_cancels_a_handler_that_is_not_reading() -> None:
    # A handler blocked in receive() sees the end of the stream instead (trio.EndOfChannel): grpc reports a
    # vanished client to a pending read as end of stream. One busy elsewhere must be cancelled.
    registered, cancelled = trio.Event(), trio.Event()

    async def handler(link, peer: str) -> None:  # type: ignore[no-untyped-def]
        message = await link.receive()
        await link.send(pb.ControlMessage(registered=pb.Registered(node_id=message.register.node_id)))
        registered.set()
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            cancelled.set()
            raise

    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve_agents, handler, "127.0.0.1", 0)
        agent = subprocess.Popen(
            [sys.executable, str(HERE / "agent_script.py"), f"127.0.0.1:{port}"], stdout=subprocess.PIPE, text=True
        )
        try:
            with trio.fail_after(20):
                await registered.wait()
                assert agent.stdout is not None
                assert await trio.to_thread.run_sync(agent.stdout.readline) == "REGISTERED\n"
            agent.kill()
            with trio.fail_after(10):
                await cancelled.wait()
        finally:
            agent.kill()
            agent.wait()
        nursery.cancel_scope.cancel()


async def test_control_plane_process_killed_breaks_the_agents_receive(
    plain_control_plane: ControlPlaneProcess,
) -> None:
    async with connect(plain_control_plane.address) as link:
        await link.send(agent_message(heartbeat=pb.Heartbeat(time=1)))
        await link.receive()
        plain_control_plane.process.kill()
        with trio.fail_after(10), pytest.raises(WireError, match="broke"):
            await link.receive()


async def test_serving_on_a_port_in_use_raises_a_wire_error(plain_control_plane: ControlPlaneProcess) -> None:
    async def handler(link, peer: str) -> None:  # type: ignore[no-untyped-def]
        pass

    with trio.fail_after(10), pytest.raises(WireError, match=f"cannot listen for agents on 127.0.0.1:{plain_control_plane.port}"):
        await serve_agents(handler, "127.0.0.1", plain_control_plane.port)


async def test_two_agents_are_served_at_once_each_on_its_own_stream(plain_control_plane: ControlPlaneProcess) -> None:
    async with connect(plain_control_plane.address) as first, connect(plain_control_plane.address) as second:
        await first.send(agent_message(register=pb.Register(node_id="first")))
        await second.send(agent_message(register=pb.Register(node_id="second")))
        await second.send(agent_message(heartbeat=pb.Heartbeat(time=2)))
        await first.send(agent_message(heartbeat=pb.Heartbeat(time=1)))
        with trio.fail_after(5):
            assert (await second.receive()).registered.node_id == "second"
            assert (await second.receive()).command_id == "1:2"
            assert (await first.receive()).registered.node_id == "first"
            assert (await first.receive()).command_id == "1:1"
