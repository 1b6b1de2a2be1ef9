"""The console's limit on failed logins: after MAX_FAILURES failed logins in a row for one e-mail, or from one
client address, within FAILURE_WINDOW seconds, every login for it is refused for LOCKOUT_SECONDS, even with the
right password (so a guesser learns nothing from the answers while locked out). A login that succeeds clears
its e-mail's and address's counts.

Pure: times are the caller's clock (the console's `clock`, trio's by default, so tests run it on MockClock). Kept
in the control plane's memory (a restart, or another control plane, starts counting again) and bounded to
MAX_KEYS entries, the oldest dropped first.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_FAILURES = 5
FAILURE_WINDOW = 15 * 60.0
LOCKOUT_SECONDS = 15 * 60.0
MAX_KEYS = 10_000


@dataclass(frozen=True)
class _Count:
    failures: int
    first: float
    locked_until: float = 0.0


class LoginThrottle:
    """Failed logins by key ("email:<e-mail>", "address:<client>")."""

    def __init__(self) -> None:
        self._counts: dict[str, _Count] = {}

    def wait(self, keys: tuple[str, ...], now: float) -> float:
        """Seconds until a login for `keys` may be tried again (0.0: now)."""
        waits = [count.locked_until - now for key in keys if (count := self._counts.get(key)) is not None]
        return max([0.0, *waits])

    def failed(self, keys: tuple[str, ...], now: float) -> None:
        """Count a failed login for each of `keys` at `now`; the MAX_FAILURES-th within the window locks it out."""
        for key in keys:
            count = self._counts.pop(key, None)
            if count is None or now - count.first > FAILURE_WINDOW or 0 < count.locked_until <= now:
                count = _Count(0, now)
            failures = count.failures + 1
            locked = now + LOCKOUT_SECONDS if failures >= MAX_FAILURES else 0.0
            self._counts[key] = _Count(failures, count.first, locked)
        while len(self._counts) > MAX_KEYS:
            self._counts.pop(next(iter(self._counts)))

    def succeeded(self, keys: tuple[str, ...]) -> None:
        """Forget the failures of `keys` (a right password outside a lockout)."""
        for key in keys:
            self._counts.pop(key, None)
