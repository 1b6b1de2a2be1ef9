"""The upstream client (h11 over trio) frames chunked and sized bodies: any split of the bytes gives the same body, and a
complete body leaves the connection reusable; bad framing fails the request. The streamed relay's reader
(`receive_watched`, which decodes a chunked body with `chunked.ChunkedBody` instead of h11) is held to the same."""

from __future__ import annotations

import pytest
import trio

from llmgw.gateway.upstream import Timeouts, UpstreamFailure, UpstreamPool

CHUNKED = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
           b"7;ext=1\r\ndata: 1\r\n" b"10\r\n" + b"x" * 16 + b"\r\n" b"0\r\nx-trailer: yes\r\n\r\n")
CHUNKED_BODY = b"data: 1" + b"x" * 16
READERS = ["h11", "watched"]


async def read_body(response, reader: str) -> bytes:
    """The whole body through `read()` (h11) or the streamed relay's `receive_watched()` loop."""
    if reader == "h11":
        return await response.read()
    parts = []
    while data := await response.receive_watched():
        parts.append(data)
    return b"".join(parts)


async def serve(answers: list[bytes], piece: int, connections: list[int], nursery, linger: bool = False,
                pause: float = 0.0) -> int:
    """A raw HTTP/1.1 server on 127.0.0.1 that answers each request with the next of `answers`, written `piece`
    bytes at a time `pause` seconds apart (then, with `linger`, keeps the connection open in silence); returns its port and counts
    accepted connections in `connections`."""
    async def handler(stream):
        connections.append(1)
        buffer = b""
        while answers:
            while b"\r\n\r\n" not in buffer:
                data = await stream.receive_some(65536)
                if not data:
                    return
                buffer += data
            head, _, buffer = buffer.partition(b"\r\n\r\n")
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            while len(buffer) < length:
                buffer += await stream.receive_some(65536)
            buffer = buffer[length:]
            answer = answers.pop(0)
            for at in range(0, len(answer), piece):
                await stream.send_all(answer[at:at + piece])
                await trio.sleep(pause)
        if linger:
            await trio.sleep_forever()

    listeners = await nursery.start(trio.serve_tcp, handler, 0)
    return listeners[0].socket.getsockname()[1]


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("piece", [1, 3, 1000])
async def test_a_chunked_body_split_anywhere_arrives_whole_and_the_connection_is_reused(piece: int, reader: str) -> None:
    connections: list[int] = []
    async with trio.open_nursery() as nursery:
        port = await serve([CHUNKED, CHUNKED], piece, connections, nursery)
        pool = UpstreamPool()
        for _ in range(2):
            response = await pool.request("POST", f"http://127.0.0.1:{port}/v1/x", [], b"{}")
            assert response.status == 200
            assert await read_body(response, reader) == CHUNKED_BODY
            await response.aclose()
        assert len(connections) == 1
        await pool.aclose()
        nursery.cancel_scope.cancel()


async def test_a_sized_body_is_read_to_its_length_and_a_closing_answer_is_not_kept() -> None:
    sized = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello"
    closing = b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok"
    connections: list[int] = []
    async with trio.open_nursery() as nursery:
        port = await serve([sized, closing, sized], 2, connections, nursery)
        pool = UpstreamPool()
        bodies = []
        for _ in range(3):
            response = await pool.request("POST", f"http://127.0.0.1:{port}/", [], b"{}")
            bodies.append(await response.read())
            await response.aclose()
        assert bodies == [b"hello", b"ok", b"hello"]
        assert len(connections) == 2  # the connection that said close was not reused
        await pool.aclose()
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("bad", [b"zz\r\nab\r\n0\r\n\r\n", b"2\r\nabXY0\r\n\r\n", b"2\r\nab\r\n",
                                 b"0x2\r\nab\r\n0\r\n\r\n"])
async def test_bad_chunk_framing_fails_the_request(bad: bytes, reader: str) -> None:
    answer = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + bad
    async with trio.open_nursery() as nursery:
        port = await serve([answer], 1000, [], nursery)
        pool = UpstreamPool()
        response = await pool.request("POST", f"http://127.0.0.1:{port}/", [], b"{}")
        with pytest.raises(UpstreamFailure):
            await read_body(response, reader)
        await response.aclose()
        await pool.aclose()
        nursery.cancel_scope.cancel()


