"""The concurrency slot taken before a big request body is read, pure.

A request body of up to 10 MiB is buffered before it is parsed, so a key holder opening many connections that send
big bodies slowly would hold memory past its project's `concurrent_requests` quota if the slot were taken only after
the body (issue 19, item 4). So when the body may be bigger than EARLY_SLOT_BYTES (a Content-Length above it, or no
usable Content-Length: a chunked or HTTP/2 body of unknown size), the gateway first reserves the concurrency slots
alone (`slot_quotas`: each scope's `concurrent_requests`, no other limit, zero tokens and cost; a 429 before a byte
of the body is read), reads the body holding them, frees them, and then reserves as for any request. A request
holds one slot per scope at any time, never two. Bodies known to be small keep the single reservation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from llmgw.identity import Quota

EARLY_SLOT_BYTES = 1 << 20  # bodies above 1 MiB take their slot before they are read

Quotas = Sequence[tuple[str, Quota]]


def body_may_be_big(headers: Mapping[bytes, bytes], threshold: int = EARLY_SLOT_BYTES) -> bool:
    """True unless the request declares a Content-Length of at most `threshold` bytes (absent or unreadable: True)."""
    declared = headers.get(b"content-length")
    return declared is None or not declared.isdigit() or int(declared) > threshold


def slot_quotas(quotas: Quotas) -> tuple[tuple[str, Quota], ...]:
    """The scopes of `quotas` that limit concurrent requests, with that limit only; () when none does."""
    return tuple((scope, Quota(concurrent_requests=limits.concurrent_requests))
                 for scope, limits in quotas if limits.concurrent_requests is not None)
