"""The engine relay: the only way from the network to an engine, and only with the replica key.

Engines listen on 127.0.0.1 (an internal port); for each shard that serves HTTP the agent starts the engine through
this module, as `python -P -m llmgw.engines.relay --listen HOST:PORT --engine PORT --key-env NAME -- ENGINE ARGV...`
(`relay_command`): one process that binds the node's address at the port the shard advertises (the one the
gateway's route table names), then starts the engine as its child (same process group, environment and log), relays
until the engine exits, and exits with the engine's status. So the relay is part of the shard's process: it keeps
serving while the agent restarts, is adopted with the engine, restarted with it, and stopped with it (SIGTERM to
the group: the relay waits for the engine to finish, so the engine's grace period holds). A port that cannot be
bound ends the process with status 3 and a sentence in the shard's log, before the engine starts.

For every request on a connection the relay reads the head, checks it (`llmgw.engines.relay_framing.parse_head`:
the replica key on every path and method, strict framing), then forwards the head and the body's bytes unchanged,
framed by Content-Length or chunked coding, so the next request's head is checked too. Anything refused is
answered by the relay itself (401 without the key, 400/431/501 for a head it will not forward, 502 when the engine
cannot be reached) and the connection is closed; nothing of a refused request reaches the engine.

The engine's answer goes back as it arrives: one read from the engine, one write to the client, no buffering and
no parsing, so chunked and SSE streams pass through event by event (the added cost per event is one read and one
write of a plain socket, measured by bench/engine_relay.py). When either side closes, the relay closes both: a
client that goes away stops the engine's generation as a direct connection would. Except for a request with an
`llmgw-once` key (the batch lines of `/v1/batches`): that one is read whole, run on the engine at most once whoever
still waits for it, and its answer kept for the same key again (`llmgw.engines.relay_once`); the connection ends
after its answer.

Limits (stated): the first head on a connection must arrive within `head_timeout` seconds of the connection (10 s:
a client without the key cannot hold a connection open longer); a later one within `idle_timeout` (300 s, the
gateway keeps idle connections to reuse; it retries once on a pooled connection closed meanwhile); at most
`max_connections` connections at once (4096; more are closed at once). Pipelined requests are forwarded as they
come; a refused one among them ends the connection, cutting any answer still on its way.

Sockets are plain non-blocking stdlib sockets with trio waits: one system call per read, as the gateway's
`tcp.PlainStream` (trio's SocketStream costs several per read).
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import trio

from llmgw.engines.relay_framing import (
    MAX_CHUNK_LINE_BYTES, MAX_HEAD_BYTES, Refusal, RequestHead, chunk_size, head_end, parse_head, refusal_response,
)
from llmgw.engines.relay_once import MAX_ONCE_BODY_BYTES, Onces

log = logging.getLogger("llmgw.engines.relay")

READ_SIZE = 65536


@dataclass(frozen=True)
class RelayTarget:
    """Where a relay forwards: the engine's loopback `host` and `port`, and the replica `key` (bytes) every request
    must carry. `head_timeout`, `idle_timeout` in seconds and `max_connections`: see the module."""

    host: str
    port: int
    key: bytes
    head_timeout: float = 10.0
    idle_timeout: float = 300.0
    max_connections: int = 4096


class _Plain:
    """A connected non-blocking stdlib socket with trio waits (not for concurrent use by two tasks)."""

    __slots__ = ("sock",)

    def __init__(self, sock: socket.socket):
        sock.setblocking(False)
        self.sock = sock

    async def receive_some(self, max_bytes: int = READ_SIZE) -> bytes:
        """Wait for data; b"" at end of stream. A checkpoint. Raises OSError."""
        while True:
            await trio.lowlevel.wait_readable(self.sock)
            try:
                return self.sock.recv(max_bytes)
            except BlockingIOError:
                continue

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        """Send every byte, waiting while the kernel's buffer is full. Not a checkpoint when the kernel takes it
        all at once (every caller waits to read next, which is one): a scheduler pass fewer per relayed event.
        Raises OSError."""
        view = memoryview(data)
        while view:
            try:
                sent = self.sock.send(view)
            except BlockingIOError:
                await trio.lowlevel.wait_writable(self.sock)
                continue
            view = view[sent:]

    def close(self) -> None:
        if self.sock.fileno() >= 0:
            trio.lowlevel.notify_closing(self.sock)
            self.sock.close()


def _detached(stream: trio.SocketStream) -> _Plain:
    return _Plain(socket.socket(fileno=stream.socket.detach()))


async def open_relay_listeners(host: str, port: int) -> list[trio.SocketListener]:
    """Listening sockets on `host`:`port` ("" or a wildcard: every address). Raises OSError when the port cannot
    be bound (taken, or an address this node does not have)."""
    return await trio.open_tcp_listeners(port, host=host or None)


async def serve_relay(listeners: list[trio.SocketListener], target: RelayTarget, *,
                      task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Relay every connection accepted on `listeners` to `target` (see the module) until cancelled; the listeners
    are closed on the way out. Reports `task_status.started()` once accepting."""
    async with trio.open_nursery() as nursery:
        relay = _Relay(target, Onces(lambda: _open_engine(target), nursery))
        try:
            task_status.started()
            await trio.serve_listeners(relay.handle, listeners, handler_nursery=nursery)
        finally:
            for listener in listeners:
                with trio.CancelScope(shield=True):
                    await listener.aclose()


