"""The upstream HTTP/1.1 client: keep-alive connections to engines, O(1) per request.

httpcore's pool scans every pooled connection on every request (DESIGN.md "Known traps", httpcore PR #928), which
halved a proxy's throughput from 1 to 64 concurrent requests here. This client keeps, per origin, a LIFO stack of
idle connections: taking one and giving it back are constant time whatever the pool holds. It speaks HTTP/1.1
(RFC 9112) over trio TCP streams itself: the request is written as one buffer, the response head parsed, and the
body framed by Content-Length, chunked coding, or the connection's close. (h11 did this before at about 0.1 ms
of CPU per request and 7 us per streamed event, a tenth of the gateway's cost; an engine on the fleet's network
needs no more than this. TLS to an external endpoint goes through `ssl` when the URL is https.)

Timeouts (our own, stated): connecting `connect_timeout` (default 5 s); the response head `head_timeout` (default
600 s: an engine may queue a request that long); between two body reads `idle_timeout` (default 300 s: a stream is
never cut while tokens flow, only when the engine stays silent that long). Errors are raised as UpstreamError with
`status` 502 (refused, reset, bad response) or 504 (timeout); `before_send` tells whether nothing was sent.
"""

from __future__ import annotations

import math
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

import trio

from llmgw.errors import UpstreamError
from llmgw.gateway.framing import ChunkedBody, FramingError, body_framing, parse_head

READ_SIZE = 65536
MAX_HEAD_BYTES = 65536


class UpstreamFailure(UpstreamError):
    """An upstream request failed. `before_send` is True when the request never reached the engine (retry-safe)."""

    def __init__(self, message: str, status: int = 502, *, before_send: bool = False, refused: bool = False):
        super().__init__(message, status)
        self.before_send = before_send
        self.refused = refused


@dataclass(frozen=True)
class Timeouts:
    """Upstream timeouts in seconds (see the module docstring)."""

    connect_timeout: float = 5.0
    head_timeout: float = 600.0
    idle_timeout: float = 300.0


class _Connection:
    def __init__(self, stream: trio.abc.Stream):
        self.stream = stream

    async def aclose(self) -> None:
        with trio.move_on_after(1, shield=True):
            await self.stream.aclose()


