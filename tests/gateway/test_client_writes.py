"""hypercorn with the gateway's immediate-write hook (llmgw.gateway.client_writes) over real loopback sockets:
a client that reads slowly still gets every byte in order (the kernel's buffer fills, the rest waits), and a client
that leaves mid-response ends the response without an error in the application.

The slow client sets a receive buffer of 64 KiB (the kernel doubles it) and reads nothing until the application's
sends have stalled, then reads it all. A receive buffer far below loopback's MSS (64 KiB) is not used: the sender's
silly-window avoidance then waits for the 200 ms persist timer on every few KiB, and 8 MiB took 160 s of idle
waiting."""

from __future__ import annotations

import socket

import trio
from hypercorn.config import Config
from hypercorn.trio import serve

from llmgw.gateway.asgi import serve_lifespan
from llmgw.gateway.client_writes import install

PIECE = 64 * 1024
PIECES = 128  # 8 MiB: far over a loopback socket's send buffer


async def start(nursery, app) -> int:
    install()
    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    config.loglevel = "WARNING"
    binds = await nursery.start(lambda task_status: serve(app, config, task_status=task_status))
    return int(binds[0].rsplit(":", 1)[1])


def piece(i: int) -> bytes:
    return bytes([i % 251]) * PIECE


async def test_a_slow_reader_gets_every_byte_in_order_and_a_client_that_leaves_ends_the_response() -> None:
    finished: list[str] = []
    sent = [0]  # body pieces the application's send has returned for, on the current response

    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            await serve_lifespan(receive, send)
            return
        sent[0] = 0
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        try:
            for i in range(PIECES):
                await send({"type": "http.response.body", "body": piece(i), "more_body": True})
                sent[0] += 1
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            finished.append("whole")
        except BaseException as exc:
            finished.append(type(exc).__name__)
            raise

    async with trio.open_nursery() as nursery:
        port = await start(nursery, app)

        client = trio.socket.socket()
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        await client.connect(("127.0.0.1", port))
        await client.send(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        with trio.fail_after(10):  # the client reads nothing until the application's sends stop returning
            seen, still = -1, 0
            while still < 4:
                await trio.sleep(0.05)
                seen, still = sent[0], (still + 1 if sent[0] == seen > 0 else 0)
        assert 0 < sent[0] < PIECES and finished == []  # the kernel's buffers are full, the rest waits
        parts = []
        with client, trio.fail_after(10):
            while data := await client.recv(1 << 20):
                parts.append(data)
        raw = b"".join(parts)
        head, _, body = raw.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200")
        decoded, rest = [], body
        while True:  # chunked transfer encoding
            size_line, _, rest = rest.partition(b"\r\n")
            size = int(size_line, 16)
            if size == 0:
                break
            decoded.append(rest[:size])
            rest = rest[size + 2:]
        assert b"".join(decoded) == b"".join(piece(i) for i in range(PIECES))
        with trio.fail_after(10):  # the client can see the end before the application's last send returns
            while not finished:
                await trio.sleep(0.01)
        assert finished == ["whole"]

        def leave_early() -> None:
            with socket.create_connection(("127.0.0.1", port)) as s:
                s.sendall(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
                s.recv(PIECE)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # reset

        await trio.to_thread.run_sync(leave_early)
        with trio.fail_after(10):
            while len(finished) < 2:
                await trio.sleep(0.05)
        assert finished[1] == "whole"  # hypercorn drops what a gone client cannot take; the app is not failed
        nursery.cancel_scope.cancel()


async def test_body_pieces_are_framed_as_h11_frames_them_and_other_framings_are_left_to_h11() -> None:
    """The framing hook (FramingH11Protocol) against h11's own framing: an HTTP/1.1 client gets the very bytes h11
    writes for a chunked answer (pieces of 1 byte to 70 KB, then keep-alive: a second request on the connection);
    an HTTP/1.0 client gets the close-delimited body h11 writes for it, and a sized answer stays sized."""
    pieces = [b"x", b"data: {}\n\n", bytes(range(256)) * 300]

    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            await serve_lifespan(receive, send)
            return
        sized = scope["path"] == "/sized"
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")] + (
            [(b"content-length", str(sum(map(len, pieces))).encode())] if sized else [])})
        for p in pieces:
            await send({"type": "http.response.body", "body": p, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    def h11_wrote(http_version: bytes) -> bytes:
        """The body bytes h11 itself writes for `pieces` to a client of `http_version`."""
        import h11
        conn = h11.Connection(h11.SERVER)
        conn.receive_data(b"GET / HTTP/" + http_version + b"\r\nhost: x\r\n\r\n")
        conn.next_event()
        conn.send(h11.Response(status_code=200, headers=[]))
        return b"".join(conn.send(h11.Data(data=p)) for p in pieces) + conn.send(h11.EndOfMessage())

    def exchange(requests: bytes) -> list[bytes]:
        """The answers' bodies, read until the gateway closes (the last request asks it to)."""
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(requests)
            parts = []
            while data := s.recv(65536):
                parts.append(data)
        return [answer.partition(b"\r\n\r\n")[2] for answer in b"".join(parts).split(b"HTTP/1.1 200")[1:]]

    async with trio.open_nursery() as nursery:
        port = await start(nursery, app)
        get, last = b"GET / HTTP/1.1\r\nhost: x\r\n\r\n", b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
        assert await trio.to_thread.run_sync(exchange, get + last) == [h11_wrote(b"1.1")] * 2
        old = await trio.to_thread.run_sync(exchange, b"GET / HTTP/1.0\r\nhost: x\r\n\r\n")
        assert old == [h11_wrote(b"1.0")] == [b"".join(pieces)]
        sized = await trio.to_thread.run_sync(exchange, last.replace(b"GET /", b"GET /sized"))
        assert sized == [b"".join(pieces)]
        nursery.cancel_scope.cancel()
