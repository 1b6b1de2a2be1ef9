"""Leadership: the leader lease held in the store, renewed on time, and given up before it ends when it cannot be.

    keeper = LeaseKeeper(acquire, loop.update, ttl=15.0)    # acquire(): (token, holder) from the store
    await nursery.start(keeper.run)                          # returns after the first attempt

Only the lease holder commands agents and writes audit commits (`llmgw.control.deciding`). The store gives the
holder a fencing token that rises with every new holder (`llmgw.store` leases); the token goes into the
`ControlState`'s `Leadership` and every command carries it, so an agent refuses a deposed leader's late command
(`llmgw.agent.fencing`).

A leader that cannot renew (the store is slow, gone, or another took the lease) stops commanding at the lease's end
minus a margin, measured on the control plane's own clock from the moment it *asked* for the lease (the store's
expiry counts from a later moment, so this end is never later than the store's). The margin covers a command
already on its way and the clock difference between this machine and the one that checks the lease next.

The transitions are pure functions of `ControlState`; `LeaseKeeper` is the I/O: one renewal every `ttl / 3`
seconds, each given at most that long. Given `acquire_sync`, the renewals after the first run in a thread of their
own on its own timer (`llmgw.control.renewing`), and the keeper takes the thread's latest answer before stepping
down, so a trio loop busy for seconds does not let the lease lapse.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace

import trio

from llmgw.control.renewing import AcquireSync, Renewal, RenewalThread
from llmgw.control.state import ControlState, Leadership
from llmgw.errors import StoreError, TemporaryError

log = logging.getLogger("llmgw.control")

HANG_LEASES = 10
"""A loop that takes no renewal answer for this many lease lengths is hung: its renewal thread stops renewing."""

LEASE_NAME = "llmgw-reconciler"
"""The store lease whose holder leads."""

Acquire = Callable[[], Awaitable["tuple[int, str | None]"]]
"""Take or renew the lease: (fencing token, 0 when another holds it; who holds it, None when unknown)."""

Update = Callable[[Callable[[ControlState], "tuple[ControlState, bool]"], str], None]


def default_margin(ttl: float) -> float:
    """The seconds before the lease's end when a leader that could not renew stops commanding: a fifth of it."""
    return ttl / 5


def leading(holder: str, token: int, until: float) -> Callable[[ControlState], tuple[ControlState, bool]]:
    """The transition of a renewal that held the lease: leader with `token` until `until` (control-plane clock).
    Placement-relevant only when leadership changed (not on a plain renewal)."""
    def transition(state: ControlState) -> tuple[ControlState, bool]:
        old = state.leadership
        new = Leadership(True, holder, token, until)
        return replace(state, leadership=new), not (old.leader and old.token == token)
    return transition


def following(holder: str | None) -> Callable[[ControlState], tuple[ControlState, bool]]:
    """The transition of a renewal that found the lease held by `holder` (None: unknown): not leader."""
    def transition(state: ControlState) -> tuple[ControlState, bool]:
        new = Leadership(False, holder)
        return replace(state, leadership=new), state.leadership != new
    return transition


def lease_ended(token: int, now: float) -> Callable[[ControlState], tuple[ControlState, bool]]:
    """The transition at the lease's end (minus the margin) when no renewal came in time: no longer leader,
    unless a renewal of a later term (another token, or a later `until`) arrived meanwhile."""
    def transition(state: ControlState) -> tuple[ControlState, bool]:
        old = state.leadership
        if not old.leader or old.token != token or (old.until is not None and old.until > now):
            return state, False
        return replace(state, leadership=Leadership(False, None)), True
    return transition