async def test_an_interim_answer_is_skipped_and_a_body_without_length_runs_to_the_close() -> None:
    answer = (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n"
              b"until the end")
    connections: list[int] = []
    async with trio.open_nursery() as nursery:
        port = await serve([answer], 4, connections, nursery)
        pool = UpstreamPool()
        response = await pool.request("POST", f"http://127.0.0.1:{port}/", [], b"{}")
        assert (response.status, response.header(b"content-type")) == (200, b"text/plain")
        assert await response.read() == b"until the end"
        await response.aclose()
        assert pool._idle.get(("http", "127.0.0.1", port), []) == []  # a close-delimited body ends its connection
        await pool.aclose()
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("answer", [b"HTTP/2 200 OK\r\n\r\n", b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
                                    b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\nabc"])
async def test_a_malformed_response_head_fails_the_request(answer: bytes) -> None:
    async with trio.open_nursery() as nursery:
        port = await serve([answer], 1000, [], nursery)
        pool = UpstreamPool()
        with pytest.raises(UpstreamFailure):
            await pool.request("POST", f"http://127.0.0.1:{port}/", [], b"{}")
        await pool.aclose()
        nursery.cancel_scope.cancel()


async def test_relaying_delivers_every_byte_and_an_engine_silent_past_the_idle_timeout_is_a_504() -> None:
    async with trio.open_nursery() as nursery:
        port = await serve([CHUNKED], 30, [], nursery, pause=0.05)
        pool = UpstreamPool(Timeouts(idle_timeout=0.2))
        response = await pool.request("POST", f"http://127.0.0.1:{port}/", [], b"{}")
        pieces: list[bytes] = []
        async for data in response.body():
            pieces.append(data)
            await trio.sleep(0.3)  # slower than the idle timeout below: delivering does not count as silence
        assert b"".join(pieces) == CHUNKED_BODY and len(pieces) > 1, pieces
        await response.aclose()

        silent = await serve([CHUNKED[:-20]], 1000, [], nursery, linger=True)
        response = await pool.request("POST", f"http://127.0.0.1:{silent}/", [], b"{}")
        with pytest.raises(UpstreamFailure) as failure:
            async for _ in response.body():
                pass
        assert failure.value.status == 504
        await response.aclose()
        nursery.cancel_scope.cancel()


async def test_a_watched_body_fails_only_after_the_engine_was_silent_for_the_idle_timeout() -> None:
    """The relay's idle watch (one task per stream instead of a cancel scope per read) counts silence only: the head
    and first chunk in one write, then chunks 0.15 s apart for 0.6 s pass an idle timeout of 0.3 s; the silence
    after them does not."""
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"

    async def engine(stream):
        await stream.receive_some(65536)
        await stream.send_all(head + b"5\r\nchunk\r\n")
        for _ in range(4):
            await trio.sleep(0.15)
            await stream.send_all(b"5\r\nchunk\r\n")
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        port = (await nursery.start(trio.serve_tcp, engine, 0))[0].socket.getsockname()[1]
        pool = UpstreamPool(Timeouts(idle_timeout=0.3))
        response = await pool.request("POST", f"http://127.0.0.1:{port}/", [], b"{}")
        pieces: list[bytes] = []
        with trio.CancelScope() as idle_scope:
            async with trio.open_nursery() as watch:
                watch.start_soon(response.watch_idle, idle_scope)
                while data := await response.receive_watched():
                    pieces.append(data)
        assert idle_scope.cancelled_caught and response.idle_failure().status == 504
        assert b"".join(pieces) == b"chunk" * 5
        await response.aclose()
        await pool.aclose()
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("answer", [
    CHUNKED.replace(b"\r\n\r\n", b"\r\nconnection: Close\r\n\r\n", 1),  # the engine ends the connection
    CHUNKED.replace(b"HTTP/1.1", b"HTTP/1.0", 1),  # HTTP/1.0: no keep-alive
])
async def test_a_chunked_answer_that_closes_its_connection_is_not_kept(answer: bytes, reader: str) -> None:
    async with trio.open_nursery() as nursery:
        port = await serve([answer], 1000, [], nursery, linger=True)
        pool = UpstreamPool()
        response = await pool.request("POST", f"http://127.0.0.1:{port}/", [], b"{}")
        assert await read_body(response, reader) == CHUNKED_BODY
        await response.aclose()
        assert pool._idle.get(("http", "127.0.0.1", port), []) == []
        await pool.aclose()
        nursery.cancel_scope.cancel()
