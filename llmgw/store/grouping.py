"""`Groups`: store calls that arrive while one group is being written wait, and go together as the next group.

A group commit: each group is one call of `write(items)` (one worker thread, one store transaction; or, when the
store can write without waiting, `write_nowait` on the event loop's thread: no thread at all), so under
concurrency a request costs a fraction of a thread hop and of a database round trip; a call that finds no group
being written is written at once, as a group of one, so a lone request waits for nothing. One group is written at
a time per key: items are grouped by `key` (at most `limit` per group), and groups of different keys are written at
the same time, so that one key's slow group (a quota scope locked by another gateway) holds up no other key.

Cancellation: with `abandon` True (settlements, which the spool keeps), a cancelled caller stops waiting at once;
when the cancelled caller was the group's writer, the worker thread is abandoned and still writes the group, whose
other callers then get `Abandoned`. With `abandon` False (reservations: what the store did must reach its caller,
who releases it), a caller whose item is in a group being written waits for that group's outcome however it is
cancelled (bounded by the store's own timeouts), as `StoreBoundary.call` does; only a caller still queued leaves
at once.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import Generic, TypeVar

import trio

from llmgw.errors import LlmgwError

Item = TypeVar("Item")
Outcome = TypeVar("Outcome")


class Abandoned(Exception):
    """The group holding this item was abandoned by its cancelled writer: its outcome is not known here."""


class _Entry(Generic[Item]):
    __slots__ = ("item", "key", "outcome", "error", "done")

    def __init__(self, item: Item, key: Hashable) -> None:
        self.item = item
        self.key = key
        self.outcome = None
        self.error: BaseException | None = None
        self.done = False


class Groups(Generic[Item, Outcome]):
    """Group commits of `write` (see the module docstring).

    `write(items)` (async, e.g. a worker thread) returns one outcome per item, in order, or raises: an LlmgwError
    then reaches every caller of that group; any other exception (a bug) reaches the group's writer, and its other
    callers get Abandoned. `limit`: items per group at most.

    `write_nowait(items)` (optional, synchronous): the same write done at once on the event loop's thread, or
    trio.WouldBlock (nothing written) when it would wait; `write` then writes the group. With it, a group's writer
    first passes the scheduler once (shielded from cancellation), so that the calls made by the other tasks that
    run in that pass (those woken by the same events, say) join its group: one transaction for what arrived
    together, as the worker thread's time did. (trio's count of runnable tasks cannot tell whether any will: the
    tasks of the batch being run are not in it.)
    """

    def __init__(self, write: Callable[[list[Item]], Awaitable[Sequence[Outcome]]], *, limit: int,
                 abandon: bool, write_nowait: Callable[[list[Item]], Sequence[Outcome]] | None = None) -> None:
        self._write = write
        self._write_nowait = write_nowait
        self.limit = limit
        self.abandon = abandon
        self.groups = 0  # groups written since start
        self._queued: list[_Entry] = []
        self._writing: dict[Hashable, trio.Event] = {}  # key -> set when its group being written ends

    async def submit(self, item: Item, key: Hashable = None) -> Outcome:
        """Have `item` written in a group of items with the same `key`; its outcome. A checkpoint.

        Raises what `write` raised for its group, and Abandoned (see the module docstring).
        """
        entry = _Entry(item, key)
        self._queued.append(entry)
        try:
            while not entry.done:
                writing = self._writing.get(key)
                if writing is not None:
                    await writing.wait()
                elif entry in self._queued:
                    await self._write_group(key)
                else:
                    raise Abandoned()
        except trio.Cancelled:
            if entry in self._queued:
                self._queued.remove(entry)
            elif not self.abandon:
                with trio.CancelScope(shield=True):  # its group is being written: its outcome must reach the caller
                    while not entry.done and (writing := self._writing.get(key)) is not None:
                        await writing.wait()
                if entry.done and entry.error is None:
                    return entry.outcome  # the caller meets its cancellation at its next checkpoint
            raise
        if entry.error is not None:
            raise entry.error
        return entry.outcome

    async def _write_group(self, key: Hashable) -> None:
        self._writing[key] = finished = trio.Event()
        try:
            if self._write_nowait is not None:  # the calls of this scheduler pass join the group (class docstring)
                await trio.lowlevel.cancel_shielded_checkpoint()
            group = [entry for entry in self._queued if entry.key == key][:self.limit]
            taken = set(map(id, group))
            self._queued = [entry for entry in self._queued if id(entry) not in taken]
            try:
                outcomes = None
                if self._write_nowait is not None:
                    try:
                        outcomes = self._write_nowait([entry.item for entry in group])
                    except trio.WouldBlock:
                        pass
                if outcomes is None:
                    outcomes = await self._write([entry.item for entry in group])
            except LlmgwError as exc:  # every caller of the group gets it (a bug propagates from the writer only)
                for entry in group:
                    entry.error, entry.done = exc, True
            else:
                self.groups += 1
                for entry, outcome in zip(group, outcomes, strict=True):
                    entry.outcome, entry.done = outcome, True
        finally:
            del self._writing[key]
            finished.set()
