"""The engine relay's "once": a request that carries `llmgw-once: KEY` runs on the engine at most once.

Why: a control plane that sends a batch line (`llmgw.gateway.BatchRunner`) and is killed before the answer comes
leaves the line claimed in the store; the next leader runs it again. Without this, the engine would run it twice:
the first request was already inside it. The relay is part of the shard's process, not of any control plane, so it
outlives the sender: it holds the request, runs it to its end whoever is still waiting, and keeps the answer; the
same KEY again gets that answer (or waits for it), never a second run. The gateway sends the key (its request id,
the same for every try of one batch line) on batch lines only, and the batch runner sends a line again to the replica
it was first sent to (`batch_lines.sent_to` in the store).

How, per request with a key (`RequestHead.once`): the relay reads the whole request (head and its Content-Length
body, at most MAX_ONCE_BODY_BYTES, else 413) before a byte goes to the engine, so a sender killed halfway leaves
nothing on the engine. The first request of a KEY starts the engine request in the relay's own task (not the
connection's: the client may go away) on a connection of its own, with `Connection: close`, and reads the engine's
whole answer; every request of that KEY, the first included, waits for it and gets the same bytes, with `Connection:
close` (the relay then closes that client connection). The key is per method and path and names the request: a later
request of the key gets the first one's answer whatever its body (a batch line's body as another control plane's
gateway rewrote it may differ in its bytes: the line is the same). An engine that cannot be reached (502), or that ends the connection before a whole answer, is
answered 502 and the key forgotten (the engine never answered it: a try again runs it). Answers are kept
`keep_seconds` (default 3600) after they came, and at most `keep_bytes` (default 64 MiB) of them, the oldest dropped
first; a key that is gone runs again. A relay started again (its engine with it) has forgotten every key.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

import trio

from llmgw.engines.relay_framing import Refusal, RequestHead, head_end

log = logging.getLogger("llmgw.engines.relay")
MAX_ONCE_BODY_BYTES = 64 * 1024 * 1024
"""The largest body of a request with `llmgw-once` (the relay holds it whole before sending it)."""
KEEP_SECONDS = 3600.0
KEEP_BYTES = 64 * 1024 * 1024
_HOP = (b"connection", b"keep-alive", b"llmgw-once")
"""Header fields a once request and its answer lose on the way (each way gets `Connection: close` instead)."""


class Stream(Protocol):
    async def send_all(self, data: bytes) -> None: ...

    async def receive_some(self, max_bytes: int = ...) -> bytes: ...

    def close(self) -> None: ...


def closing(head: bytes) -> bytes:
    """`head` (a request or response head, through its blank line) without its Connection, Keep-Alive and
    llmgw-once fields and with `Connection: close`. Pure."""
    lines = head[:-4].split(b"\r\n")
    kept = [lines[0]] + [line for line in lines[1:] if line.partition(b":")[0].strip().lower() not in _HOP]
    return b"\r\n".join([*kept, b"Connection: close"]) + b"\r\n\r\n"


def _content_length(head: bytes) -> int | None:
    """The Content-Length of a response head, None when it has none (chunked or ended by the close). Pure."""
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length" and value.strip().isdigit():
            return int(value.strip())
    return None


async def whole_answer(engine: Stream) -> bytes:
    """The engine's whole answer to the one request sent on `engine` (asked with `Connection: close`): read to its
    Content-Length, or to the end of the connection. Raises OSError when the connection ends before the head or
    short of the Content-Length."""
    data = bytearray()
    end, length = -1, None
    while True:
        chunk = await engine.receive_some()
        if not chunk:
            if end < 0 or (length is not None and len(data) < end + length):
                raise OSError("the engine closed the connection before its whole answer")
            break
        start = len(data)
        data += chunk
        if end < 0:
            end = head_end(data, start)
            length = _content_length(bytes(data[:end])) if end >= 0 else None
        if end >= 0 and length is not None and len(data) >= end + length:
            del data[end + length:]
            break
    return closing(bytes(data[:end])) + bytes(data[end:])


@dataclass
class _Entry:
    done: trio.Event = field(default_factory=trio.Event)
    answer: bytes | None = None  # None after done: the engine did not answer (the key is forgotten)
    at: float = 0.0


class Onces:
    """The once keys of one relay: `answer(head, request)` runs `request` (whole bytes, head and body) on the engine
    the first time its key comes and gives every request of that key the same answer (see the module). `connect()`
    opens a connection to the engine (raises OSError); `nursery` runs the engine requests, apart from any client
    connection."""

    def __init__(self, connect: Callable[[], Awaitable[Stream]], nursery: trio.Nursery, *,
                 keep_seconds: float = KEEP_SECONDS, keep_bytes: int = KEEP_BYTES):
        self.connect, self.nursery = connect, nursery
        self.keep_seconds, self.keep_bytes = keep_seconds, keep_bytes
        self.entries: dict[tuple[bytes, bytes, bytes], _Entry] = {}
        self.kept: OrderedDict[tuple[bytes, bytes, bytes], _Entry] = OrderedDict()  # answered, oldest first
        self.kept_bytes = 0
        self.runs = 0  # requests sent to the engine (a count, for tests)

    async def answer(self, head: RequestHead, end: int, request: bytes) -> bytes:
        """The engine's answer to `request` (its head ends at `end`) of once key `head.once`, as it will be sent to
        the client. Raises Refusal (502) when the engine did not answer."""
        self._expire()
        key = (head.method, head.target, head.once)
        entry = self.entries.get(key)
        if entry is None:
            entry = self.entries[key] = _Entry()
            self.runs += 1
            self.nursery.start_soon(self._run, key, entry, closing(request[:end]) + request[end:])
        await entry.done.wait()
        if entry.answer is None:
            raise Refusal(502, "the engine did not answer (it may be starting or restarting)")
        return entry.answer

    async def _run(self, key: tuple[bytes, bytes, bytes], entry: _Entry, request: bytes) -> None:
        try:
            engine = await self.connect()
            try:
                await engine.send_all(request)
                entry.answer = await whole_answer(engine)
            finally:
                engine.close()
        except (OSError, trio.ClosedResourceError):
            entry.answer = None
        except Exception:  # noqa: BLE001 - an engine's answer that finds a bug must not end the shard's door
            log.exception("relay: a once request ended on an unexpected error")
            entry.answer = None
        finally:
            if entry.answer is None:
                self.entries.pop(key, None)
            else:
                entry.at = trio.current_time()
                self.kept[key] = entry
                self.kept_bytes += len(entry.answer)
                self._expire()
            entry.done.set()

    def _expire(self) -> None:
        """Forget the oldest answers past `keep_seconds`, and past `keep_bytes` in all."""
        now = trio.current_time()
        while self.kept:
            key, entry = next(iter(self.kept.items()))
            if now - entry.at <= self.keep_seconds and self.kept_bytes <= self.keep_bytes:
                return
            del self.kept[key]
            self.kept_bytes -= len(entry.answer or b"")
            if self.entries.get(key) is entry:
                del self.entries[key]
