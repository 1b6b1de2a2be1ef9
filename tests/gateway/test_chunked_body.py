"""`ChunkedBody` decodes what h11 decodes: the same data for any split of the bytes, the same bodies refused."""

from __future__ import annotations

import random

import h11
import pytest

from llmgw.gateway.chunked import ChunkedBody

HEAD = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"


def by_h11(body: bytes) -> bytes:
    """The data h11 0.16 decodes from a chunked body; raises h11.RemoteProtocolError where h11 refuses it."""
    conn = h11.Connection(h11.CLIENT)
    conn.send(h11.Request(method="GET", target="/", headers=[("host", "x")]))
    conn.send(h11.EndOfMessage())
    conn.receive_data(HEAD + body)
    out = []
    while True:
        event = conn.next_event()
        if type(event) is h11.Data:
            out.append(event.data)
        elif type(event) is h11.EndOfMessage:
            return b"".join(out)
        elif event is h11.NEED_DATA:
            raise h11.RemoteProtocolError("incomplete")


def by_us(pieces: list[bytes]) -> tuple[bytes, bool]:
    decoder = ChunkedBody()
    return b"".join(decoder.feed(piece) for piece in pieces), decoder.done


def encode(chunks: list[bytes], trailers: bytes = b"") -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n" + trailers + b"\r\n"


SSE = [b'data: {"choices":[{"delta":{"content":"tok %d"}}]}\n\n' % i for i in range(5)]
BODIES = [
    encode(SSE),
    encode([b"x" * 300, b"\r\n", b"y"], b"x-trailer: yes\r\nother: 1\r\n"),
    b"7;ext=1\r\ndata: 1\r\n" b"10;a=b \r\n" + b"x" * 16 + b"\r\n" b"0\r\n\r\n",
    b"000A\r\n0123456789\r\n0\r\n\r\n",
]


@pytest.mark.parametrize("body", BODIES)
def test_any_split_gives_the_data_h11_gives(body: bytes) -> None:
    expected = by_h11(body)
    assert by_us([body]) == (expected, True)
    for at in range(len(body) + 1):  # every split in two
        assert by_us([body[:at], body[at:]]) == (expected, True), at
    assert by_us([body[i:i + 1] for i in range(len(body))]) == (expected, True)  # a byte at a time
    rng = random.Random(7)
    for _ in range(50):
        cuts = sorted(rng.sample(range(1, len(body)), 4))
        pieces = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)])]
        assert by_us(pieces) == (expected, True), cuts


def test_a_read_of_exactly_one_chunk_is_its_data_and_bytes_after_the_end_are_kept_apart() -> None:
    decoder = ChunkedBody()
    assert decoder.feed(b"5\r\nhello\r\n") == b"hello"
    assert decoder.feed(b"3\r\nabc\r\n0\r\n\r\nHTTP/1.1") == b"abc"
    assert decoder.done and decoder.extra == b"HTTP/1.1"
    assert decoder.feed(b" 200") == b"" and decoder.extra == b"HTTP/1.1 200"
    incomplete = ChunkedBody()
    assert incomplete.feed(encode(SSE)[:-2]) == b"".join(SSE) and not incomplete.done


@pytest.mark.parametrize("bad", [b"zz\r\nab\r\n0\r\n\r\n", b"2\r\nabXY0\r\n\r\n", b"0x2\r\nab\r\n0\r\n\r\n",
                                 b"+2\r\nab\r\n0\r\n\r\n", b"\r\nab\r\n", b"2\nab\r\n0\r\n\r\n",
                                 b"2_0\r\n" + b"a" * 32 + b"\r\n0\r\n\r\n", b"2\r\nab\n0\r\n\r\n"])
def test_bodies_h11_refuses_are_refused(bad: bytes) -> None:
    with pytest.raises(h11.RemoteProtocolError):
        by_h11(bad)
    with pytest.raises(ValueError):
        by_us([bad])
    with pytest.raises(ValueError):
        by_us([bad[i:i + 1] for i in range(len(bad))])


def test_a_size_line_without_end_is_refused_past_the_limit() -> None:
    decoder = ChunkedBody()
    with pytest.raises(ValueError, match="too long"):
        for _ in range(20):
            decoder.feed(b"0" * 1024)
