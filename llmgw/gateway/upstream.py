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

READ_SIZE = 65536
MAX_HEAD_BYTES = 65536
_HEX = b"0123456789abcdefABCDEF"


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


class _ChunkState:
    """Where a chunked body's framing stands between reads."""

    __slots__ = ("remaining", "crlf", "trailers", "done")

    def __init__(self):
        self.remaining = 0  # data bytes of the current chunk still to come
        self.crlf = False  # the CRLF closing a chunk's data is still to come
        self.trailers = False  # past the last chunk: trailer lines until an empty one
        self.done = False

    def parse(self, buffer: bytes) -> tuple[list[bytes], bytes]:
        """Consume what `buffer` completes; returns (data parts, unconsumed bytes). Raises UpstreamFailure."""
        parts: list[bytes] = []
        while not self.done:
            if self.remaining:
                if not buffer:
                    break
                data = buffer[:self.remaining]
                buffer = buffer[self.remaining:]
                self.remaining -= len(data)
                parts.append(data)
                if self.remaining:
                    break
                self.crlf = True
            if self.crlf:
                if len(buffer) < 2:
                    break
                if buffer[:2] != b"\r\n":
                    raise UpstreamFailure("the engine sent a chunk without its closing CRLF")
                buffer = buffer[2:]
                self.crlf = False
            at = buffer.find(b"\r\n")
            if at < 0:
                if len(buffer) > 16384:
                    raise UpstreamFailure("the engine sent a chunk-size or trailer line over 16 KiB")
                break
            line = buffer[:at]
            buffer = buffer[at + 2:]
            if self.trailers:
                self.done = not line
                continue
            digits = line.split(b";", 1)[0].strip()
            if not digits or digits.strip(_HEX) or len(digits) > 16:
                raise UpstreamFailure(f"the engine sent a bad chunk size {line[:40]!r}")
            size = int(digits, 16)
            if size == 0:
                self.trailers = True
            self.remaining = size
        return parts, buffer


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
        state = _ChunkState()
        buffer: bytes = self._framing[1]
        while True:
            parts, buffer = state.parse(buffer)
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
        state = _ChunkState()
        buffer: bytes = self._framing[1]
        stream = conn.stream
        idle_timeout = self._timeouts.idle_timeout
        with trio.CancelScope() as idle:
            while True:
                parts, buffer = state.parse(buffer)
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
                    status, version, headers = _parse_head(buffer[:end])
                    buffer = buffer[end + 4:]
                    if 100 <= status < 200 and status != 101:
                        continue  # an interim answer (100 Continue, 103 Early Hints): the real one follows
                    framing, keep_alive = _framing(method, status, version, headers, buffer)
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


def _parse_head(head: bytes) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
    """(status, HTTP version such as b"1.1", [(lower-case name, value)]) of a response head without its blank
    line (RFC 9112 sections 4 and 5). Raises UpstreamFailure when it is not HTTP/1.x."""
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or len(parts[1]) != 3 or not parts[1].isdigit():
        raise UpstreamFailure(f"the engine sent a bad response: status line {lines[0][:80]!r}")
    headers = []
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or not name or name.strip(b" \t") != name:
            raise UpstreamFailure(f"the engine sent a bad response: header line {line[:80]!r}")
        headers.append((name.lower(), value.strip(b" \t")))
    return int(parts[1]), parts[0][5:], headers


def _framing(method: str, status: int, version: bytes, headers: list[tuple[bytes, bytes]],
             leftover: bytes) -> tuple[tuple, bool]:
    """How the body is delimited (RFC 9112 section 6.3) and whether the connection stays open after it.

    Returns (("length", n, leftover) | ("chunked", leftover) | ("close", leftover), keep_alive). Raises
    UpstreamFailure for contradictory or invalid lengths."""
    keep_alive = version == b"1.1"
    encoding = length = None
    for name, value in headers:
        if name == b"transfer-encoding":
            encoding = value.lower() if encoding is None else encoding + b"," + value.lower()
        elif name == b"content-length":
            if not value.isdigit() or (length is not None and int(value) != length):
                raise UpstreamFailure(f"the engine sent a bad content-length {value[:40]!r}")
            length = int(value)
        elif name == b"connection" and b"close" in value.lower():
            keep_alive = False
    if method == "HEAD" or status in (204, 304):
        return ("length", 0, leftover), keep_alive
    if encoding is not None:
        if encoding.replace(b" ", b"") == b"chunked":
            return ("chunked", leftover), keep_alive
        return ("close", leftover), False
    if length is not None:
        return ("length", length, leftover), keep_alive
    return ("close", leftover), False
