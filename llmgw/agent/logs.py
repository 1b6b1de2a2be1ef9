"""Log lines kept in memory for `llmgw logs`: a ring per shard and one for the agent itself.

An engine writes its stdout and stderr to a file under the agent's state directory (`shards/<id>.log`, opened
with O_APPEND) rather than to a pipe: a pipe would break, and kill the engine with SIGPIPE, when the agent
restarts, and adoption must keep engines running. `tail_into` follows that file line by line into a `LogRing`.
"""

from __future__ import annotations

import logging
import os
from collections import deque
from pathlib import Path

import trio

DEFAULT_RING_LINES = 2000
# The log file is cut back to empty once it grows past this (lines already read are in the ring). Safe because
# the engine writes with O_APPEND, so its next write lands at the new end.
LOG_FILE_LIMIT_BYTES = 16 * 1024 * 1024


class LogRing:
    """The last `capacity` lines (text without the newline), oldest first. Not thread-safe; one trio thread."""

    def __init__(self, capacity: int = DEFAULT_RING_LINES):
        self._lines: deque[str] = deque(maxlen=capacity)

    def append(self, line: str) -> None:
        """Add one line (a trailing newline is stripped)."""
        self._lines.append(line.rstrip("\r\n"))

    def tail(self, count: int | None = None) -> list[str]:
        """The last `count` lines (all kept lines when None or 0), oldest first."""
        if not count or count >= len(self._lines):
            return list(self._lines)
        return list(self._lines)[-count:]

    def __len__(self) -> int:
        return len(self._lines)


class RingHandler(logging.Handler):
    """A logging handler that keeps formatted records in a `LogRing` (the agent's own log)."""

    def __init__(self, ring: LogRing):
        super().__init__()
        self.ring = ring
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            for line in self.format(record).splitlines() or [""]:
                self.ring.append(line)
        except (ValueError, TypeError):  # a bad format string in a log call must not break the agent
            self.handleError(record)


def open_log_file(path: Path) -> int:
    """Open (creating) `path` for appending and return the file descriptor to hand to the engine process."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)


async def tail_into(path: Path, ring: LogRing, *, start_at_end: bool = False, idle_poll: float = 1.0) -> None:
    """Follow `path` forever, appending each complete line to `ring`; a checkpoint, runs until cancelled.

    Polls the file (every 0.1 s after new data, slowing to `idle_poll` seconds when quiet). When the file shrinks
    (cut back by this function past LOG_FILE_LIMIT_BYTES, or replaced) reading starts again at its start.
    `start_at_end` skips what is already there (not used for adoption: the last lines are wanted then).
    """
    position = 0
    if start_at_end:
        try:
            position = path.stat().st_size
        except OSError:
            position = 0
    partial = b""
    delay = 0.1
    while True:
        try:
            size = path.stat().st_size
        except OSError:
            size = -1
        if 0 <= size < position:
            position, partial = 0, b""
        if size > position:
            with open(path, "rb") as handle:
                handle.seek(position)
                data = handle.read(size - position)
            position += len(data)
            *lines, partial = (partial + data).split(b"\n")
            for line in lines:
                ring.append(line.decode("utf-8", "replace"))
            if len(partial) > 64 * 1024:  # a runaway line without newline: keep it, in pieces
                ring.append(partial.decode("utf-8", "replace"))
                partial = b""
            if position > LOG_FILE_LIMIT_BYTES:
                os.truncate(path, 0)
                position = 0
            delay = 0.1
        else:
            delay = min(delay * 2, idle_poll)
        await trio.sleep(delay)
