"""The leader lease renewed from its own thread, on its own timer, so a busy trio loop does not make it lapse.

A trio task that renews the lease waits for the loop twice: its `trio.sleep(ttl / 3)` wakes only when the loop
next looks at its timers, and the store's answer comes back through the loop. While a big join keeps the loop in
task steps of seconds (docs/scale.md, issue 18) both waits grew past the lease's 6 s, so the lease lapsed and the
control plane stopped commanding although nothing was wrong with the store. `RenewalThread` takes the lease every
`interval` seconds of `time.monotonic()` from a thread of its own (the store is thread-safe: `llmgw.store.sqlite`,
`llmgw.store.postgres`), and keeps the latest answer in `latest`; `LeaseKeeper` reads it, through a callback
posted to the loop after each attempt and again at the moment it would step down.

Safety is unchanged: a renewal counts from the moment it was *asked* (`Renewal.asked`, this thread's clock), so the
leadership's end stays no later than the store's. A loop that stops taking the thread's answers altogether (hung,
not merely busy: none for `hang_limit` seconds) is not kept leading: the thread stops renewing, the lease lapses,
and a standby takes over.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from llmgw.errors import StoreError, TemporaryError

log = logging.getLogger("llmgw.control")

AcquireSync = Callable[[], "tuple[int, str | None]"]
"""Take or renew the lease, blocking: (fencing token, 0 when another holds it; who holds it, None when unknown)."""


@dataclass(frozen=True)
class Renewal:
    """One answered attempt: `asked` (the thread's clock, seconds, when the attempt began), the token (0: another
    holds the lease) and the holder named by the store (None when unknown)."""

    asked: float
    token: int
    holder: str | None


class RenewalThread:
    """Calls `acquire()` every `interval` seconds in a daemon thread; `posted()` after each answered attempt.

    `posted` must not block (LeaseKeeper passes trio's `run_sync_soon`). `alive()` is called by the loop whenever it
    takes an answer; once `hang_limit` seconds pass without that, the thread stops asking until it happens again.
    `clock` is `time.monotonic` (seconds) unless a test gives another.
    """

    def __init__(self, acquire: AcquireSync, posted: Callable[[], None], *, interval: float, hang_limit: float,
                 clock: Callable[[], float] = time.monotonic):
        self._acquire = acquire
        self._posted = posted
        self.interval = interval
        self.hang_limit = hang_limit
        self.clock = clock
        self.latest: Renewal | None = None
        self._seen = clock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="llmgw-lease", daemon=True)

    def start(self) -> None:
        """Start the thread (first attempt at once)."""
        self._thread.start()

    def stop(self, wait: float) -> None:
        """Ask no more; wait at most `wait` seconds for an attempt in flight to end. Blocking."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(wait)

    def alive(self) -> None:
        """The loop took an answer: it is not hung."""
        self._seen = self.clock()

    def _run(self) -> None:
        while not self._stop.is_set():
            began = self.clock()
            if began - self._seen > self.hang_limit:
                log.warning("the control loop took no lease answer for %.0f s: the lease is no longer renewed",
                            began - self._seen)
            else:
                self._attempt(began)
            self._stop.wait(max(0.0, began + self.interval - self.clock()))

    def _attempt(self, asked: float) -> None:
        try:
            token, holder = self._acquire()
        except (StoreError, TemporaryError) as exc:
            log.warning("could not renew the leader lease: %s", exc)
            return
        except Exception:  # a bug: keep the thread; unrenewed, the keeper steps down on time
            log.exception("renewing the leader lease failed")
            return
        if self._stop.is_set():
            return
        self.latest = Renewal(asked, token, holder)
        try:
            self._posted()
        except RuntimeError:  # the loop has ended
            self._stop.set()
