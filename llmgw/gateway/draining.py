"""Graceful drain: a gateway told to stop (cancelled, or `Gateway.drain()`) loses no request that had started.

    drain = Drain(timeout=30.0)
    port = await nursery.start(serve_http, app, config, drain)   # hypercorn's trio connections, our listeners
    with drain.counted(): ...                                   # each request (not /health), in the app
    with drain.cuttable() as cut: ...relay...                   # an admitted request's work; cut.cancelled_caught
    await drain.run()                                            # once: stop, wait, cut what is left, done

`Drain.run` goes through these steps, once:
1. `started` is set: `serve_http` stops accepting (its listening sockets are closed, so the kernel refuses new
   connections and resets those waiting in the backlog; other SO_REUSEPORT workers keep the address), while the
   connections already open stay open: the app answers what arrives on them 503 with `Retry-After` and
   `Connection: close` (`draining_error`, `close_header`), and `/health` says "draining" (503) so a load balancer moves away;
2. the requests in flight (`counted`) finish, for `timeout` seconds at most;
3. past it, every request still working is cut (`cuttable` scopes cancelled; one that starts later is cut at once):
   the app bills what it used and ends it with a 503, or, once a stream's head is out, an error event; they get
   CUT_GRACE seconds to settle and say so;
4. `done` is set: `serve_http` tells hypercorn's connections to close (idle keep-alive ones at once, busy ones after
   their answer, `config.graceful_timeout` seconds at most) and returns once they have.

Why not hypercorn's own `serve(shutdown_trigger=...)`: its trigger closes the listeners and the idle keep-alive
connections at the same moment and then cancels what is still running after `graceful_timeout` (the client gets an
empty 500 or a cut body). `serve_http` is hypercorn 0.18's `worker_serve` without the lifespan (the gateway has none)
and with the listeners closed at `started`, the connections told to close at `done`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial

import trio

from llmgw.gateway.problems import ApiError

DRAIN_TIMEOUT = 30.0
"""Seconds requests in flight get to finish once a drain begins (llmgw.yaml `listeners.gateway.drain_timeout`)."""
CUT_GRACE = 5.0
"""Seconds the requests cut at the drain timeout get to settle their usage and send their error."""
RETRY_AFTER_SECONDS = 2
"""The `Retry-After` of a request refused while draining: another gateway, or this one started again, takes it."""


def close_header(scope) -> list[tuple[bytes, bytes]]:
    """`Connection: close` for an HTTP/1.x request of ASGI `scope`; none for HTTP/2 (a connection-specific header
    is not allowed there: the connection closes with GOAWAY when the drain is done)."""
    return [] if scope.get("http_version", "1.1").startswith("2") else [(b"connection", b"close")]


def draining_error() -> ApiError:
    """The 503 a request gets when it arrives while the gateway drains, with Retry-After (the caller adds
    `close_header`)."""
    return ApiError(503, "This gateway is stopping; send the request again (another gateway or this one started "
                         "again will take it).", "server_error", "gateway_draining",
                    headers=[(b"retry-after", str(RETRY_AFTER_SECONDS).encode())])


def cut_error() -> ApiError:
    """The 503 (or error event) of a request still working when the drain timeout passed, with Retry-After (its
    connection closes when the drain is done)."""
    return ApiError(503, "This gateway stopped before the answer was complete (its drain timeout passed); what was "
                         "generated is billed. Send the request again.", "server_error", "gateway_stopped",
                    headers=[(b"retry-after", str(RETRY_AFTER_SECONDS).encode())])


class Drain:
    """One gateway's drain (see the module docstring). `timeout`: seconds requests in flight get (> 0).

    `started`, `done`: trio Events (set by `run`); `cut`: True once the timeout passed with requests working.
    """

    def __init__(self, timeout: float = DRAIN_TIMEOUT):
        self.timeout = timeout
        self.started = trio.Event()
        self.done = trio.Event()
        self.cut = False
        self._requests = 0
        self._changed = trio.Event()
        self._scopes: set[trio.CancelScope] = set()

    @property
    def draining(self) -> bool:
        """True from the drain's start on: new requests are refused."""
        return self.started.is_set()

    @property
    def in_flight(self) -> int:
        """Requests counted now (`counted`)."""
        return self._requests

    @contextmanager
    def counted(self) -> Iterator[None]:
        """Count one request in flight for the block's duration (the drain waits for it)."""
        self._requests += 1
        try:
            yield
        finally:
            self._requests -= 1
            self._changed.set()
            self._changed = trio.Event()

    @contextmanager
    def cuttable(self) -> Iterator[trio.CancelScope]:
        """A cancel scope around an admitted request's work, cancelled when the drain timeout passes (at once when it
        has passed already); the caller reads `cancelled_caught` after the block to tell it was cut."""
        scope = trio.CancelScope()
        if self.cut:
            scope.cancel()
        self._scopes.add(scope)
        try:
            with scope:
                yield scope
        finally:
            self._scopes.discard(scope)

    async def _until_idle(self) -> None:
        while self._requests:
            await self._changed.wait()

    async def run(self) -> None:
        """Drain (steps 1-4 of the module docstring); a second call waits for the first's end. Returns within
        `timeout + CUT_GRACE` seconds. A checkpoint."""
        if self.started.is_set():
            await self.done.wait()
            return
        self.started.set()
        with trio.move_on_after(self.timeout):
            await self._until_idle()
        if self._requests:
            self.cut = True
            for scope in list(self._scopes):
                scope.cancel()
            with trio.move_on_after(CUT_GRACE):
                await self._until_idle()
        self.done.set()


async def serve_http(app, config, drain: Drain, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Serve the ASGI `app` on hypercorn's trio connections at `config.bind` (one address, or "fd://N") until
    `drain.done` and its connections have closed; `task_status.started(port)` with the bound port. Accepting stops at
    `drain.started` (the listening sockets close). Cancelling it stops at once. Raises OSError when it cannot bind."""
    from hypercorn.trio import run as hypercorn_run  # its TCPServer: the one `client_writes.install` put there
    from hypercorn.trio.statsd import StatsdLogger
    from hypercorn.trio.worker_context import WorkerContext
    from hypercorn.typing import ConnectionState
    from hypercorn.utils import wrap_app

    config.set_statsd_logger_class(StatsdLogger)
    context = WorkerContext(None)
    sockets = config.create_sockets().insecure_sockets
    listeners = []
    for sock in sockets:
        sock.listen(config.backlog)
        listeners.append(trio.SocketListener(trio.socket.from_stdlib_socket(sock)))
    port = listeners[0].socket.getsockname()[1]
    handler = partial(hypercorn_run.TCPServer, wrap_app(app, config.wsgi_max_body_size, None), config, context,
                      ConnectionState({}))
    try:
        async with trio.open_nursery() as connections:
            async with trio.open_nursery() as accepting:
                accepting.start_soon(partial(trio.serve_listeners, handler, listeners, handler_nursery=connections))
                task_status.started(port)
                await drain.started.wait()
                accepting.cancel_scope.cancel()  # serve_listeners closes each listener on its way out
            await drain.done.wait()
            await context.terminated.set()  # idle keep-alive connections close now, busy ones after their answer
            connections.cancel_scope.deadline = trio.current_time() + config.graceful_timeout
    finally:
        for listener in listeners:  # when cancelled before the drain (closing twice is harmless)
            listener.socket.close()
