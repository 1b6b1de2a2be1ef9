"""Bare ASGI plumbing for the gateway: reading a bounded request body, sending JSON and error answers.

The gateway is a raw ASGI app on hypercorn's trio worker rather than a Quart app: Quart costs 0.3-0.5 ms of CPU
per request here (DESIGN.md "Known traps") against a 1 ms budget for the whole gateway, and its RESPONSE_TIMEOUT
(60 s) would cut long streams. Raw ASGI has no response timeout: streams run as long as the engine sends.
"""

from __future__ import annotations

import json

import trio

from llmgw.gateway.problems import ApiError, bad_request

JSON_TYPE = b"application/json"
BODY_GRACE_SECONDS = 10.0
BODY_MIN_BYTES_PER_SECOND = 16 * 1024


def header_map(scope) -> dict[bytes, bytes]:
    """Request headers, names lower-case (ASGI already gives them lower-case); the last value wins."""
    return dict(scope["headers"])


class Disconnected(Exception):
    """The client went away while its request body was being read."""


async def read_body(receive, headers: dict[bytes, bytes], limit: int, *, grace_seconds: float = BODY_GRACE_SECONDS,
                    min_bytes_per_second: float = BODY_MIN_BYTES_PER_SECOND) -> bytes:
    """The whole request body, at most `limit` bytes, arriving in time.

    Read deadline and minimum rate: having received `n` bytes, the next part must come before
    `start + grace_seconds + n / min_bytes_per_second` (trio's clock). So a body of `size` bytes takes at most
    `grace_seconds + size / min_bytes_per_second` seconds (defaults: 10 s + 16 KiB/s, 650 s for 10 MiB), and a client
    that trickles a byte now and then is cut within `grace_seconds` of falling behind.
    Raises ApiError 400 (code request_too_large) past the limit, ApiError 408 (code request_timeout) past the
    deadline, Disconnected when the client left. A checkpoint.
    """
    declared = headers.get(b"content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise bad_request(f"The request body is {int(declared)} bytes; this gateway takes at most {limit} bytes.",
                          "request_too_large")
    parts: list[bytes] = []
    size = 0
    started = trio.current_time()
    while True:
        with trio.move_on_at(started + grace_seconds + size / min_bytes_per_second) as scope:
            message = await receive()
        if scope.cancelled_caught:
            raise ApiError(408, f"The request body came too slowly ({size} bytes in "
                                f"{trio.current_time() - started:.0f} s); this gateway waits {grace_seconds:g} s plus "
                                f"one second per {min_bytes_per_second / 1024:g} KiB.", "invalid_request_error",
                           "request_timeout")
        if message["type"] == "http.disconnect":
            raise Disconnected()
        chunk = message.get("body", b"")
        if chunk:
            size += len(chunk)
            if size > limit:
                raise bad_request(f"The request body is over {limit} bytes, the most this gateway takes.",
                                  "request_too_large")
            parts.append(chunk)
        if not message.get("more_body", False):
            break
    return parts[0] if len(parts) == 1 else b"".join(parts)


async def send_bytes(send, status: int, body: bytes, content_type: bytes = JSON_TYPE,
                     headers: list[tuple[bytes, bytes]] | None = None) -> None:
    """A complete response in two ASGI messages."""
    all_headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
    if headers:
        all_headers.extend(headers)
    await send({"type": "http.response.start", "status": status, "headers": all_headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def send_json(send, status: int, payload, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    await send_bytes(send, status, json.dumps(payload).encode(), JSON_TYPE, headers)


async def send_error(send, error: ApiError, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    """The OpenAI-shaped error body with its status and headers."""
    await send_bytes(send, error.status, error.body(), JSON_TYPE, [*error.headers, *(headers or [])])


async def serve_lifespan(receive, send) -> None:
    """Answer an ASGI lifespan scope (startup, shutdown) until shutdown; nothing to set up or tear down."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
