"""Writing to clients without a scheduler pass per write: a hook on hypercorn's trio TCPServer.

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

`install()` replaces the `TCPServer` name that `hypercorn.trio.run.worker_serve` instantiates per connection (a
module global read at call time); it is a contribution-quality change kept here as a subclass until hypercorn has
such a fast path itself.
"""

from __future__ import annotations

import os

import trio
from hypercorn.events import Event, RawData
from hypercorn.trio import run as hypercorn_run
from hypercorn.trio.tcp_server import TCPServer


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


def install() -> None:
    """Make hypercorn's trio worker serve connections with ImmediateWriteTCPServer (idempotent, process-wide)."""
    hypercorn_run.TCPServer = ImmediateWriteTCPServer  # type: ignore[misc]
