"""Polling a real process or server from a test until something holds (real time: for other processes only; timer
logic runs on trio's MockClock instead)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import httpx

T = TypeVar("T")


def wait_for(check: Callable[[], T], timeout: float, what: str, show: Callable[[], str] | None = None) -> T:
    """`check()`'s first truthy value, polled every 0.2 s for `timeout` seconds; a connection refused, a missing key
    or file, or a body that does not parse yet (httpx.TransportError, KeyError, FileNotFoundError, ValueError)
    counts as not yet. Raises AssertionError "timed out after N s waiting for `what`", followed by `show()` (e.g.
    a log) when given."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = check()
        except (httpx.TransportError, KeyError, FileNotFoundError, ValueError):
            value = None
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}" + (f"\n{show()}" if show else ""))
