"""Link: one agent's message stream to or from the control plane, whatever carries it.

Both transports (gRPC between machines, trio memory channels inside one process for `llmgw up`) present the same
object, so the agent runtime and the control plane never know which one they hold. Messages cross a memory link
as serialized bytes too, so both transports accept and refuse exactly the same things.
"""

from __future__ import annotations

import abc
from typing import Generic, TypeVar

import trio
from google.protobuf.message import DecodeError, Message

from llmgw.errors import WireError

from . import agent_pb2 as pb

Outgoing = TypeVar("Outgoing", bound=Message)
Incoming = TypeVar("Incoming", bound=Message)

MEMORY_LINK_BUFFER = 64
"""Messages a memory link holds in each direction before `send` waits (gRPC buffers similarly)."""


class Link(abc.ABC, Generic[Outgoing, Incoming]):
    """A bidirectional message stream: the agent end sends AgentMessage and receives ControlMessage, the control
    plane end the other way round.

    `send(msg)` queues one message (waits while the buffer is full); `receive()` returns the next message and raises
    `trio.EndOfChannel` once the peer has closed its side and everything it sent has been read. Use it as an async
    iterator (`async for msg in link`) to read until the peer closes, and as an async context manager (or call
    `aclose()`) to close it. One task may send while another receives; concurrent sends (or receives) are serialized.
    `peer_protocol` is the `protocol` of the last message received (None before the first); `peer` describes the
    other end ("ipv4:10.0.0.5:51234", "memory"); `peer_certificate_name` is the common name of the client
    certificate the agent showed (control plane end over mTLS; None otherwise): compare it with Register.node_id.
    """

    peer_protocol: int | None = None
    peer: str = ""
    peer_certificate_name: str | None = None
    outgoing_type: type[Message] = Message

    def _check_outgoing(self, message: Outgoing) -> None:
        if not isinstance(message, self.outgoing_type):
            raise TypeError(
                f"this end of the link sends {self.outgoing_type.__name__}, not {type(message).__name__}"
            )

    @abc.abstractmethod
    async def send(self, message: Outgoing) -> None:
        """Send one message. A checkpoint; cancellable before the message is queued.

        Raises: WireError when the peer or the connection is gone; trio.ClosedResourceError after our own aclose().
        """

    @abc.abstractmethod
    async def receive(self) -> Incoming:
        """Wait for the next message. A checkpoint; cancelling it loses no message.

        Raises: trio.EndOfChannel when the peer closed its side cleanly; WireError when the connection broke
        (the sentence says why); trio.ClosedResourceError after our own aclose().
        """

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Close both directions: the peer's `receive` then ends with trio.EndOfChannel. Idempotent."""

    def _note_received(self, message: Incoming) -> Incoming:
        self.peer_protocol = getattr(message, "protocol", None)
        return message

    def __aiter__(self) -> Link[Outgoing, Incoming]:
        return self

    async def __anext__(self) -> Incoming:
        try:
            return await self.receive()
        except trio.EndOfChannel:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> Link[Outgoing, Incoming]:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


AgentLink = Link[pb.AgentMessage, pb.ControlMessage]
"""The agent's end: sends AgentMessage, receives ControlMessage."""
ControlLink = Link[pb.ControlMessage, pb.AgentMessage]
"""The control plane's end: sends ControlMessage, receives AgentMessage."""


class MemoryLink(Link[Outgoing, Incoming]):
    """One end of an in-process link over trio memory channels carrying serialized messages."""

    def __init__(
        self,
        send_channel: trio.MemorySendChannel[bytes],
        receive_channel: trio.MemoryReceiveChannel[bytes],
        incoming_type: type[Incoming],
        outgoing_type: type[Outgoing],
    ) -> None:
        self._send_channel = send_channel
        self._receive_channel = receive_channel
        self._incoming_type = incoming_type
        self.outgoing_type = outgoing_type
        self.peer = "memory"

    async def send(self, message: Outgoing) -> None:
        self._check_outgoing(message)
        data = message.SerializeToString()
        try:
            await self._send_channel.send(data)
        except trio.BrokenResourceError as exc:
            raise WireError("the other end of the in-process link was closed; the message was not delivered.") from exc

    async def receive(self) -> Incoming:
        data = await self._receive_channel.receive()
        try:
            message = self._incoming_type.FromString(data)
        except DecodeError as exc:
            raise WireError(f"a {self._incoming_type.__name__} on the in-process link did not parse: {exc}") from exc
        return self._note_received(message)

    async def aclose(self) -> None:
        self._send_channel.close()
        self._receive_channel.close()
        await trio.lowlevel.checkpoint()

    def statistics(self) -> trio.MemoryChannelStatistics:
        """trio's statistics of the direction this end sends in: `current_buffer_used` (messages sent that the
        peer has not taken yet), `tasks_waiting_receive` (1 while the peer waits for the next message: it has
        handled every earlier one, when it handles each before receiving the next), `open_receive_channels` (0
        once the peer closed). Not a checkpoint."""
        return self._send_channel.statistics()


def memory_link_pair(buffer: int = MEMORY_LINK_BUFFER) -> tuple[AgentLink, ControlLink]:
    """Two connected in-process links: (agent end, control plane end), used by `llmgw up` for its local agent.

    `buffer` is the number of messages each direction holds before `send` waits. Not a checkpoint.
    """
    to_control_send, to_control_receive = trio.open_memory_channel[bytes](buffer)
    to_agent_send, to_agent_receive = trio.open_memory_channel[bytes](buffer)
    agent_end: AgentLink = MemoryLink(to_control_send, to_agent_receive, pb.ControlMessage, pb.AgentMessage)
    control_end: ControlLink = MemoryLink(to_agent_send, to_control_receive, pb.AgentMessage, pb.ControlMessage)
    return agent_end, control_end
