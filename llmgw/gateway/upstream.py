"""The upstream HTTP/1.1 client: keep-alive connections to engines, O(1) per request.

httpcore's pool scans every pooled connection on every request (DESIGN.md "Known traps", httpcore PR #928), which
halved a proxy's throughput from 1 to 64 concurrent requests here. This client keeps, per origin, a LIFO stack of
idle connections: taking one and giving it back are constant time whatever the pool holds. It speaks HTTP/1.1
through h11 over plain TCP sockets with trio waits (`tcp.PlainStream`: one system call per read); that is all an
engine on the fleet's network needs (TLS to an external endpoint goes through trio's SSLStream when the URL is https).

Timeouts (our own, stated): connecting `connect_timeout` (default 5 s); the response head `head_timeout` (default
600 s: an engine may queue a request that long); between two body reads `idle_timeout` (default 300 s: a stream is
never cut while tokens flow, only when the engine stays silent that long). Errors are raised as UpstreamError with
`status` 502 (refused, reset, bad response) or 504 (timeout); `connect_failed` tells whether nothing was sent.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

import h11
import trio

from llmgw.errors import UpstreamError
from llmgw.gateway.chunked import ChunkedBody
from llmgw.gateway.tcp import PlainStream

READ_SIZE = 65536


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
    def __init__(self, stream: trio.SSLStream | PlainStream):
        self.stream = stream
        self.h11 = h11.Connection(h11.CLIENT)
        self.at_eof = False  # the engine closed its side: never reuse

    async def aclose(self) -> None:
        with trio.move_on_after(1, shield=True):
            await self.stream.aclose()


class UpstreamResponse:
    """A response whose head has arrived. Iterate `body()` for the bytes as they come; always `aclose()` it
    (the connection goes back to the pool only when the body was read to the end)."""

    def __init__(self, pool: UpstreamPool, origin: tuple, conn: _Connection, status: int,
                 headers: list[tuple[bytes, bytes]], timeouts: Timeouts):
        self._pool = pool
        self._origin = origin
        self._conn: _Connection | None = conn
        self.status = status
        self.headers = headers
        self._timeouts = timeouts
        self._done = False
        self.read_since = trio.current_time()  # when the pending (or last) read from the engine began
        self._reading = False  # a read of body(watched=True) or receive_watched() is waiting for the engine
        self._chunked: ChunkedBody | None = None  # receive_watched's decoder of a chunked body (h11 only parsed the head)
        self._watched: AsyncIterator[bytes] | None = None  # receive_watched's body(watched=True) when not chunked

    def header(self, name: bytes) -> bytes | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None

    async def body(self, *, watched: bool = False) -> AsyncIterator[bytes]:
        """Yield body bytes as they arrive: everything one read from the engine completed, joined (several SSE
        events that arrived together are relayed in one write). Raises UpstreamFailure on a reset (502) or silence
        past idle_timeout (504).

        `watched`: the caller runs `watch_idle` beside the iteration, which enforces idle_timeout instead of a
        cancel scope per read (a trio cancel scope costs several µs; a stream reads once per token).
        """
        conn = self._conn
        assert conn is not None
        h = conn.h11
        parts: list[bytes] = []
        while True:
            try:
                event = h.next_event()
            except h11.RemoteProtocolError as exc:
                raise UpstreamFailure(f"the engine broke off its response: {exc}") from exc
            if event is h11.NEED_DATA:
                if parts:
                    yield bytes(parts[0]) if len(parts) == 1 else b"".join(parts)
                    parts = []
                if watched:
                    self.read_since = trio.current_time()
                    self._reading = True
                    data = await self._receive(conn)
                    self._reading = False
                else:
                    with trio.move_on_after(self._timeouts.idle_timeout) as scope:
                        data = await self._receive(conn)
                    if scope.cancelled_caught:
                        raise self.idle_failure()
                if not data:
                    conn.at_eof = True  # a body delimited by the close: this connection is over
                try:
                    h.receive_data(data)
                except h11.RemoteProtocolError as exc:
                    raise UpstreamFailure(f"the engine sent a bad response: {exc}") from exc
                continue
            if type(event) is h11.Data:
                parts.append(event.data)
            elif isinstance(event, h11.EndOfMessage):
                if parts:
                    yield bytes(parts[0]) if len(parts) == 1 else b"".join(parts)
                self._done = True
                return
            elif isinstance(event, h11.ConnectionClosed):
                if parts:
                    yield b"".join(parts)
                raise UpstreamFailure("the engine closed the connection before the response ended")

    async def receive_watched(self) -> bytes:
        """The body bytes that the next read(s) from the engine complete (never b"" before the end); b"" once the
        body ended. As `body(watched=True)`, for the caller that runs `watch_idle` beside it; the streamed relay's
        loop (no async generator step per read). Raises UpstreamFailure on a reset, a bad body or a close before
        the end (502). A checkpoint.

        A chunked body (what engines stream) is decoded by `chunked.ChunkedBody`, not h11, once the head is parsed:
        the bytes h11 had read past the head (`trailing_data`) go first. Any other framing goes through h11.
        """
        decoder = self._chunked
        if decoder is None:
            if self._watched is None:
                if (self.header(b"transfer-encoding") == b"chunked" and self._conn is not None
                        and self._conn.h11.their_state is h11.SEND_BODY):
                    self._chunked = decoder = ChunkedBody()
                    out = self._feed(decoder, self._conn.h11.trailing_data[0])
                    if out:
                        return out
                else:
                    self._watched = self.body(watched=True)
            if decoder is None:
                try:
                    return await self._watched.__anext__()
                except StopAsyncIteration:
                    return b""
        conn = self._conn
        assert conn is not None
        while not decoder.done:
            self.read_since = trio.current_time()
            self._reading = True
            data = await self._receive(conn)
            self._reading = False
            if not data:
                conn.at_eof = True
                raise UpstreamFailure("the engine closed the connection before the response ended")
            out = self._feed(decoder, data)
            if out:
                return out
        self._done = True
        return b""

    @staticmethod
    def _feed(decoder: ChunkedBody, data: bytes) -> bytes:
        try:
            return decoder.feed(data)
        except ValueError as exc:
            raise UpstreamFailure(f"the engine sent a bad response: {exc}") from exc

    def _reusable(self, conn: _Connection) -> bool:
        """Whether the connection may carry another request after a body decoded by ChunkedBody: the body ended
        with nothing after it, and the engine keeps the connection alive (h11's rule: HTTP/1.1 and no
        `Connection: close`). Then a fresh h11 state replaces the one left at the head."""
        decoder = self._chunked
        assert decoder is not None
        if decoder.extra or conn.h11.our_state is not h11.DONE or conn.h11.their_http_version != b"1.1":
            return False
        tokens = [token.strip() for token in (self.header(b"connection") or b"").lower().split(b",")]
        if b"close" in tokens:
            return False
        conn.h11 = h11.Connection(h11.CLIENT)
        return True

    @staticmethod
    async def _receive(conn: _Connection) -> bytes:
        try:
            return await conn.stream.receive_some(READ_SIZE)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            raise UpstreamFailure(f"the engine connection broke mid-response: {exc}") from exc

    def idle_failure(self) -> UpstreamFailure:
        """The 504 for an engine silent past idle_timeout."""
        return UpstreamFailure(f"the engine sent nothing for {self._timeouts.idle_timeout:g} s", 504)

    async def watch_idle(self, scope: trio.CancelScope) -> None:
        """Cancel `scope` once a read of `body(watched=True)` has waited idle_timeout seconds; runs until cancelled.

        Only time spent waiting for the engine counts (as with a timeout per read): time the caller spends sending
        to its client does not. Wakes about once per idle_timeout whatever the number of reads: each read only
        stamps `read_since`. The caller raises `idle_failure()` when `scope.cancelled_caught`. A checkpoint.
        """
        idle = self._timeouts.idle_timeout
        deadline = self.read_since + idle
        while True:
            await trio.sleep_until(deadline)
            now = trio.current_time()
            if self._reading and now >= self.read_since + idle:
                scope.cancel()
                return
            deadline = (self.read_since if self._reading else now) + idle

    async def read(self) -> bytes:
        """The whole body."""
        parts = [chunk async for chunk in self.body()]
        return b"".join(parts)

    async def aclose(self) -> None:
        """Give the connection back when the body was read to the end, else close it."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self._done and not conn.at_eof and self._chunked is not None:
            if self._reusable(conn):
                self._pool._give_back(self._origin, conn)
            else:
                await conn.aclose()
        elif (self._done and not conn.at_eof and conn.h11.our_state is h11.DONE
                and conn.h11.their_state is h11.DONE):
            try:
                conn.h11.start_next_cycle()
            except h11.LocalProtocolError:
                await conn.aclose()
                return
            self._pool._give_back(self._origin, conn)
        else:
            await conn.aclose()


