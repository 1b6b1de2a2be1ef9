"""Decoding an engine's chunked response body (HTTP/1.1 `Transfer-Encoding: chunked`) without h11's state machine.

A streamed answer is one chunk per token. h11 decodes each with an event object, a regex match, its reader state
and the connection's state machine (`next_event` twice per read: the Data, then NEED_DATA): about a fifth of the
gateway's instructions per relayed chunk (bench/relay_instructions.py). `ChunkedBody` is the same framing as a plain
function of the bytes: one `find` and one slice for the usual read (exactly one chunk), nothing copied but the
chunk's data. The upstream client parses the response head with h11 and hands the body to this decoder (h11's
`trailing_data` gives it the body bytes h11 had already read).

Format (RFC 9112 section 7.1): `chunk-size [; extensions] CRLF data CRLF`, repeated; a last chunk of size 0, then
trailer fields, then an empty line. As strict as h11 0.16: 1-20 hex digits in the size, then extensions or spaces and
tabs, CRLF line ends, a chunk's data followed by exactly CRLF; a size line longer than
`MAX_LINE` bytes is refused. Trailers are read and dropped (h11 hands them on; the gateway never used them).
"""

from __future__ import annotations

HEX_DIGITS = b"0123456789abcdefABCDEF"
MAX_LINE = 16 * 1024  # longest size line or trailer line accepted (h11's max_incomplete_event_size is 16 KiB)


class ChunkedBody:
    """Feed the body's bytes as they arrive; `feed` returns the data they complete. `done` once the last chunk and
    the trailers have arrived; `extra` is whatever came after them (b"" from a well-behaved engine)."""

    def __init__(self) -> None:
        self.done = False
        self.extra = b""
        self._pending = b""  # an incomplete size line, CRLF or trailer line
        self._left = 0  # bytes of the current chunk's data still to come
        self._crlf = False  # the CRLF after a chunk's data is due
        self._trailers = False  # the last chunk was read: trailer lines until an empty one

    def feed(self, data: bytes) -> bytes:
        """The chunk data completed by `data` (possibly b""). Raises ValueError naming what is malformed."""
        if self.done:
            self.extra += data
            return b""
        if self._pending:
            data = self._pending + data
            self._pending = b""
        if not self._left and not self._crlf and not self._trailers:  # the usual read: exactly one whole chunk
            eol = data.find(b"\r\n")
            if 0 < eol <= 20 and not data[:eol].strip(HEX_DIGITS):  # a bare size (else the loop below checks)
                size = int(data[:eol], 16)
                if size and len(data) == eol + size + 4 and data.endswith(b"\r\n"):
                    return data[eol + 2:-2]
        out: list[bytes] = []
        pos, end = 0, len(data)
        while pos < end:
            if self._left:
                stop = pos + self._left
                out.append(data[pos:stop])
                if stop > end:
                    self._left = stop - end
                    pos = end
                    break
                self._left = 0
                self._crlf = True
                pos = stop
            eol = data.find(b"\r\n", pos)
            if eol < 0:
                if end - pos > MAX_LINE:
                    raise ValueError("a chunk size or trailer line is too long")
                break
            line = data[pos:eol]
            pos = eol + 2
            if self._crlf:
                if line:
                    raise ValueError("a chunk's data is not followed by CRLF")
                self._crlf = False
            elif self._trailers:
                if not line:
                    self.done = True
                    self.extra = data[pos:]
                    return b"".join(out)
            else:
                size = _size(line)
                if size:
                    self._left = size
                else:
                    self._trailers = True
        self._pending = data[pos:]
        return b"".join(out)


def _size(line: bytes) -> int:
    # h11 0.16's chunk header: ([0-9A-Fa-f]){1,20}(;.*)?[ \t]*\r\n
    digits = line.split(b";", 1)[0] if line.find(b";") >= 0 else line.rstrip(b" \t")  # find: see streaming
    if not digits or digits.strip(HEX_DIGITS) or len(digits) > 20:
        raise ValueError(f"bad chunk size line {line[:40]!r}")
    return int(digits, 16)