class LeaseKeeper:
    """Holds the leader lease through `acquire()` and tells the control loop through `update`.

    `ttl` seconds of lease (the store's), renewed every `ttl / 3`; `margin` seconds (default a fifth of ttl) before
    its end when a leader whose renewals failed steps down. `holder` names this control plane in the reasons.
    `acquire_sync` (the same as `acquire`, blocking and thread-safe): renew from a thread of its own after the first
    attempt (see the module docstring); without it every renewal is a trio task.
    """

    def __init__(self, acquire: Acquire, update: Update, *, ttl: float, holder: str, margin: float | None = None,
                 acquire_sync: AcquireSync | None = None):
        self._acquire = acquire
        self._acquire_sync = acquire_sync
        self._thread: RenewalThread | None = None
        self._taken: Renewal | None = None
        self._update = update
        self.ttl = ttl
        self.margin = default_margin(ttl) if margin is None else margin
        self.holder = holder
        self.token = 0          # the token of the term this keeper leads in, 0 when not leading
        self.until: float | None = None
        self._term = 0          # the token of the last renewal that held the lease (names "became" vs "renewed")
        self._changed = trio.Event()

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Renew until cancelled; `task_status.started()` after the first attempt (won, lost or failed)."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._step_down_on_time)
            await self.renew()
            task_status.started()
            if self._acquire_sync is not None:
                await self._renew_in_thread()  # until cancelled
            while True:
                await trio.sleep(self.ttl / 3)
                await self.renew()

    async def _renew_in_thread(self) -> None:
        token = trio.lowlevel.current_trio_token()
        thread = RenewalThread(self._acquire_sync, lambda: token.run_sync_soon(self._take_latest),
                               interval=self.ttl / 3, hang_limit=HANG_LEASES * self.ttl)
        self._thread = thread
        await trio.sleep(self.ttl / 3)
        thread.start()
        try:
            await trio.sleep_forever()
        finally:
            thread.stop(wait=self.ttl / 3)  # no renewal after this returns (the plane may release the lease next)

    def _take_latest(self) -> None:
        """Apply the renewal thread's latest answer if not yet applied. On the trio thread; not a checkpoint."""
        thread = self._thread
        if thread is None:
            return
        thread.alive()
        latest = thread.latest
        if latest is None or latest is self._taken:
            return
        self._taken = latest
        asked = trio.current_time() - (thread.clock() - latest.asked)  # the thread's clock onto trio's
        self._apply(asked, (latest.token, latest.holder))

    async def renew(self) -> None:
        """One attempt, given at most `ttl / 3` seconds; a failure (StoreError, TemporaryError, timeout) is logged
        and changes nothing: the leadership then ends at `until`. A checkpoint."""
        asked = trio.current_time()
        result = None
        with trio.move_on_after(self.ttl / 3):
            try:
                result = await self._acquire()
            except (StoreError, TemporaryError) as exc:
                log.warning("could not renew the leader lease: %s", exc)
        if result is None:
            if self.until is not None:
                log.warning("the leader lease was not renewed; commands stop in %.1f s",
                            max(0.0, self.until - trio.current_time()))
            return
        self._apply(asked, result)

    def _apply(self, asked: float, result: tuple[int, str | None]) -> None:
        token, holder = result
        if token:
            self.token, self.until = token, asked + self.ttl - self.margin
            reason = "renewed the leader lease" if token == self._term else f"became leader (token {token})"
            self._term = token
            self._update(leading(self.holder, token, self.until), reason)
        else:
            self.token, self.until, self._term = 0, None, 0
            self._update(following(holder), f"{holder or 'another control plane'} leads")
        self._changed.set()
        self._changed = trio.Event()

    async def _step_down_on_time(self) -> None:
        while True:
            changed = self._changed
            if self.until is None:
                await changed.wait()
                continue
            with trio.move_on_at(self.until):
                await changed.wait()
                continue
            self._take_latest()  # a renewal the thread got in time, not yet applied because the loop was busy
            if self.until is None or self.until > trio.current_time():
                continue  # renewed in time, or the thread's answer says another control plane leads
            token, now = self.token, trio.current_time()
            self.token, self.until, self._term = 0, None, 0
            log.warning("the leader lease could not be renewed in time: this control plane stops commanding")
            self._update(lease_ended(token, now), "the leader lease ends unrenewed")
            await changed.wait()