async def _open_engine(target: RelayTarget) -> _Plain:
    return _detached(await trio.open_tcp_stream(target.host, target.port))


class _Relay:
    def __init__(self, target: RelayTarget, onces: Onces):
        self.target = target
        self.onces = onces
        self.connections = 0

    async def handle(self, stream: trio.SocketStream) -> None:
        client = _detached(stream)
        if self.connections >= self.target.max_connections:
            client.close()
            return
        self.connections += 1
        try:
            await _Connection(self.target, client, self.onces).run()
        except Exception:  # noqa: BLE001 - untrusted input: a bug one request finds must not end the shard's door
            log.exception("relay to port %d: a connection ended on an unexpected error", self.target.port)
        finally:
            self.connections -= 1


class _Connection:
    """One client connection: the task reading requests (this one) and the pump of the engine's answers."""

    def __init__(self, target: RelayTarget, client: _Plain, onces: Onces):
        self.target = target
        self.client = client
        self.onces = onces
        self.buffer = bytearray()
        self.engine: _Plain | None = None
        self.pump_scope = trio.CancelScope()
        self.pump_done = trio.Event()

    async def run(self) -> None:
        try:
            async with trio.open_nursery() as nursery:
                try:
                    await self._requests(nursery)
                except Refusal as refusal:
                    await self._refuse(refusal)
                except (OSError, trio.ClosedResourceError):
                    pass  # a reset by either side, or the engine closed (the pump closed the client): the end
                nursery.cancel_scope.cancel()
        finally:
            self.client.close()
            if self.engine is not None:
                self.engine.close()

    async def _requests(self, nursery: trio.Nursery) -> None:
        """Check and forward requests until the client closes, a head is late, or one is refused (raised)."""
        timeout = self.target.head_timeout
        while True:
            with trio.move_on_after(timeout) as waiting:
                end = await self._head()
            if waiting.cancelled_caught or end < 0:
                return  # the head did not come in time, or the client closed
            head = parse_head(bytes(self.buffer[:end]), self.target.key)
            timeout = self.target.idle_timeout
            if head.once:
                await self._once(head, end)
                return
            if self.engine is None:
                self.engine = await self._connect()
                nursery.start_soon(self._pump)
            if head.chunked:
                await self._send(end)
                await self._chunked_body()
            else:
                first = min(head.content_length, len(self.buffer) - end)
                await self._send(end + first)
                await self._body(head.content_length - first)

    async def _once(self, head: RequestHead, end: int) -> None:
        """Answer a request with an `llmgw-once` key: read whole, then run once (`relay_once`); the connection ends
        after the answer (it says `Connection: close`). An answer of the engine to an earlier request on this
        connection must have been read by then: the gateway does not pipeline."""
        if head.content_length > MAX_ONCE_BODY_BYTES:
            raise Refusal(413, f"a request with llmgw-once has at most {MAX_ONCE_BODY_BYTES} body bytes")
        while len(self.buffer) < end + head.content_length:
            await self._fill()
        request = bytes(self.buffer[:end + head.content_length])
        del self.buffer[:end + head.content_length]
        if self.engine is not None:  # the engine connection of earlier requests is done with
            self.pump_scope.cancel()
            await self.pump_done.wait()
            self.engine.close()
            self.engine = None
        answer = await self.onces.answer(head, end, request)
        await self.client.send_all(answer)

    async def _head(self) -> int:
        """Read until `self.buffer` holds a whole head; its end, or -1 when the client closed first. Raises Refusal
        (431) for a head longer than MAX_HEAD_BYTES."""
        end = head_end(self.buffer)
        while end < 0:
            if len(self.buffer) > MAX_HEAD_BYTES:
                raise Refusal(431, "the request head is too large")
            data = await self.client.receive_some()
            if not data:
                return -1
            start = len(self.buffer)
            self.buffer += data
            end = head_end(self.buffer, start)
        return end

    async def _connect(self) -> _Plain:
        try:
            return _detached(await trio.open_tcp_stream(self.target.host, self.target.port))
        except OSError as exc:
            raise Refusal(502, "the engine is not reachable (it may be starting or restarting)") from exc

    async def _send(self, count: int) -> None:
        """Forward the first `count` bytes of the buffer to the engine."""
        if count:
            assert self.engine is not None
            await self.engine.send_all(memoryview(self.buffer)[:count])
            del self.buffer[:count]

    async def _fill(self) -> None:
        data = await self.client.receive_some()
        if not data:
            raise Refusal(400, "the client closed inside a request body")
        self.buffer += data

    async def _body(self, remaining: int) -> None:
        """Forward `remaining` more body bytes as they arrive."""
        while remaining:
            if not self.buffer:
                await self._fill()
            count = min(remaining, len(self.buffer))
            await self._send(count)
            remaining -= count

    async def _line(self) -> int:
        """Read until the buffer holds a CRLF-ended line; the index past its CRLF. Raises Refusal (400) for a line
        longer than MAX_CHUNK_LINE_BYTES."""
        while (at := self.buffer.find(b"\r\n")) < 0:
            if len(self.buffer) > MAX_CHUNK_LINE_BYTES:
                raise Refusal(400, "a chunk-size or trailer line is too long")
            await self._fill()
        if at > MAX_CHUNK_LINE_BYTES:
            raise Refusal(400, "a chunk-size or trailer line is too long")
        return at + 2

    async def _chunked_body(self) -> None:
        """Forward a chunked body: each size line, its data and CRLF, the last chunk and the trailer fields."""
        while True:
            end = await self._line()
            size = chunk_size(bytes(self.buffer[:end - 2]))
            await self._send(end)
            if size == 0:
                break
            await self._body(size)
            while len(self.buffer) < 2:
                await self._fill()
            if self.buffer[:2] != b"\r\n":
                raise Refusal(400, "a chunk does not end with CRLF")
            await self._send(2)
        while True:  # trailer fields, then the blank line
            end = await self._line()
            await self._send(end)
            if end == 2:
                return

    async def _pump(self) -> None:
        """The engine's bytes to the client as they come, until the engine closes (then the connection ends)."""
        assert self.engine is not None
        engine, client = self.engine, self.client
        with self.pump_scope:
            try:
                while data := await engine.receive_some():
                    await client.send_all(data)
            except (OSError, trio.ClosedResourceError):
                pass
        self.pump_done.set()
        if not self.pump_scope.cancelled_caught:
            client.close()  # the engine ended the connection: so does the relay (wakes the reader)

    async def _refuse(self, refusal: Refusal) -> None:
        """Answer `refusal` to the client once no engine answer is on its way (the pump is stopped first)."""
        if self.engine is not None:
            self.pump_scope.cancel()
            await self.pump_done.wait()
            self.engine.close()
        if refusal.status != 401:
            log.debug("relay to port %d refused a request: %s", self.target.port, refusal.message)
        try:
            with trio.move_on_after(5):
                await self.client.send_all(refusal_response(refusal))
        except (OSError, trio.ClosedResourceError):
            pass  # the client went away: nothing to tell


