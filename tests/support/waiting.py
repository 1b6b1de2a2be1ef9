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


async def wait_in_real_time(check: Callable[[], T], timeout: float, what: str) -> T:
    """`check()`'s first truthy value, polled every 10 ms of real time for `timeout` real seconds, from a trio test
    that runs on an autojump MockClock while the work it waits for runs in a thread (`trio.to_thread`): a trio
    sleep here would let the clock jump past that thread's work (a 600-virtual-second deadline passed before one
    SQLite read ended, on a loaded CI machine), a real-time wait in a thread does not. Raises AssertionError."""
    import trio  # here: the sync waits above serve tests without trio

    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s (real time) waiting for {what}")
        await trio.to_thread.run_sync(time.sleep, 0.01)
    return value
