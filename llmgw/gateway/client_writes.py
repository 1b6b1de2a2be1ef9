"""Writing to clients without a scheduler pass per write, and framing chunked body pieces without h11: hooks on hypercorn.

hypercorn (0.17-0.18, trio worker) writes every response piece through `TCPServer.protocol_send`: a trio.Lock
(acquiring it is a scheduler pass), a shielded CancelScope, then trio's `SocketStream.send_all` (a conflict detector,
two generator-based context managers, and one more scheduler pass after the `send` call). A relayed stream writes
once per token, so that was the largest part of the gateway's CPU per chunk left after its own relay work was cut
(cProfile of bench/gateway_overhead.py --token-gap-ms 20: hypercorn's app_send about half of the active time).

`ImmediateWriteTCPServer.protocol_send` first tries the write at once, synchronously, with `os.write` on the
socket's descriptor, when nothing else is being written on the connection (the lock is free) and the connection is
plain TCP. Whatever the kernel did not take (its buffer full: a slow client), and every error, goes through
hypercorn's own path unchanged, which waits for the lock and for writability and handles a closed connection. The
bytes and their order are the same; only the waiting is skipped when there is none to do. Without a scheduler pass
the call is not a checkpoint: every caller in hypercorn and the gateway awaits something else (a read) next.

`install()` replaces the `TCPServer` name that `hypercorn.trio.run.worker_serve` (and the gateway's
`draining.serve_http`) instantiates per connection (a module global read at call time); it is a contribution-quality change kept here as a subclass until hypercorn has
such a fast path itself.

`FramingH11Protocol.stream_send` frames a response body piece for a chunked HTTP/1.1 response itself
(`<size in hex>CRLF<data>CRLF`, RFC 9112 section 7.1) instead of through h11's `Connection.send`, which builds an
`h11.Data` event, runs its state machine (a body piece changes no state) and joins the writer's three pieces: about
5 µs per relayed chunk against 0.3 µs. It applies only when h11's own writer for the response is its ChunkedWriter and
the connection is in SEND_BODY (what h11 would frame the same way); anything else (the head, the end, a sized or
HTTP/1.0 body, an errored connection) goes through h11 as before, so h11's state stays exact. h11 has no public
name for the writer in use: `Connection._writer` and `h11._writers.ChunkedWriter` (h11 0.14-0.16) are read, and
without them the hook falls back to h11 for everything. `install()` puts it where hypercorn's ProtocolWrapper
instantiates `H11Protocol` (a module global read per connection).

`FramingH11Protocol` also shields the end of each response from the app's cancellation. hypercorn recycles an
HTTP/1.1 keep-alive connection inside the app's last `send` (`StreamClosed`): it delivers `http.disconnect` to the
app, then restarts the connection's idle task (the keep-alive timeout, and the wait for the server's stop). The
gateway's request cancels its work when it receives `http.disconnect` (`app._watch_disconnect`), which cancelled that
restart at its first checkpoint: the connection stayed open without an idle task, so it never timed out and a
stopping gateway waited `graceful_timeout` (5 s) for it instead of closing it at once. Shielded, the recycle always
completes (it only writes nothing and starts a task).
"""

from __future__ import annotations

import os

import h11
import hypercorn.protocol
import trio
from hypercorn.events import Event, RawData
from hypercorn.protocol.events import Body, StreamClosed
from hypercorn.protocol.events import Event as StreamEvent
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.trio import run as hypercorn_run
from hypercorn.trio.tcp_server import TCPServer

try:
    from h11._writers import ChunkedWriter
except ImportError:  # a future h11 that moved it: no own framing, h11 frames everything
    ChunkedWriter = None  # type: ignore[assignment,misc]


class ImmediateWriteTCPServer(TCPServer):
    """hypercorn's TCPServer whose writes go straight to the socket when they can (see the module docstring)."""

    async def protocol_send(self, event: Event) -> None:
        if type(event) is RawData and type(self.stream) is trio.SocketStream and not self.send_lock.locked():
            data = event.data
            fd = self.stream.socket.fileno()  # -1 once closed: hypercorn's path reports the closed connection
            if fd >= 0:
                try:
                    sent = os.write(fd, data)
                except BlockingIOError:
                    sent = 0
                except OSError:  # reset, broken pipe: hypercorn's own path raises and handles it as it always did
                    sent = 0
                if sent == len(data):
                    return
                if sent:
                    event = RawData(data=data[sent:])
        await super().protocol_send(event)


class FramingH11Protocol(H11Protocol):
    """hypercorn's HTTP/1.1 protocol that frames chunked body pieces itself and recycles a keep-alive connection
    whatever cancels the app (see the module docstring)."""

    async def stream_send(self, event: StreamEvent) -> None:
        if type(event) is StreamClosed:
            with trio.CancelScope(shield=True):  # the idle task must start even if the app's task is cancelled
                await super().stream_send(event)
            return
        if type(event) is Body and ChunkedWriter is not None:
            connection = self.connection
            if (type(getattr(connection, "_writer", None)) is ChunkedWriter and connection.our_state is h11.SEND_BODY
                    and event.data):
                data = event.data
                await self.send(RawData(data=b"%x\r\n%b\r\n" % (len(data), data)))
                return
        await super().stream_send(event)


def install() -> None:
    """Make hypercorn's trio worker serve connections with ImmediateWriteTCPServer and FramingH11Protocol
    (idempotent, process-wide)."""
    hypercorn_run.TCPServer = ImmediateWriteTCPServer  # type: ignore[misc]
    hypercorn.protocol.H11Protocol = FramingH11Protocol  # type: ignore[misc]
