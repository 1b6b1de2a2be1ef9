"""The ids of one gateway request: the gateway's own, unique one; the client's `x-request-id`, when it sent one the
gateway accepts; and the W3C trace id the request belongs to. Pure: header values in, ids out.

Why two request ids: the gateway's own id ("req_" + 32 hex digits, `new_request_id`) keys the usage record and is
sent to the engine, so both stay unique whatever clients send (a client may reuse an id, and vLLM takes the
`x-request-id` it is sent as its own request id). The client's id is kept beside it in the usage record, and
`llmgw usage --request` finds a request by either.

Headers answered (`RequestIds.headers`): `x-request-id` repeats the client's id when the gateway accepted it, else
gives the gateway's; `x-llmgw-request-id` gives the gateway's own id when the two differ.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_CLIENT_ID_LENGTH = 128  # characters; a longer x-request-id is not kept (the gateway answers its own)
_CLIENT_ID = re.compile(rb"[\x21-\x7e]{1,%d}" % MAX_CLIENT_ID_LENGTH)  # visible ASCII: safe in logs, tables, SQL
# W3C Trace Context `traceparent`: version-traceid-parentid-flags (https://www.w3.org/TR/trace-context/#traceparent-header)
_TRACEPARENT = re.compile(rb"[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}")
_NO_TRACE = "0" * 32  # the all-zero trace id is invalid


def client_request_id(value: bytes | None) -> str | None:
    """The client's `x-request-id` header value as the gateway keeps it: 1 to MAX_CLIENT_ID_LENGTH visible ASCII
    characters (no spaces or control characters), else None (the header is then ignored, not refused)."""
    if value is None or _CLIENT_ID.fullmatch(value) is None:
        return None
    return value.decode("ascii")


def trace_id_of(traceparent: bytes | None) -> str | None:
    """The 32 hex digits of the trace id a W3C `traceparent` header value names; None when absent, malformed, or
    the invalid all-zero id."""
    if traceparent is None:
        return None
    match = _TRACEPARENT.fullmatch(traceparent.strip())
    if match is None or match.group(1) == _NO_TRACE.encode():
        return None
    return match.group(1).decode("ascii")


@dataclass(frozen=True, slots=True)
class RequestIds:
    """`own`: the gateway's unique id ("req_" + 32 hex); `client`: the client's accepted `x-request-id` (None: it
    sent none, or one not accepted); `trace`: the request's trace id, 32 hex digits (None: not traced and no
    `traceparent` header)."""

    own: str
    client: str | None = None
    trace: str | None = None

    def headers(self) -> list[tuple[bytes, bytes]]:
        """The response headers naming the request (see the module docstring)."""
        if self.client is None:
            return [(b"x-request-id", self.own.encode())]
        return [(b"x-request-id", self.client.encode()), (b"x-llmgw-request-id", self.own.encode())]
