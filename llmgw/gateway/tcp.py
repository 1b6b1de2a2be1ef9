"""A plain TCP stream to an engine that costs one system call and one scheduler pass per read.

A stream relays one read per token. trio's SocketStream, for each `receive_some`, first tries `recv` (EAGAIN when
the token is not there yet, which is nearly always), waits for readability, calls `recv` again, then passes through
the scheduler once more (`cancel_shielded_checkpoint`), inside three generator-based context managers (conflict
detection, error translation, the try-sync sandwich): about a quarter of the gateway's CPU per relayed chunk in
callgrind (bench/relay_instructions.py). `PlainStream` waits first and reads once. It is used for `http://` engines
only; TLS keeps trio's SSLStream.

Semantics kept from trio's streams: `receive_some` and `send_all` are checkpoints and can be cancelled while they
wait; errors are OSError (the upstream client maps them to UpstreamFailure); `aclose` tells trio the socket is
closing so a task waiting on it wakes with ClosedResourceError.

`reuseport_socket` binds the listening socket of a gateway worker process (several share one port, SO_REUSEPORT).
"""

from __future__ import annotations

import socket

import trio


class PlainStream:
    """A connected, non-blocking stdlib TCP socket with trio waits. Not for concurrent use by two tasks."""

    def __init__(self, sock: socket.socket):
        sock.setblocking(False)
        self.socket = sock

    @classmethod
    def from_trio(cls, stream: trio.SocketStream) -> PlainStream:
        """Take over the socket of a connected trio SocketStream (which must not be used afterwards)."""
        return cls(socket.socket(fileno=stream.socket.detach()))

    async def receive_some(self, max_bytes: int) -> bytes:
        """Wait for data and return up to `max_bytes` of it; b"" when the engine closed its side. A checkpoint.
        Raises OSError (reset) or trio.ClosedResourceError (closed by `aclose` meanwhile)."""
        while True:
            await trio.lowlevel.wait_readable(self.socket)
            try:
                return self.socket.recv(max_bytes)
            except BlockingIOError:  # a spurious wake-up: wait again
                continue

    async def send_all(self, data: bytes) -> None:
        """Send every byte, waiting while the kernel's buffer is full. A checkpoint. Raises OSError."""
        view = memoryview(data)
        while view:
            try:
                sent = self.socket.send(view)
            except BlockingIOError:
                await trio.lowlevel.wait_writable(self.socket)
                continue
            view = view[sent:]
        await trio.lowlevel.checkpoint()

    async def aclose(self) -> None:
        """Close the socket (idempotent). A checkpoint."""
        if self.socket.fileno() >= 0:
            trio.lowlevel.notify_closing(self.socket)
            self.socket.close()
        await trio.lowlevel.checkpoint()


def reuseport_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to `host`:`port` with SO_REUSEPORT (and SO_REUSEADDR, TCP_NODELAY), not listening yet.
    Raises OSError when the address cannot be bound."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock
