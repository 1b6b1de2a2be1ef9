"""Peers of neighbouring versions understand each other: unknown fields are kept, the version travels."""

from __future__ import annotations

import trio

from llmgw.wire import agent_message, memory_link_pair, pb


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def newer_agent_heartbeat_bytes(protocol: int) -> bytes:
    """What a newer agent would send: a Heartbeat plus field 99 (a string) and field 100 (a varint) we don't know."""
    known = agent_message(heartbeat=pb.Heartbeat(time=7.0, cpu_percent=12.5))
    known.protocol = protocol
    unknown_string = _varint(99 << 3 | 2) + _varint(len(b"future")) + b"future"
    unknown_varint = _varint(100 << 3 | 0) + _varint(123456)
    return known.SerializeToString() + unknown_string + unknown_varint


def test_message_with_unknown_fields_parses_and_keeps_its_known_fields() -> None:
    message = pb.AgentMessage.FromString(newer_agent_heartbeat_bytes(protocol=2))
    assert message.protocol == 2
    assert message.heartbeat.time == 7.0
    assert message.heartbeat.cpu_percent == 12.5
    assert not message.heartbeat.HasField("load1")  # unmeasured stays absent, not 0


def test_unknown_fields_survive_a_relay_so_a_newer_receiver_still_sees_them() -> None:
    data = newer_agent_heartbeat_bytes(protocol=2)
    relayed = pb.AgentMessage.FromString(data).SerializeToString()
    assert b"future" in relayed


async def test_newer_peer_message_crosses_a_link_with_its_version() -> None:
    agent_end, control_end = memory_link_pair()
    await agent_end.send(pb.AgentMessage.FromString(newer_agent_heartbeat_bytes(protocol=3)))
    received = await control_end.receive()
    assert control_end.peer_protocol == 3
    assert received.heartbeat.time == 7.0
    with trio.fail_after(1):
        await agent_end.aclose()