# --------------------------------------------------------------------------------------------- the relay process

BIND_FAILED = 3
"""The relay process's exit status when its port cannot be bound (the engine was not started)."""


def relay_command(python: str, listen_host: str, listen_port: int, engine_port: int, key_env: str,
                  engine_argv: Sequence[str]) -> list[str]:
    """The argv that runs `engine_argv` behind a relay (see the module): `python -P -m llmgw.engines.relay --listen
    HOST:PORT --engine PORT --key-env NAME -- ENGINE_ARGV...`. The key stays in the environment (`key_env` names
    the variable the engine reads too), never in argv. Pure."""
    host = f"[{listen_host}]" if ":" in listen_host else listen_host
    return [python, "-P", "-m", "llmgw.engines.relay", "--listen", f"{host}:{listen_port}", "--engine",
            str(engine_port), "--key-env", key_env, "--", *engine_argv]


def engine_argv(argv: Sequence[str]) -> list[str]:
    """The engine's own argv inside a `relay_command` argv (everything after "--"); `argv` itself when it is not
    one. Pure."""
    argv = list(argv)
    if "llmgw.engines.relay" in argv and "--" in argv:
        return argv[argv.index("--") + 1:]
    return argv


async def _run_process(listen: str, engine_port: int, key: bytes, argv: list[str]) -> int:
    host, _, port = listen.rpartition(":")
    try:
        listeners = await open_relay_listeners(host.strip("[]"), int(port))
    except OSError as exc:
        print(f"llmgw relay: cannot listen on {listen} ({exc}); another process holds the port", file=sys.stderr,
              flush=True)
        return BIND_FAILED
    # SIGTERM goes to the whole process group: the engine finishes in its own time, then this process ends.
    process: subprocess.Popen | None = None
    try:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as _signals:
            async with trio.open_nursery() as nursery:
                await nursery.start(serve_relay, listeners, RelayTarget("127.0.0.1", engine_port, key))
                # Spawned from this (the main) thread: PR_SET_PDEATHSIG fires when the thread that forked ends, and
                # trio.lowlevel.open_process forks in a worker thread that ends when idle.
                process = subprocess.Popen(argv, preexec_fn=_die_with_parent)
                pidfd = os.pidfd_open(process.pid)
                try:
                    await trio.lowlevel.wait_readable(pidfd)  # readable once the engine has exited
                finally:
                    os.close(pidfd)
                status = process.wait()
                nursery.cancel_scope.cancel()
    finally:
        if process is not None and process.poll() is None:
            process.kill()  # the relay failed: no engine may serve without its door (nor hold its GPUs)
    return status if status >= 0 else 128 - status


def _die_with_parent() -> None:
    """In the engine's child process before exec: SIGKILL it when the relay's process ends (prctl
    PR_SET_PDEATHSIG), so an engine never outlives its relay, even a relay killed alone."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG (linux/prctl.h)


def main(args: Sequence[str] | None = None) -> None:
    """`python -m llmgw.engines.relay` (see the module). Exits with the engine's status (128 + N when a signal N
    ended it), or BIND_FAILED."""
    parser = argparse.ArgumentParser(prog="python -m llmgw.engines.relay", description="Relay to an engine.")
    parser.add_argument("--listen", required=True, help="HOST:PORT the relay listens on")
    parser.add_argument("--engine", type=int, required=True, help="the engine's port on 127.0.0.1")
    parser.add_argument("--key-env", required=True, help="the variable holding the replica key")
    parser.add_argument("argv", nargs=argparse.REMAINDER, help="-- the engine's command line")
    options = parser.parse_args(args)
    argv = options.argv[1:] if options.argv[:1] == ["--"] else options.argv
    if not argv:
        parser.error("the engine's command line is missing after --")
    key = os.environ.get(options.key_env, "").encode()
    sys.exit(trio.run(_run_process, options.listen, options.engine, key, argv))


if __name__ == "__main__":
    main()