class UpstreamPool:
    """Keep-alive connections per origin (scheme, host, port); `max_idle` kept per origin, LIFO."""

    def __init__(self, timeouts: Timeouts = Timeouts(), max_idle: int = 256):
        self.timeouts = timeouts
        self.max_idle = max_idle
        self._idle: dict[tuple, list[_Connection]] = {}
        self._ssl_context: ssl.SSLContext | None = None  # made at the first https origin (30 ms of CPU to load)

    @property
    def _ssl(self) -> ssl.SSLContext:
        if self._ssl_context is None:
            self._ssl_context = ssl.create_default_context()
        return self._ssl_context

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
                tcp = await trio.open_tcp_stream(host, port)
                if scheme == "https":
                    stream: trio.SSLStream | PlainStream = trio.SSLStream(tcp, self._ssl, server_hostname=host,
                                                                          https_compatible=True)
                    await stream.do_handshake()
                else:
                    stream = PlainStream.from_trio(tcp)
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

    async def request(self, method: str, url: str, headers: list[tuple[bytes, bytes]], body: bytes, *,
                      on_sent: Callable[[], None] | None = None) -> UpstreamResponse:
        """Send a request and wait for the response head; the caller reads the body and closes the response.

        `on_sent()` is called once the request's bytes were handed to the connection (the engine may be working on
        it from then on). A pooled connection the engine closed while idle is retried once on a fresh one (nothing
        was processed). Raises UpstreamFailure (502/504).
        """
        parts = urlsplit(url)
        scheme = parts.scheme or "http"
        origin = (scheme, parts.hostname or "127.0.0.1", parts.port or (443 if scheme == "https" else 80))
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        host_header = parts.netloc.encode()
        head = h11.Request(method=method, target=target,
                           headers=[(b"host", host_header), (b"content-length", str(len(body)).encode()), *headers])
        stack = self._idle.get(origin)
        for attempt in (0, 1):
            reused = bool(stack) and attempt == 0
            conn = stack.pop() if reused else await self._connect(origin)
            try:
                return await self._exchange(origin, conn, head, body, on_sent)
            except UpstreamFailure as failure:
                await conn.aclose()
                if reused and failure.before_send:
                    continue
                raise
            except BaseException:
                await conn.aclose()
                raise
        raise AssertionError("unreachable")

    async def _exchange(self, origin: tuple, conn: _Connection, head: h11.Request, body: bytes,
                        on_sent: Callable[[], None] | None) -> UpstreamResponse:
        h = conn.h11
        data = h.send(head)
        data += h.send(h11.Data(data=body)) + h.send(h11.EndOfMessage())
        try:
            await conn.stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            raise UpstreamFailure(f"sending to the engine failed: {exc}", before_send=True) from exc
        if on_sent is not None:
            on_sent()
        received_any = False
        with trio.move_on_after(self.timeouts.head_timeout) as scope:
            while True:
                try:
                    event = h.next_event()
                except h11.RemoteProtocolError as exc:
                    raise UpstreamFailure(f"the engine sent a bad response: {exc}",
                                          before_send=not received_any) from exc
                if event is h11.NEED_DATA:
                    try:
                        chunk = await conn.stream.receive_some(READ_SIZE)
                    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                        raise UpstreamFailure(f"the engine connection broke: {exc}",
                                              before_send=not received_any) from exc
                    if not chunk and not received_any:
                        # a kept-alive connection the engine had closed: nothing was processed
                        raise UpstreamFailure("the engine closed the connection", before_send=True)
                    received_any = True
                    try:
                        h.receive_data(chunk)
                    except h11.RemoteProtocolError as exc:
                        raise UpstreamFailure(f"the engine sent a bad response: {exc}") from exc
                    continue
                if isinstance(event, h11.InformationalResponse):
                    continue
                if isinstance(event, h11.Response):
                    headers_out = [(k.lower(), v) for k, v in event.headers]
                    return UpstreamResponse(self, origin, conn, event.status_code, headers_out, self.timeouts)
                if isinstance(event, h11.ConnectionClosed):
                    raise UpstreamFailure("the engine closed the connection without answering",
                                          before_send=not received_any)
        raise UpstreamFailure(f"the engine did not answer within {self.timeouts.head_timeout:g} s", 504)

    async def aclose(self) -> None:
        """Close every idle connection."""
        idle, self._idle = self._idle, {}
        for stack in idle.values():
            for conn in stack:
                await conn.aclose()
