"""What the engine relay decides about one HTTP/1.1 request head, before a byte of it reaches the engine (pure).

The relay (`llmgw.engines.relay`) forwards a request's bytes unchanged, so it must frame requests exactly as the engine
does, and refuse what two parsers could read two ways (request smuggling: RFC 9112 section 6.3 and 11.2). A head
is refused unless it is strict HTTP/1.x: CRLF line ends only (no bare CR or LF), no obsolete line folding, header
names that are tokens with no space before the colon, at most one Content-Length value (repeated equal values are
one), Transfer-Encoding only as exactly "chunked" and never with Content-Length, no `Upgrade` and no CONNECT (a
connection the relay could no longer frame). The replica key must come as exactly one `Authorization: Bearer
KEY` header (the scheme in any case, as the gateway sends it: `llmgw.gateway.proxying`), compared in constant
time; every path and method needs it, `/health` included. An `llmgw-once: KEY` header (at most one, a token of at most
`MAX_ONCE_KEY_BYTES`, with a Content-Length body) asks the relay to run the request on the engine at most once
(`llmgw.engines.relay`, "once").

Sources: RFC 9110 (fields, the Bearer scheme of RFC 6750 section 2.1), RFC 9112 (message framing, chunked coding).
"""

from __future__ import annotations

import hmac
import re
from dataclasses import dataclass

MAX_HEAD_BYTES = 65536
"""A request head (request line and fields) longer than this is refused with 431."""
MAX_ONCE_KEY_BYTES = 128
"""The longest `llmgw-once` key (a gateway request id is 36 bytes)."""
MAX_CHUNK_LINE_BYTES = 4096
"""A chunk-size line (with its extensions) longer than this is refused (the body is then cut: the connection ends)."""

_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_REQUEST_LINE = re.compile(rb"([!#$%&'*+\-.^_`|~0-9A-Za-z]+) (\S+) HTTP/1\.([01])")
_FIELD_VALUE = re.compile(rb"[\t\x20-\x7e\x80-\xff]*")
_CHUNK_SIZE = re.compile(rb"([0-9A-Fa-f]{1,15})[ \t]*(?:;[^\r\n]*)?")


class Refusal(Exception):
    """A request the relay answers itself and then closes the connection: `status` (401, 400, 431, 501) and a
    sentence for the client."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class RequestHead:
    """A request head the relay forwards: `method`, `target` (bytes as sent), and its body: `content_length` bytes
    (0: none), or a chunked body when `chunked`. `once`: the request's `llmgw-once` key (b"": none)."""

    method: bytes
    target: bytes
    content_length: int = 0
    chunked: bool = False
    once: bytes = b""


def head_end(buffer: bytes | bytearray, start: int = 0) -> int:
    """The index just past the blank line ending a head in `buffer` (searched from `start`), or -1 when the head is
    not complete yet."""
    at = buffer.find(b"\r\n\r\n", max(0, start - 3))
    return -1 if at < 0 else at + 4


