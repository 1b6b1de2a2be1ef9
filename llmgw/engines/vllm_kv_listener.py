"""Receiving one vLLM engine's KV-cache events over ZMQ: only the engine's, and never more than the agent can hold.

The agent gives vLLM an IPC endpoint ("ipc:///DIR/NAME.sock") in a directory only the engines' user can enter
(mode 0700, `llmgw.agent.kv_sockets`): vLLM binds an `ipc://` endpoint (its `ZmqEventPublisher` binds "ipc://",
"inproc://" and wildcard endpoints, connects to others), and this listener connects to it, so no other user of the
node can publish into the mirror, read the engine's events, or take the socket's name first (issue 25). ZMQ
reconnects by itself: the listener may connect before the engine binds, and after the engine restarts.
A TCP endpoint (`host`:`port`, the form of agents before IPC, and of vLLM given "tcp://127.0.0.1:PORT") is bound
by the listener as before, for engines adopted from such records.

Limits: a message (a ZMQ frame) above `max_message_bytes` (ZMQ_MAXMSGSIZE, default 4 MiB) is never taken in: ZMQ
drops the connection that sent it and reconnects (a vLLM batch is one engine step's events, a few hundred KiB at
most for 16k scheduled tokens). The mirror holds at most `max_hashes` hashes (default 1,000,000, the control plane's
cap per replica), and a sequence gap or AllBlocksCleared empties it at most once per `reset_interval` seconds
(default 10; `KvBlocks.apply`).

The state is a pure value: `listener.blocks` is a `KvBlocks` (llmgw.tools.vllm_kv_events), replaced, never
mutated, by `KvBlocks.apply` for each message; readers take the current value. A message that does not decode is
counted in `listener.malformed` and its text kept in `listener.last_error` (a bad message from the engine must not
stop the listener); the mirror is reset by the next message's sequence gap.
"""

from __future__ import annotations

from collections.abc import Callable

import trio
import zmq

from llmgw.engines.vllm import KV_EVENTS_TOPIC as TOPIC
from llmgw.engines.vllm import kv_events_config
from llmgw.tools.values import ParseError
from llmgw.tools.vllm_kv_events import KvBlocks, parse_message

__all__ = ["MAX_HASHES", "MAX_MESSAGE_BYTES", "RESET_INTERVAL", "TOPIC", "KvEventListener", "kv_events_config"]

MAX_MESSAGE_BYTES = 4 * 1024 * 1024
"""ZMQ_MAXMSGSIZE of the listener's socket: a larger frame disconnects its sender (bytes)."""
MAX_HASHES = 1_000_000
"""The most block hashes one engine's mirror holds (over all its KV-cache groups)."""
RESET_INTERVAL = 10.0
"""Seconds: a sequence gap or AllBlocksCleared empties the mirror at most once per this interval."""


class KvEventListener:
    """One engine's events: connected to the engine's IPC `endpoint` ("ipc://..."), or without one bound on
    `host`:`port` (0: a free port; `endpoint` is then set, e.g. "tcp://127.0.0.1:41234", once `run` has bound it).

    `blocks`: the current mirror; `messages`: messages applied; `malformed`: messages that did not decode;
    `disconnects`: connections to an IPC endpoint dropped (by ZMQ, for a message over `max_message_bytes`, or
    by the engine going away) and made again.
    `on_change()` is called (synchronously) after each message applied. `max_message_bytes`, `max_hashes`,
    `reset_interval` (seconds, on trio's clock): see the module."""

    def __init__(self, host: str = "127.0.0.1", topic: str = TOPIC, port: int = 0,
                 on_change: Callable[[], None] | None = None, *, endpoint: str = "",
                 max_message_bytes: int = MAX_MESSAGE_BYTES, max_hashes: int = MAX_HASHES,
                 reset_interval: float = RESET_INTERVAL) -> None:
        self.host = host
        self.port = port
        self.topic = topic
        self.endpoint = endpoint
        self.max_message_bytes = max_message_bytes
        self.max_hashes = max_hashes
        self.reset_interval = reset_interval
        self.disconnects = 0
        self.blocks = KvBlocks()
        self.messages = 0
        self.malformed = 0
        self.last_error = ""
        self.changed = trio.Event()
        self.on_change = on_change

    def reset(self) -> None:
        """Forget every block (the engine restarted: its cache is empty), counted as a reset."""
        self.blocks = KvBlocks(resets=self.blocks.resets + 1)
        self._changed()

    def _changed(self) -> None:
        self.changed.set()
        self.changed = trio.Event()
        if self.on_change is not None:
            self.on_change()

    async def run(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        """Connect a SUB socket to the IPC `endpoint` (or bind one on `host`, a free port without `port`), report
        the endpoint with `task_status.started`, then apply every message until cancelled. The socket is closed on
        the way out. Raises zmq.ZMQError when the endpoint cannot be bound or connected."""
        context = zmq.Context.instance()
        socket = context.socket(zmq.SUB)
        monitor = None
        try:
            socket.setsockopt(zmq.LINGER, 0)
            socket.setsockopt(zmq.MAXMSGSIZE, self.max_message_bytes)
            socket.setsockopt_string(zmq.SUBSCRIBE, self.topic)
            async with trio.open_nursery() as nursery:
                if self.endpoint.startswith("ipc://"):
                    # ZMQ does not reconnect a connection it dropped for a message over MAXMSGSIZE (a protocol
                    # error, libzmq 4.3): the monitor sees the drop and connects again.
                    monitor = socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)
                    nursery.start_soon(self._reconnect_on_drop, socket, monitor)
                    socket.connect(self.endpoint)
                else:
                    port = self.port or socket.bind_to_random_port(f"tcp://{self.host}")
                    if self.port:
                        socket.bind(f"tcp://{self.host}:{self.port}")
                    self.endpoint = f"tcp://{self.host}:{port}"
                task_status.started(self.endpoint)
                await self._receive(socket)
        finally:
            if monitor is not None:
                # The monitor is stopped before its reader closes: libzmq's I/O thread sends each event to the
                # reader with a blocking send, and with the reader gone (the engine went away as the listener
                # stopped) that send never returns, and every ZMQ socket of the process stops with it.
                socket.disable_monitor()
                monitor.close(linger=0)
            socket.close(linger=0)

    async def _receive(self, socket: zmq.Socket) -> None:
        fd = socket.getsockopt(zmq.FD)
        while True:
            # ZMQ's FD is edge-triggered: drain everything ready, then wait for the next edge.
            while socket.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                self._apply(socket.recv_multipart(zmq.NOBLOCK))
            await trio.lowlevel.wait_readable(fd)

    async def _reconnect_on_drop(self, socket: zmq.Socket, monitor: zmq.Socket) -> None:
        """Connect `socket` to the endpoint again after each drop `monitor` reports (counted in `disconnects`)."""
        fd = monitor.getsockopt(zmq.FD)
        while True:
            while monitor.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                monitor.recv_multipart(zmq.NOBLOCK)  # EVENT_DISCONNECTED: an oversized message, or the engine
                self.disconnects += 1                # went away (reconnecting costs nothing then either)
                socket.disconnect(self.endpoint)
                socket.connect(self.endpoint)
            await trio.lowlevel.wait_readable(fd)

    def _apply(self, frames: list[bytes]) -> None:
        try:
            batch = parse_message(frames)
        except ParseError as exc:
            self.malformed += 1
            self.last_error = str(exc)
            return
        self.blocks = self.blocks.apply(batch, now=trio.current_time(), reset_interval=self.reset_interval,
                                        max_hashes=self.max_hashes)
        self.messages += 1
        self._changed()
