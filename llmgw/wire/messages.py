"""The protocol's messages: the generated `agent_pb2` module and constructors that stamp the protocol version.

`pb` is `llmgw.wire.agent_pb2`, generated from `agent.proto` (see that file for every field, its unit and the
compatibility rules). Every AgentMessage and ControlMessage carries `protocol`, the sender's PROTOCOL_VERSION;
protobuf keeps unknown fields it parses, so a newer peer's additions are ignored rather than refused.
"""

from __future__ import annotations

from typing import Any

from . import agent_pb2 as pb

PROTOCOL_VERSION = 1
"""The version this code speaks; bump it when the meaning of a field changes (fields are only ever added)."""


def agent_message(**body: Any) -> pb.AgentMessage:
    """An AgentMessage (agent -> control plane) with `protocol` set to PROTOCOL_VERSION.

    `body` takes the message's fields by name, e.g. `agent_message(register=pb.Register(node_id="n1"))`
    or `agent_message(heartbeat=pb.Heartbeat(time=1.5))`; exactly one oneof member is expected.
    Raises: ValueError / TypeError from protobuf when a field name or value type is wrong.
    """
    return pb.AgentMessage(protocol=PROTOCOL_VERSION, **body)


def control_message(**body: Any) -> pb.ControlMessage:
    """A ControlMessage (control plane -> agent) with `protocol` set to PROTOCOL_VERSION.

    `body` takes the fields by name, e.g. `control_message(command_id="c1", stop_shard=pb.StopShard(shard_id=...))`.
    Raises: ValueError / TypeError from protobuf when a field name or value type is wrong.
    """
    return pb.ControlMessage(protocol=PROTOCOL_VERSION, **body)