class UpstreamResponse:
    """A response whose head has arrived. Iterate `body()` for the bytes as they come; always `aclose()` it
    (the connection goes back to the pool only when the body was read to the end and the engine keeps it alive).

    `headers`: (lower-case name, value) pairs as received. `framing`: ("length", n, leftover) or ("chunked",
    leftover) or ("close", leftover): the body runs until the engine closes the connection."""

    def __init__(self, pool: UpstreamPool, origin: tuple, conn: _Connection, status: int,
                 headers: list[tuple[bytes, bytes]], timeouts: Timeouts, framing: tuple, keep_alive: bool):
        self._pool = pool
        self._origin = origin
        self._conn: _Connection | None = conn
        self.status = status
        self.headers = headers
        self._timeouts = timeouts
        self._done = False
        self._framing = framing
        self._reusable = keep_alive and framing[0] != "close"

    def header(self, name: bytes) -> bytes | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None

    async def _receive(self, conn: _Connection, eof_ends: bool = False) -> bytes:
        with trio.move_on_after(self._timeouts.idle_timeout) as scope:
            try:
                data = await conn.stream.receive_some(READ_SIZE)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                raise UpstreamFailure(f"the engine connection broke mid-response: {exc}") from exc
        if scope.cancelled_caught:
            raise UpstreamFailure(f"the engine sent nothing for {self._timeouts.idle_timeout:g} s", 504)
        if not data and not eof_ends:
            raise UpstreamFailure("the engine closed the connection before the response ended")
        return data

    async def body(self) -> AsyncIterator[bytes]:
        """Yield body bytes as they arrive. Raises UpstreamFailure on a reset or bad framing (502) or silence past
        idle_timeout (504)."""
        conn = self._conn
        assert conn is not None
        kind = self._framing[0]
        framed = self._chunked(conn) if kind == "chunked" else self._sized(conn) if kind == "length" \
            else self._until_close(conn)
        async for data in framed:
            yield data
        self._done = True

    async def _until_close(self, conn: _Connection) -> AsyncIterator[bytes]:
        data = self._framing[1]
        while data:
            yield data
            data = await self._receive(conn, eof_ends=True)

    async def _sized(self, conn: _Connection) -> AsyncIterator[bytes]:
        _kind, remaining, buffer = self._framing
        while remaining > 0:
            if not buffer:
                buffer = await self._receive(conn)
            data, buffer = buffer[:remaining], buffer[remaining:]
            remaining -= len(data)
            yield data
        if buffer:
            self._reusable = False  # bytes past the body: the connection is out of step

    async def _chunked(self, conn: _Connection) -> AsyncIterator[bytes]:
        """RFC 9112 section 7.1 chunked framing: `size[;ext]CRLF data CRLF` ... `0CRLF [trailers] CRLF`.
        Yields the data of all chunks complete in the bytes at hand together, before waiting for more."""
        state = ChunkedBody()
        buffer: bytes = self._framing[1]
        while True:
            parts, buffer = _parsed(state, buffer)
            if parts:
                yield parts[0] if len(parts) == 1 else b"".join(parts)
            if state.done:
                if buffer:
                    self._reusable = False
                return
            buffer += await self._receive(conn)

    async def relay(self, deliver: Callable[[bytes], Awaitable[None]]) -> None:
        """Read the body to its end, awaiting `deliver(data)` for each piece as it arrives (for streams).

        Same errors as `body()`. The idle timeout counts only the waits for the engine, not the time `deliver`
        takes; it is one cancel scope whose deadline is moved per read (half the cost of a scope per read)."""
        conn = self._conn
        assert conn is not None
        if self._framing[0] != "chunked":
            async for data in self.body():
                await deliver(data)
            return
        state = ChunkedBody()
        buffer: bytes = self._framing[1]
        stream = conn.stream
        idle_timeout = self._timeouts.idle_timeout
        with trio.CancelScope() as idle:
            while True:
                parts, buffer = _parsed(state, buffer)
                if parts:
                    await deliver(parts[0] if len(parts) == 1 else b"".join(parts))
                if state.done:
                    self._reusable = self._reusable and not buffer
                    self._done = True
                    return
                idle.deadline = trio.current_time() + idle_timeout
                try:
                    data = await stream.receive_some(READ_SIZE)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                    raise UpstreamFailure(f"the engine connection broke mid-response: {exc}") from exc
                idle.deadline = math.inf
                if not data:
                    raise UpstreamFailure("the engine closed the connection before the response ended")
                buffer += data
        raise UpstreamFailure(f"the engine sent nothing for {idle_timeout:g} s", 504)

    async def read(self) -> bytes:
        """The whole body."""
        parts = [chunk async for chunk in self.body()]
        return b"".join(parts)

    async def aclose(self) -> None:
        """Give the connection back when the body was read to the end and may be reused, else close it."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self._done and self._reusable:
            self._pool._give_back(self._origin, conn)
        else:
            await conn.aclose()


class UpstreamPool:
    """Keep-alive connections per origin (scheme, host, port); `max_idle` kept per origin, LIFO."""

    def __init__(self, timeouts: Timeouts = Timeouts(), max_idle: int = 256):
        self.timeouts = timeouts
        self.max_idle = max_idle
        self._idle: dict[tuple, list[_Connection]] = {}
        self._ssl = ssl.create_default_context()
        self._targets: dict[str, tuple[tuple, str, bytes]] = {}  # url -> (origin, target, host header)

    def _give_back(self, origin: tuple, conn: _Connection) -> None:
        stack = self._idle.setdefault(origin, [])
        if len(stack) < self.max_idle:
            stack.append(conn)
        else:
            trio.lowlevel.spawn_system_task(conn.aclose)

    async def _connect(self, origin: tuple) -> _Connection:
        scheme, host, port = origin
        with trio.move_on_after(self.timeouts.connect_timeout) as scope:
            try:
                stream: trio.abc.Stream = await trio.open_tcp_stream(host, port)
                if scheme == "https":
                    stream = trio.SSLStream(stream, self._ssl, server_hostname=host, https_compatible=True)
                    await stream.do_handshake()
            except OSError as exc:
                raise UpstreamFailure(f"cannot connect to {host}:{port}: {exc}", before_send=True,
                                      refused=True) from exc
            except trio.BrokenResourceError as exc:
                raise UpstreamFailure(f"TLS with {host}:{port} failed: {exc}", before_send=True,
                                      refused=True) from exc
        if scope.cancelled_caught:
            raise UpstreamFailure(f"connecting to {host}:{port} took over {self.timeouts.connect_timeout:g} s", 504,
                                  before_send=True, refused=True)
        return _Connection(stream)

    async def request(self, method: str, url: str, headers: list[tuple[bytes, bytes]], body: bytes) -> UpstreamResponse:
        """Send a request and wait for the response head; the caller reads the body and closes the response.

        A pooled connection the engine closed while idle is retried once on a fresh one (nothing was processed).
        Raises UpstreamFailure (502/504).
        """
        known = self._targets.get(url)
        if known is None:
            parts = urlsplit(url)
            scheme = parts.scheme or "http"
            origin = (scheme, parts.hostname or "127.0.0.1", parts.port or (443 if scheme == "https" else 80))
            target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            if len(self._targets) >= 1024:
                self._targets.clear()
            known = self._targets[url] = (origin, target, parts.netloc.encode())
        origin, target, host_header = known
        lines = [f"{method} {target} HTTP/1.1\r\n".encode(), b"host: ", host_header,
                 b"\r\ncontent-length: ", str(len(body)).encode(), b"\r\n"]
        for name, value in headers:
            if b"\n" in value or b"\r" in value or b"\n" in name or b"\r" in name or b":" in name:
                raise UpstreamFailure(f"the header {name[:40]!r} for the engine is not a valid HTTP header; "
                                      "check the engine key in the settings", before_send=True)
            lines += (name, b": ", value, b"\r\n")
        lines += (b"\r\n", body)
        request = b"".join(lines)
        stack = self._idle.get(origin)
        for attempt in (0, 1):
            reused = bool(stack) and attempt == 0
            conn = stack.pop() if reused else await self._connect(origin)
            try:
                return await self._exchange(origin, conn, method, request)
            except UpstreamFailure as failure:
                await conn.aclose()
                if reused and failure.before_send:
                    continue
                raise
            except BaseException:
                await conn.aclose()
                raise
        raise AssertionError("unreachable")

    async def _exchange(self, origin, conn: _Connection, method: str, request: bytes) -> UpstreamResponse:
        try:
            await conn.stream.send_all(request)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            raise UpstreamFailure(f"sending to the engine failed: {exc}", before_send=True) from exc
        received_any = False
        buffer = b""
        with trio.move_on_after(self.timeouts.head_timeout):
            while True:
                end = buffer.find(b"\r\n\r\n")
                if end >= 0:
                    try:
                        status, version, headers = parse_head(buffer[:end])
                        buffer = buffer[end + 4:]
                        if 100 <= status < 200 and status != 101:
                            continue  # an interim answer (100 Continue, 103 Early Hints): the real one follows
                        framing, keep_alive = body_framing(method, status, version, headers, buffer)
                    except FramingError as exc:
                        raise UpstreamFailure(f"the engine sent a bad response: {exc}") from exc
                    return UpstreamResponse(self, origin, conn, status, headers, self.timeouts, framing, keep_alive)
                if len(buffer) > MAX_HEAD_BYTES:
                    raise UpstreamFailure(f"the engine sent a response head over {MAX_HEAD_BYTES} bytes")
                try:
                    chunk = await conn.stream.receive_some(READ_SIZE)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                    raise UpstreamFailure(f"the engine connection broke: {exc}",
                                          before_send=not received_any) from exc
                if not chunk:
                    if not received_any:
                        # a kept-alive connection the engine had closed: nothing was processed
                        raise UpstreamFailure("the engine closed the connection", before_send=True)
                    raise UpstreamFailure("the engine closed the connection without answering")
                received_any = True
                buffer += chunk
        raise UpstreamFailure(f"the engine did not answer within {self.timeouts.head_timeout:g} s", 504)

    async def aclose(self) -> None:
        """Close every idle connection."""
        idle, self._idle = self._idle, {}
        for stack in idle.values():
            for conn in stack:
                await conn.aclose()


def _parsed(state: ChunkedBody, buffer: bytes) -> tuple[list[bytes], bytes]:
    try:
        return state.parse(buffer)
    except FramingError as exc:
        raise UpstreamFailure(f"the engine sent a bad chunked body: {exc}") from exc
