"""`Groups`: store calls that arrive while one group is being written wait, and go together as the next group.

A group commit: each group is one call of `write(items)` (one worker thread, one store transaction), so under
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
    """

    def __init__(self, write: Callable[[list[Item]], Awaitable[Sequence[Outcome]]], *, limit: int,
                 abandon: bool) -> None:
        self._write = write
        self.limit = limit
        self.abandon = abandon
        self.groups = 0  # groups written since start
        self._queued: list[_Entry] = []
        self._writing: dict[Hashable, trio.Event] = {}  # key -> set when its group being written ends

    def busy(self, key: Hashable = None) -> bool:
        """Whether items of `key` are queued or a group of `key` is being written now."""
        return key in self._writing or any(entry.key == key for entry in self._queued)

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
        group = [entry for entry in self._queued if entry.key == key][:self.limit]
        taken = set(map(id, group))
        self._queued = [entry for entry in self._queued if id(entry) not in taken]
        self._writing[key] = finished = trio.Event()
        try:
            try:
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