def parse_head(head: bytes, key: bytes) -> RequestHead:
    """Check one request head (request line to the blank line, CRLF included) against the framing rules and the
    replica key `key` (see the module). Returns the head's framing. Raises Refusal: 401 without the right key
    (also when `key` is empty: a relay without a key forwards nothing), 400 for a malformed or ambiguous head, 501
    for a transfer coding other than chunked, Upgrade or CONNECT. Pure."""
    if len(head) > MAX_HEAD_BYTES:
        raise Refusal(431, "the request head is too large")
    if not head.endswith(b"\r\n\r\n"):
        raise Refusal(400, "the request head does not end with a blank line")
    text = head[:-4]
    line_ends = text.count(b"\r\n")
    if text.count(b"\r") != line_ends or text.count(b"\n") != line_ends:
        raise Refusal(400, "a bare CR or LF in the request head")
    lines = text.split(b"\r\n")
    match = _REQUEST_LINE.fullmatch(lines[0])
    if match is None:
        raise Refusal(400, "the request line is not `METHOD TARGET HTTP/1.x`")
    method, target = match.group(1), match.group(2)
    if method == b"CONNECT":
        raise Refusal(501, "CONNECT is not relayed")
    authorizations: list[bytes] = []
    lengths: set[bytes] = set()
    codings: list[bytes] = []
    onces: list[bytes] = []
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or _TOKEN.fullmatch(name) is None:
            raise Refusal(400, "a header line is not `name: value` (or is folded)")
        value = value.strip(b" \t")
        if _FIELD_VALUE.fullmatch(value) is None:
            raise Refusal(400, "a header value holds control characters")
        lower = name.lower()
        if lower == b"authorization":
            authorizations.append(value)
        elif lower == b"content-length":
            lengths.update(part.strip(b" \t") for part in value.split(b","))
        elif lower == b"transfer-encoding":
            codings.extend(part.strip(b" \t").lower() for part in value.split(b",") if part.strip(b" \t"))
        elif lower == b"upgrade":
            raise Refusal(501, "Upgrade is not relayed")
        elif lower == b"llmgw-once":
            onces.append(value)
    if not _authorized(authorizations, key):
        raise Refusal(401, "this engine answers only with its replica key (Authorization: Bearer KEY)")
    once = _once_key(onces, bool(codings))
    if codings:
        if codings != [b"chunked"]:
            raise Refusal(501, "a transfer coding other than chunked")
        if lengths:
            raise Refusal(400, "both Transfer-Encoding and Content-Length")
        return RequestHead(method, target, chunked=True)
    if len(lengths) > 1 or any(not part.isdigit() or len(part) > 15 for part in lengths):
        raise Refusal(400, "the Content-Length is not one decimal number")
    return RequestHead(method, target, content_length=int(lengths.pop()) if lengths else 0, once=once)


def _once_key(values: list[bytes], chunked: bool) -> bytes:
    """The one `llmgw-once` key of a head (b"" without one). Raises Refusal (400) for several, an empty or long
    one, one that is not a token, or one on a chunked request."""
    if not values:
        return b""
    if len(values) > 1 or not values[0] or len(values[0]) > MAX_ONCE_KEY_BYTES or _TOKEN.fullmatch(values[0]) is None:
        raise Refusal(400, f"llmgw-once must be one token of at most {MAX_ONCE_KEY_BYTES} bytes")
    if chunked:
        raise Refusal(400, "a request with llmgw-once needs a Content-Length body, not a chunked one")
    return values[0]


def _authorized(values: list[bytes], key: bytes) -> bool:
    """True when `values` is one `Bearer <key>` (scheme in any case) and `key` is not empty; constant time in the
    key's bytes."""
    if len(values) != 1 or not key:
        return False
    scheme, _, token = values[0].partition(b" ")
    return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(b" "), key)


def chunk_size(line: bytes) -> int:
    """The size in bytes of the chunk a chunk-size line announces (without its CRLF; extensions after ";" are
    allowed and ignored). Raises Refusal (400) for anything else. Pure."""
    match = _CHUNK_SIZE.fullmatch(line)
    if match is None:
        raise Refusal(400, "a chunk-size line is not a hexadecimal size")
    return int(match.group(1), 16)


def refusal_response(refusal: Refusal) -> bytes:
    """The whole HTTP/1.1 response the relay sends for `refusal`: an OpenAI-style JSON error, `Connection: close`
    (the relay closes the connection after it). Pure."""
    reasons = {400: b"Bad Request", 401: b"Unauthorized", 413: b"Content Too Large",
               431: b"Request Header Fields Too Large",
               501: b"Not Implemented", 502: b"Bad Gateway"}
    text = refusal.message.replace("\\", "\\\\").replace('"', '\\"').encode()
    kind = b"authentication_error" if refusal.status == 401 else b"invalid_request_error"
    body = b'{"error":{"message":"' + text + b'","type":"' + kind + b'","code":' + str(refusal.status).encode() + b"}}"
    head = [b"HTTP/1.1 %d %s" % (refusal.status, reasons.get(refusal.status, b"Error")),
            b"Content-Type: application/json", b"Content-Length: %d" % len(body), b"Connection: close"]
    if refusal.status == 401:
        head.append(b'WWW-Authenticate: Bearer realm="llmgw engine"')
    return b"\r\n".join(head) + b"\r\n\r\n" + body
