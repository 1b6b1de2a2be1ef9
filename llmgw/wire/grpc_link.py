"""The gRPC transport of a Link: grpc.aio running on its own thread (aio_thread.py), hidden behind trio channels.

Each Link over gRPC owns two asyncio "pump" tasks on the gRPC thread's loop: the reader moves every message the call
yields into a trio memory channel (handed across with `to_trio`), the writer drains an asyncio queue into the call.
Each direction holds at most GRPC_LINK_BUFFER messages in flight: the reader takes a credit per message and the trio
side gives it back when it receives that message; a trio sender takes one per message and the writer gives it back
once written. The trio side therefore only touches a trio channel and a queue, so cancelling `receive()` (a timeout,
say) never cancels a gRPC read half-way, and no asyncio task is created per message. Nothing outside llmgw.wire sees
asyncio.

Trap (DESIGN.md): every grpc.aio call must run on the gRPC thread (`run_aio`), and an ended RPC must cancel its whole
trio session; serving.py and connecting.py do the latter.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import trio

from llmgw.errors import WireError

from .aio_thread import on_loop, run_aio, to_trio
from .link import Incoming, Link, Outgoing

RPC_ERRORS = (grpc.RpcError, grpc.aio.BaseError, asyncio.InvalidStateError, ConnectionError)
"""What a grpc.aio stream's read or write raises when the RPC or its channel fails: `grpc.RpcError` (AioRpcError,
a status from the peer or the transport), `grpc.aio.BaseError` (UsageError, InternalError, AbortError: the call is
over or misused), `asyncio.InvalidStateError` (a write after the call finished) and `ConnectionError`. Anything else
is a bug of ours and propagates."""

GRPC_LINK_BUFFER = 64
"""Messages buffered in each direction between the trio side and the gRPC call."""
CREDITS_RETURNED_TOGETHER = GRPC_LINK_BUFFER // 4
"""The trio side gives the reader its credits back this many at a time: each return wakes the gRPC thread (a write
to its loop's pipe; those writes were 5% of the control plane's samples at 1,000 agents with one return per
message). The reader never waits on credits the trio side holds back: when it has none left, 64 messages are in the channel or held
back, so trio gives 16 back after receiving at most 16 more."""

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
"""Largest message either side accepts (log replies can be large; gRPC's default is 4 MiB)."""

CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    # Detect a vanished peer within ~30 s even when no heartbeat flows.
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
]
AGENT_KEEPALIVE_SECONDS = 2.0
AGENT_KEEPALIVE_TIMEOUT_SECONDS = 3.0
"""The agent pings each control plane every 2 s and gives up on it when a ping goes unanswered 3 s: a control plane
whose machine vanished (no RST, e.g. powered off or cut off) is noticed within about 5 s, not the kernel's
15 minutes, and the agent's other control planes carry on. Both ends' options are built from these two at call
time (`agent_channel_options`, `server_options`), so changing them (tests, bench/fleet_sim.py) changes both. gRPC's
client sends pings at most once a second whatever its keepalive time (chttp2), so values under 1 s act as 1 s."""


def agent_channel_options() -> list[tuple[str, Any]]:
    """The gRPC options of an agent's channel: CHANNEL_OPTIONS with a ping every AGENT_KEEPALIVE_SECONDS, given up
    after AGENT_KEEPALIVE_TIMEOUT_SECONDS, also while no RPC is open (a list of (name, value) pairs, times in ms)."""
    return [
        *(option for option in CHANNEL_OPTIONS if not option[0].startswith("grpc.keepalive_")),
        ("grpc.keepalive_time_ms", int(AGENT_KEEPALIVE_SECONDS * 1000)),
        ("grpc.keepalive_timeout_ms", int(AGENT_KEEPALIVE_TIMEOUT_SECONDS * 1000)),
        ("grpc.keepalive_permit_without_calls", 1),
    ]


UNACCEPTED_CALL_SECONDS = 300
"""How long an agent's call may wait for the control plane to take it before gRPC's core cancels it
(`grpc.server_max_unrequested_time_in_server`, GRPC_ARG_SERVER_MAX_UNREQUESTED_TIME_IN_SERVER_SECONDS in
grpc_types.h: "Maximum time to allow a request to be: (1) received by the server, but (2) not requested by a
RequestCall ... before the request is cancelled"; default 30 s). grpc.aio's server takes calls one at a time, so when
thousands of agents connect at once to a busy control plane the last ones wait; cancelled, each agent reconnected at
the back of the queue and added a connection's setup to the load (2,000 agents joining on the shared 2 cores: 858
calls cancelled after 30 s, none of them ever answered; docs/scale.md). Waiting keeps its place; a control plane that
takes none for 5 minutes is wedged, and the agent then connects again."""


