"""HTTP/1.1 response framing for the upstream client (RFC 9112): the response head, how the body is delimited,
and chunked decoding across arbitrary reads. Pure functions over bytes; errors are FramingError (the caller turns
them into an UpstreamFailure 502)."""

from __future__ import annotations

_HEX = b"0123456789abcdefABCDEF"
MAX_LINE_BYTES = 16384


class FramingError(ValueError):
    """The engine's response is not valid HTTP/1.1 framing; the message says what was wrong."""


class ChunkedBody:
    """Where a chunked body's framing (RFC 9112 section 7.1: `size[;ext]CRLF data CRLF` ... `0CRLF [trailers] CRLF`)
    stands between reads."""

    __slots__ = ("remaining", "crlf", "trailers", "done")

    def __init__(self):
        self.remaining = 0  # data bytes of the current chunk still to come
        self.crlf = False  # the CRLF closing a chunk's data is still to come
        self.trailers = False  # past the last chunk: trailer lines until an empty one
        self.done = False

    def parse(self, buffer: bytes) -> tuple[list[bytes], bytes]:
        """Consume what `buffer` completes; returns (data parts, unconsumed bytes). Raises FramingError."""
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
                    raise FramingError("a chunk without its closing CRLF")
                buffer = buffer[2:]
                self.crlf = False
            at = buffer.find(b"\r\n")
            if at < 0:
                if len(buffer) > MAX_LINE_BYTES:
                    raise FramingError("a chunk-size or trailer line over 16 KiB")
                break
            line = buffer[:at]
            buffer = buffer[at + 2:]
            if self.trailers:
                self.done = not line
                continue
            digits = line.split(b";", 1)[0].strip()
            if not digits or digits.strip(_HEX) or len(digits) > 16:
                raise FramingError(f"bad chunk size {line[:40]!r}")
            size = int(digits, 16)
            if size == 0:
                self.trailers = True
            self.remaining = size
        return parts, buffer


def parse_head(head: bytes) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
    """(status, HTTP version such as b"1.1", [(lower-case name, value)]) of a response head without its blank
    line (RFC 9112 sections 4 and 5). Raises FramingError when it is not HTTP/1.x."""
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or len(parts[1]) != 3 or not parts[1].isdigit():
        raise FramingError(f"status line {lines[0][:80]!r}")
    headers = []
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or not name or name.strip(b" \t") != name:
            raise FramingError(f"header line {line[:80]!r}")
        headers.append((name.lower(), value.strip(b" \t")))
    return int(parts[1]), parts[0][5:], headers


def body_framing(method: str, status: int, version: bytes, headers: list[tuple[bytes, bytes]],
             leftover: bytes) -> tuple[tuple, bool]:
    """How the body is delimited (RFC 9112 section 6.3) and whether the connection stays open after it.

    Returns (("length", n, leftover) | ("chunked", leftover) | ("close", leftover), keep_alive). Raises
    FramingError for contradictory or invalid lengths."""
    keep_alive = version == b"1.1"
    encoding = length = None
    for name, value in headers:
        if name == b"transfer-encoding":
            encoding = value.lower() if encoding is None else encoding + b"," + value.lower()
        elif name == b"content-length":
            if not value.isdigit() or (length is not None and int(value) != length):
                raise FramingError(f"bad content-length {value[:40]!r}")
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
