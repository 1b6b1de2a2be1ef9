"""`StoreBoundary`: the store as an event loop sees it. Calls run in worker threads; settlements go through a spool.

Every store method blocks (SQLite waits up to its busy timeout for a lock another process holds; PostgreSQL
waits on the network). Here each call runs in a worker thread (`trio.to_thread.run_sync`, at most `threads`
at once through one CapacityLimiter), so the event loop keeps answering `/health`, streams and every request
that needs no store write while the store is slow or locked.

A request's usage and the closing of its reservation (a `Settlement`) never wait on the store to be kept:
`settle` appends it to the `UsageSpool` first (one write(2), on the event loop: a local file, microseconds),
then asks the store to write it in a worker thread and waits at most `settle_wait` seconds for the commit.
Settlements, and reservations (`reserve`), are written in group commits (`grouping.Groups`): while one group is
written (one transaction, `Store.apply_settlements`, `Store.reserve_many`), the calls that arrive queue, and go
together as the next group; alone, one is written at once. Under concurrency this saves worker-thread hops and
(PostgreSQL) round trips per request (docs/store.md). A store that can write without waiting (`call_nowait`:
SQLite, when no other thread or process holds its write lock) has each group written on the event loop's own
thread instead, with the calls made in the same scheduler pass (`Groups`' `write_nowait`): no worker-thread hop
(two per request, most of a request's futex and epoll system calls); when it would wait, the group goes to a
worker thread as above. If the
store has not committed by then (locked, down, or failing), the spool is fsync'd and `settle` returns False: the
caller answers its client anyway. `run` (a background task) writes what the spool still holds: at start (what a
crashed process left) and every `retry_interval` seconds (doubling up to MAX_RETRY_INTERVAL while the store
keeps failing). The store writes each entry id at most once (`Store.apply_settlement`), so usage lands exactly
once. The concurrency slots a settlement frees are freed when the store takes it.

Errors: `call` raises what the store raises (TemporaryError, StoreError, UsageError). `settle` raises nothing
of the store's: a store failure leaves the entry in the spool; a spool that cannot be written (disk full)
falls back to waiting for the store, and when both fail the record is logged whole (logger "llmgw.store") so
that an operator can re-enter it, and lost.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import trio

from llmgw.errors import StoreError, TemporaryError
from llmgw.identity import Quota
from llmgw.store.grouping import Abandoned, Groups
from llmgw.store.records import Rejection, Reservation, Settlement
from llmgw.store.spool import UsageSpool, encode_settlement

DEFAULT_THREADS = 8
DEFAULT_SETTLE_WAIT = 0.5
DEFAULT_RETRY_INTERVAL = 1.0
GROUP_LIMIT = 64  # settlements or reservations per group commit (one transaction)
MAX_RETRY_INTERVAL = 10.0

log = logging.getLogger("llmgw.store")
T = TypeVar("T")


class StoreBoundary:
    """`store` behind worker threads, with `spool` for settlements (see the module docstring).

    `threads`: store calls running at once (more wait, in trio, without blocking the loop). `settle_wait`
    (seconds): how long `settle` waits for the store's commit before leaving the entry to `run`.
    `retry_interval` (seconds): how often `run` looks for entries left in the spool.
    """

    def __init__(self, store, spool: UsageSpool, *, threads: int = DEFAULT_THREADS,
                 settle_wait: float = DEFAULT_SETTLE_WAIT, retry_interval: float = DEFAULT_RETRY_INTERVAL):
        self.store = store
        self.spool = spool
        self.settle_wait = settle_wait
        self.retry_interval = retry_interval
        self.limiter = trio.CapacityLimiter(threads)
        self.last_error: str | None = None
        self.spooled = 0  # settlements left to `run` since start
        nowait = getattr(store, "call_nowait", None) is not None
        self._settles: Groups[str, bool] = Groups(
            self._write_settlements, limit=GROUP_LIMIT, abandon=True,
            write_nowait=self._write_settlements_nowait if nowait else None)
        self._reservations: Groups = Groups(
            self._write_reservations, limit=GROUP_LIMIT, abandon=False,
            write_nowait=self._write_reservations_nowait if nowait else None)

    async def call(self, function: Callable[..., T], *args: Any) -> T:
        """`function(*args)` (a method of the store) in a worker thread; a checkpoint.

        A cancelled caller still waits for the call to end (bounded by the store's own timeouts), so what the
        store did (a reservation taken) is never lost to the caller.
        """
        return await trio.to_thread.run_sync(function, *args, limiter=self.limiter)

    async def settle(self, settlement: Settlement) -> bool:
        """Keep `settlement` (spool) and have the store write it; True when the store committed it before return.

        Waits at most `settle_wait` seconds for the store, then fsyncs the spool (a worker thread, milliseconds)
        and returns False; `run` writes the entry when the store answers. Never raises for a store failure.
        """
        try:
            self.spool.append(settlement)
        except StoreError as exc:
            return await self._settle_without_spool(settlement, exc)
        with trio.move_on_after(self.settle_wait):
            try:
                if await self._settles.submit(settlement.entry_id):
                    return True
            except Abandoned:
                pass  # its group's writer was cancelled; the spool has the entry
        self.spooled += 1
        try:
            await trio.to_thread.run_sync(self.spool.sync)
        except OSError as exc:
            log.warning("Cannot fsync the usage spool %s (%s); its last entries survive a crash of llmgw but "
                        "not of the machine.", self.spool.path, exc)
        return False

    async def _settle_without_spool(self, settlement: Settlement, spool_error: StoreError) -> bool:
        with trio.move_on_after(self.settle_wait):
            try:
                await trio.to_thread.run_sync(self.store.apply_settlement, settlement, limiter=self.limiter,
                                              abandon_on_cancel=True)
                return True
            except (TemporaryError, StoreError) as exc:
                self.last_error = str(exc)
        log.error("%s The store did not take it either (%s); this usage is lost unless re-entered: %s",
                  spool_error, self.last_error, encode_settlement(settlement).decode().strip())
        return False

    def _write_settlements_nowait(self, entry_ids: list[str]) -> list[bool]:
        taken = self.store.call_nowait(self._apply, entry_ids)
        return [entry_id in taken for entry_id in entry_ids]

    async def _write_settlements(self, entry_ids: list[str]) -> list[bool]:
        taken = await trio.to_thread.run_sync(self._apply, entry_ids, limiter=self.limiter, abandon_on_cancel=True)
        return [entry_id in taken for entry_id in entry_ids]

    async def reserve(self, scopes: Sequence[tuple[str, Quota]], estimated_tokens: int, estimated_cost: float,
                      now: float) -> Reservation | Rejection:
        """`Store.reserve` in a group commit (`Store.reserve_many`, one transaction) with the reservations of the same
        scopes in the same minute that queue while another group is written; alone, at once. A checkpoint.

        Grouped so only by scopes and minute: the reservations of one group then write the same quota windows, in
        one order, which keeps two transactions from deadlocking on PostgreSQL. A cancelled caller whose
        reservation is being written still gets it (and must release it), as with `call`.
        Raises what `Store.reserve` raises (UsageError for this request; TemporaryError, StoreError for the group).
        """
        outcome = await self._reservations.submit((scopes, estimated_tokens, estimated_cost, now),
                                                  (tuple(scopes), now // 60))
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    async def _write_reservations(self, requests: list) -> list:
        return await trio.to_thread.run_sync(self.store.reserve_many, requests, limiter=self.limiter)

    def _write_reservations_nowait(self, requests: list) -> list:
        return self.store.call_nowait(self.store.reserve_many, requests)

    def _apply(self, entry_ids: list[str]) -> set[str]:
        """(Worker thread.) Write the spooled entries `entry_ids` to the store in order, in groups of at most
        GROUP_LIMIT (one transaction each), until a group fails; returns the ids the store took. Entries done or
        being written by another thread are skipped (not returned)."""
        taken: set[str] = set()
        for at in range(0, len(entry_ids), GROUP_LIMIT):
            claimed = [(entry_id, settlement) for entry_id in entry_ids[at:at + GROUP_LIMIT]
                       if (settlement := self.spool.claim(entry_id)) is not None]
            done = False
            try:
                if claimed:
                    self.store.apply_settlements([settlement for _entry_id, settlement in claimed])
                done = True
            except (TemporaryError, StoreError) as exc:
                self.last_error = str(exc)
            finally:
                for entry_id, _settlement in claimed:
                    self.spool.finish(entry_id, done)
            if not done:
                break
            taken.update(entry_id for entry_id, _settlement in claimed)
        return taken

    async def drain(self) -> bool:
        """Write every entry the spool holds (oldest first, in one worker thread); True when none is left."""
        pending = [s.entry_id for s in self.spool.pending()]
        if pending:
            await trio.to_thread.run_sync(self._apply, pending, limiter=self.limiter)
        return self.spool.statistics()["pending"] == 0

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Write what the spool holds now (left by a crash), then every `retry_interval` what it holds since,
        until cancelled. `task_status.started()` at once (the first round runs in the background)."""
        task_status.started()
        delay = self.retry_interval
        while True:
            if await self.drain():
                delay = self.retry_interval
            else:
                delay = min(MAX_RETRY_INTERVAL, delay * 2)
            await trio.sleep(delay)

    def statistics(self) -> dict[str, Any]:
        """The spool's counters (`UsageSpool.statistics`), "spooled" (settlements left to `run` since start),
        "groups" and "reservation_groups" (group commits of settlements and of reservations since start),
        "threads_busy" (store calls running) and "last_error" (the store's last failure, or None)."""
        return {**self.spool.statistics(), "spooled": self.spooled, "groups": self._settles.groups,
                "reservation_groups": self._reservations.groups,
                "threads_busy": self.limiter.borrowed_tokens, "last_error": self.last_error}

    def close(self) -> None:
        """Close the spool (what it holds stays on disk for the next start)."""
        self.spool.close()