def server_options() -> list[tuple[str, Any]]:
    """The control plane's gRPC server options: CHANNEL_OPTIONS plus a ping policy that accepts the agents' keepalive
    (a list of (name, value) pairs, times in ms).

    gRPC's doc/keepalive.md (grpc/grpc): the server counts a "ping strike" for each ping that comes sooner than
    `grpc.http2.min_ping_interval_without_data_ms` (GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, server
    side, default 5 min) after the previous one while it sends no data or headers, and after
    `grpc.http2.max_ping_strikes` (default 2; 0 accepts any number) closes the connection with GOAWAY
    "too_many_pings" (the agent sees `UNAVAILABLE: Too many pings`); pings while no call is open count only with
    `grpc.keepalive_permit_without_calls` 1 on both sides. "The client-side keepalive settings should also be in
    agreement with the server-side settings."

    Here: the minimum interval is half the agents' AGENT_KEEPALIVE_SECONDS (a ping held up behind a busy process
    may come early), calls need not be open, and strikes never close a connection. A strike is only forgotten when
    the server writes to that connection, and a control plane may send an agent nothing for minutes, so with any
    finite limit a loaded server, which reads two pings of one agent at once now and then, would close the streams
    of well-behaved agents in the end (1,000 agents: 5,237 streams closed in 150 s, docs/scale.md). The price: gRPC
    does not cut off a connected peer that floods pings (each costs the server an acknowledgement); the port is
    for agents, and with mutual TLS only nodes holding a certificate of the control plane's CA connect.
    (Before: the minimum was 10 s with 2 strikes, so a stream the server did not write to for 8 s was closed.)
    """
    return [
        *CHANNEL_OPTIONS,
        ("grpc.so_reuseport", 0),  # a second control plane on the same port must fail, not share it silently
        ("grpc.http2.min_ping_interval_without_data_ms", int(AGENT_KEEPALIVE_SECONDS * 1000) // 2),
        ("grpc.http2.max_ping_strikes", 0),  # grpc.keepalive_permit_without_calls 1 comes with CHANNEL_OPTIONS
        ("grpc.server_max_unrequested_time_in_server", UNACCEPTED_CALL_SECONDS),
    ]


_CLOSE = object()


def describe_rpc_error(exc: BaseException) -> str:
    """A sentence fragment for a gRPC failure: the status code and the details gRPC gave."""
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"
    return f"{type(exc).__name__}: {exc}"


class GrpcLink(Link[Outgoing, Incoming]):
    """A Link over one gRPC stream (either end). Built and started on the gRPC thread by serving/connecting.

    `read()` returns the next message or grpc.aio.EOF; `write(msg)` writes one; `done_writing()` (client only)
    half-closes; all three are the call's own, awaited on the gRPC thread. `token` is the trio run that uses the
    link. `peer` describes the other side ("ipv4:127.0.0.1:50432"); `peer_certificate_name` is the common name of the
    client certificate the peer showed (server side with mTLS; None otherwise).
    """

    def __init__(
        self,
        token: trio.lowlevel.TrioToken,
        read: Callable[[], Awaitable[Any]],
        write: Callable[[Any], Awaitable[None]],
        done_writing: Callable[[], Awaitable[None]] | None,
        outgoing_type: type[Outgoing],
        peer: str,
        peer_certificate_name: str | None = None,
    ) -> None:
        self.outgoing_type = outgoing_type
        self._token = token
        self._read = read
        self._write = write
        self._done_writing = done_writing
        self.peer = peer
        self.peer_certificate_name = peer_certificate_name
        # Unbounded on the trio side: the reader's credits (GRPC_LINK_BUFFER) bound what is in flight.
        self._incoming_send, self._incoming_receive = trio.open_memory_channel[Any](math.inf)
        self._read_credits = asyncio.Semaphore(GRPC_LINK_BUFFER)
        self._held_credits = 0  # received on the trio side, not yet given back to the reader
        self._outgoing: asyncio.Queue[Any] = asyncio.Queue()
        self._write_credits = trio.Semaphore(GRPC_LINK_BUFFER)
        self._error: str | None = None
        self._peer_ended = False  # client side: the control plane ended the RPC with status OK
        self._closed = False
        self._send_lock = trio.Lock()
        self.reader: asyncio.Task[None] | None = None
        self.writer: asyncio.Task[None] | None = None

    # gRPC thread ----------------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the pump tasks. Call on the gRPC thread (inside a coroutine running on its loop)."""
        loop = asyncio.get_running_loop()
        self.reader = loop.create_task(self._read_pump())
        self.writer = loop.create_task(self._write_pump())

    def fail(self, reason: str) -> None:
        """Mark the link broken: later sends raise WireError(reason), receive raises it after buffered messages.
        Call on the gRPC thread (it hands the close to trio after every message already handed over)."""
        if self._error is None:
            self._error = reason
        to_trio(self._token, self._incoming_send.close)

    def _deliver(self, message: Any) -> None:  # trio thread
        try:
            self._incoming_send.send_nowait(message)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # our own side was closed: nobody reads any more

    async def _read_pump(self) -> None:
        try:
            while True:
                await self._read_credits.acquire()
                message = await self._read()
                if message is grpc.aio.EOF:
                    if self._done_writing is not None:  # client: the server's end of stream is the RPC's end
                        self._peer_ended = True
                    break
                to_trio(self._token, self._deliver, message)
        except asyncio.CancelledError:
            raise
        except RPC_ERRORS as exc:  # the transport boundary: gRPC's failures become the link's WireError
            self.fail(f"the stream ended with an error ({describe_rpc_error(exc)})")
        finally:
            to_trio(self._token, self._incoming_send.close)

    async def _write_pump(self) -> None:
        try:
            while True:
                message = await self._outgoing.get()
                if message is _CLOSE:
                    break
                if self._error is None and not self._peer_ended:
                    await self._write(message)
                to_trio(self._token, self._write_credits.release)
            if self._done_writing is not None and self._error is None and not self._peer_ended:
                await self._done_writing()
        except asyncio.CancelledError:
            raise
        except RPC_ERRORS as exc:  # the transport boundary: gRPC's failures become the link's WireError
            if not self._peer_ended:  # a write racing the control plane's clean end is not a failure
                self.fail(f"a message could not be sent ({describe_rpc_error(exc)})")
            to_trio(self._token, self._write_credits.release)  # the message that failed
            while (await self._outgoing.get()) is not _CLOSE:
                to_trio(self._token, self._write_credits.release)  # keep draining: no sender waits forever

    # trio side -------------------------------------------------------------------------------------------

    async def send(self, message: Outgoing) -> None:
        if self._closed:
            raise trio.ClosedResourceError("this link was closed by aclose()")
        self._raise_if_unsendable()
        self._check_outgoing(message)
        async with self._send_lock:
            await self._write_credits.acquire()
            on_loop(self._outgoing.put_nowait, message)
        self._raise_if_unsendable()

    def _raise_if_unsendable(self) -> None:
        if self._error is not None:
            raise WireError(f"cannot send to {self.peer}: {self._error}.")
        if self._peer_ended:
            raise WireError(f"cannot send to {self.peer}: the control plane ended the stream; connect again.")

    async def receive(self) -> Incoming:
        try:
            message = await self._incoming_receive.receive()
        except trio.EndOfChannel:
            if self._error is not None:
                raise WireError(f"the link with {self.peer} broke: {self._error}.") from None
            raise
        self._held_credits += 1
        if self._held_credits >= CREDITS_RETURNED_TOGETHER:
            on_loop(self._return_credits, self._held_credits)
            self._held_credits = 0
        return self._note_received(message)

    def _return_credits(self, count: int) -> None:  # gRPC thread
        for _ in range(count):
            self._read_credits.release()

    async def aclose(self) -> None:
        if self._closed:
            await trio.lowlevel.checkpoint()
            return
        self._closed = True
        self._incoming_receive.close()
        on_loop(self._outgoing.put_nowait, _CLOSE)  # the queue is unbounded: the credits bound the messages
        await trio.lowlevel.checkpoint()

    async def wait_written(self, timeout: float) -> None:
        """Wait (up to `timeout` seconds, shielded) until the writer has sent everything queued before aclose()."""
        writer = self.writer
        if writer is None or writer.done():
            return
        with trio.move_on_after(timeout, shield=True):
            await run_aio(asyncio.wait, [writer])

    def stop_pumps(self) -> None:
        """Cancel both pump tasks (the RPC is over). Safe to call more than once, from either thread."""
        for task in (self.reader, self.writer):
            if task is not None:
                on_loop(task.cancel)
