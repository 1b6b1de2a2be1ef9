"""Receiving one vLLM engine's KV-cache events: a ZMQ SUB socket that llmgw binds and vLLM connects to.

vLLM connects to an endpoint like `tcp://127.0.0.1:PORT` (only `tcp://*:PORT` makes it bind), so the listener binds
on loopback and the engine is started with `--kv-events-config` naming that address (`kv_events_config`). After a
restart of the listener vLLM reconnects within seconds: no events for a while means nothing.

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

__all__ = ["TOPIC", "KvEventListener", "kv_events_config"]


class KvEventListener:
    """One engine's events, on `host`:`port` (0: a free port). `endpoint` is set (e.g. "tcp://127.0.0.1:41234") once `run` has bound the socket.

    `blocks`: the current mirror; `messages`: messages applied; `malformed`: messages that did not decode.
    `on_change()` is called (synchronously) after each message applied."""

    def __init__(self, host: str = "127.0.0.1", topic: str = TOPIC, port: int = 0,
                 on_change: Callable[[], None] | None = None) -> None:
        self.host = host
        self.port = port
        self.topic = topic
        self.endpoint = ""
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
        """Bind a SUB socket on `host` (a free port), report the endpoint with `task_status.started`, then apply
        every message until cancelled. The socket is closed on the way out."""
        context = zmq.Context.instance()
        socket = context.socket(zmq.SUB)
        try:
            socket.setsockopt(zmq.LINGER, 0)
            socket.setsockopt_string(zmq.SUBSCRIBE, self.topic)
            if self.port:
                socket.bind(f"tcp://{self.host}:{self.port}")
                port = self.port
            else:
                port = socket.bind_to_random_port(f"tcp://{self.host}")
            self.endpoint = f"tcp://{self.host}:{port}"
            task_status.started(self.endpoint)
            fd = socket.getsockopt(zmq.FD)
            while True:
                # ZMQ's FD is edge-triggered: drain everything ready, then wait for the next edge.
                while socket.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                    self._apply(socket.recv_multipart(zmq.NOBLOCK))
                await trio.lowlevel.wait_readable(fd)
        finally:
            socket.close(linger=0)

    def _apply(self, frames: list[bytes]) -> None:
        try:
            batch = parse_message(frames)
        except ParseError as exc:
            self.malformed += 1
            self.last_error = str(exc)
            return
        self.blocks = self.blocks.apply(batch)
        self.messages += 1
        self._changed()
