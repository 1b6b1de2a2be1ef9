"""`UsageSpool`: settlements kept in an append-only file until the store has them, so none is lost or doubled.

A settlement (a request's usage record and the closing of its quota reservation, `records.Settlement`) is
appended to the spool BEFORE the store is asked to write it, and marked done AFTER the store committed it. The
done mark is written with the next line the spool writes (or at `close`), not on its own: one write(2) per
request instead of two; a mark that a crash kept from the file only makes the next opening hand its entry to the
store again, which writes it at most once (below). Its
`entry_id` is the idempotency id: the store writes an id at most once (`Store.apply_settlement`), so an entry
replayed after a crash between the store's commit and the done mark is not counted twice, and an entry the
store never received is written when the spool is opened again. Exactly once, in both crash windows.

Durability: `append` is one write(2) of one line to a file opened with O_APPEND (the line is in the kernel once it
returns, so it survives a crash of this process); `sync` is fsync(2), which survives an OS crash or power loss
and costs milliseconds here (2.6 ms measured on this machine's disk). The boundary (`boundary.StoreBoundary`)
calls `sync` before a request's answer ends whenever the store has not committed the entry by then; an entry
the store committed in time needs no fsync of the spool (it is as durable as the store's own commit).

Format (one JSON object per line, UTF-8, `\\n`-terminated):
    {"settle": {<Settlement fields>, "usage": {<UsageRecord fields>} | null}}
    {"done": "<entry_id>"}
    {"open": {<Settlement fields>, ...}}
An "open" line is a request in flight (`open_entry`, written by gateway worker processes when they admit a request):
what to bill if this process dies before it settles that request. A later "settle" (or "done") line of the same
entry id supersedes it; one left without either when the spool is opened again (the process was killed) becomes a
pending settlement, written to the store like any other.
A last line without its `\\n` (a crash in the middle of a write) is cut off when the spool is opened; it was
never acknowledged. The file is rewritten (to a temporary file, fsync'd, renamed) with only the pending entries
when it has grown past `compact_bytes`.

Thread safety: every method may be called from any thread (one lock). One process uses a spool directory at a
time: it holds an exclusive `flock` on the file while open.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import threading
from pathlib import Path

from llmgw.errors import StoreError
from llmgw.store.records import Settlement, UsageRecord

SPOOL_FILE_NAME = "usage.spool"
COMPACT_BYTES = 4 * 1024 * 1024

log = logging.getLogger("llmgw.store")


def encode_settlement(settlement: Settlement) -> bytes:
    """One spool line (with its `\\n`) for `settlement`."""
    fields = dict(vars(settlement))  # the fields of both dataclasses are plain values: no deep copy needed
    if settlement.usage is not None:
        fields["usage"] = vars(settlement.usage)
    return json.dumps({"settle": fields}, separators=(",", ":")).encode() + b"\n"


def encode_open(settlement: Settlement) -> bytes:
    """One spool line (with its `\\n`) keeping `settlement` as what to bill if the request never settles."""
    return b'{"open":' + encode_settlement(settlement)[len(b'{"settle":'):]


class Opened:
    """A decoded "open" line: `settlement` is what to bill if its request never settles."""

    __slots__ = ("settlement",)

    def __init__(self, settlement: Settlement):
        self.settlement = settlement


def decode_line(line: bytes) -> Settlement | str | Opened:
    """A spool line (without `\\n`): the Settlement it appends, the entry id it marks done, or an Opened.

    Raises ValueError for a line that is not one of the three shapes.
    """
    obj = json.loads(line)
    if isinstance(obj, dict) and isinstance(obj.get("done"), str):
        return obj["done"]
    if isinstance(obj, dict) and isinstance(obj.get("open"), dict):
        return Opened(decode_line(json.dumps({"settle": obj["open"]}).encode()))  # type: ignore[arg-type]
    if isinstance(obj, dict) and isinstance(obj.get("settle"), dict):
        fields = dict(obj["settle"])
        usage = fields.pop("usage", None)
        if fields.get("charges") is not None:
            fields["charges"] = tuple(tuple(charge) for charge in fields["charges"])
        return Settlement(**fields, usage=UsageRecord(**usage) if usage is not None else None)
    raise ValueError(f"not a spool line: {line[:80]!r}")


class UsageSpool:
    """The spool file `<directory>/usage.spool` (directory created, mode 0700, if missing).

    Opening reads the file and keeps the entries not marked done as `pending()`. Raises StoreError when the
    directory cannot be used or another process holds the spool.
    """

    def __init__(self, directory: str | Path, *, compact_bytes: int = COMPACT_BYTES):
        self.directory = Path(directory)
        self.path = self.directory / SPOOL_FILE_NAME
        self.compact_bytes = compact_bytes
        self._lock = threading.Lock()
        self._pending: dict[str, Settlement] = {}
        self._open: dict[str, Settlement] = {}  # requests in flight now (`open_entry`), kept through compaction
        self._claimed: set[str] = set()
        self._marks: list[bytes] = []  # done marks not in the file yet: written with the next line (`_write`)
        self.damaged_lines = 0
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise StoreError(f"Cannot open the usage spool {self.path}: {exc}; check the state directory.") from exc
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(self._fd)
            raise StoreError(f"The usage spool {self.path} is in use by another process; give each gateway "
                             "process its own state directory.") from exc
        self._size = self._load()
        if self.damaged_lines:
            log.warning("The usage spool %s had %d unreadable lines; they were skipped (the rest is kept).",
                        self.path, self.damaged_lines)

    def _load(self) -> int:
        """Read every line, cut a torn last line off, and keep what is not done; returns the file size."""
        with open(self.path, "rb") as handle:
            data = handle.read()
        good = data.rfind(b"\n") + 1
        if good < len(data):
            os.ftruncate(self._fd, good)
            os.fsync(self._fd)
        opened: dict[str, Settlement] = {}
        for line in data[:good].splitlines():
            try:
                item = decode_line(line)
            except (ValueError, TypeError):
                self.damaged_lines += 1
                continue
            if isinstance(item, str):
                self._pending.pop(item, None)
                opened.pop(item, None)
            elif isinstance(item, Opened):
                opened[item.settlement.entry_id] = item.settlement
            else:
                opened.pop(item.entry_id, None)
                self._pending[item.entry_id] = item
        self.abandoned = len(opened)
        self._pending.update(opened)  # requests of a process that died before settling them: billed as opened
        return good

    def __repr__(self) -> str:
        return f"UsageSpool({str(self.path)!r}, pending={len(self._pending)})"

    def append(self, settlement: Settlement) -> None:
        """Write `settlement` to the file (one write(2); not fsync'd: see `sync`) and keep it pending. It supersedes
        an `open_entry` of the same entry id."""
        line = encode_settlement(settlement)
        with self._lock:
            self._write(line)
            self._pending[settlement.entry_id] = settlement
            self._open.pop(settlement.entry_id, None)

    def open_entry(self, settlement: Settlement) -> None:
        """Write an "open" line for a request in flight (one write(2), not fsync'd: it survives the death of this
        process, which is what it is for): `settlement` is billed if no `append` of its entry id follows before
        the process ends. Raises StoreError when the file cannot be written."""
        line = encode_open(settlement)
        with self._lock:
            self._write(line)
            self._open[settlement.entry_id] = settlement

    def sync(self) -> None:
        """fsync(2) the file: every entry appended before this call survives an OS crash. Blocks milliseconds."""
        os.fsync(self._fd)

    def claim(self, entry_id: str) -> Settlement | None:
        """The pending entry `entry_id`, now claimed by the caller until `finish`; None when it is done or already
        claimed (another thread is writing it to the store)."""
        with self._lock:
            if entry_id in self._claimed or entry_id not in self._pending:
                return None
            self._claimed.add(entry_id)
            return self._pending[entry_id]

    def finish(self, entry_id: str, done: bool) -> None:
        """End a claim: `done` True (the store has the entry) marks it done (in the file with the next line written,
        see the module docstring); False leaves it pending."""
        with self._lock:
            self._claimed.discard(entry_id)
            if done and self._pending.pop(entry_id, None) is not None:
                self._marks.append(b'{"done":' + json.dumps(entry_id).encode() + b'}\n')
                if self._size > self.compact_bytes:
                    self._compact()

    def pending(self) -> list[Settlement]:
        """The entries not yet in the store, oldest first (a copy)."""
        with self._lock:
            return list(self._pending.values())

    def statistics(self) -> dict[str, int]:
        """{"pending": entries not yet in the store, "claimed": being written now, "bytes": file size,
        "damaged_lines": unreadable lines skipped when the spool was opened, "open": requests in flight now,
        "abandoned": "open" entries found without their settlement when the spool was opened}."""
        with self._lock:
            return {"pending": len(self._pending), "claimed": len(self._claimed), "bytes": self._size,
                    "damaged_lines": self.damaged_lines, "open": len(self._open), "abandoned": self.abandoned}

    def close(self) -> None:
        """Write the done marks not yet in the file, and close it (pending entries stay in it for the next opening)."""
        with self._lock:
            if self._fd >= 0:
                if self._marks:
                    try:
                        self._write(b"")
                    except StoreError as exc:  # the entries are handed to the store again at the next opening
                        log.warning("%s", exc)
                os.close(self._fd)
                self._fd = -1

    def _write(self, line: bytes) -> None:
        """One write(2) of `line` and the done marks waiting to be written (`_marks`)."""
        if self._marks:
            line += b"".join(self._marks)
        try:
            written = os.write(self._fd, line)
        except OSError as exc:
            raise StoreError(f"Cannot write the usage spool {self.path}: {exc}; free disk space.") from exc
        if written != len(line):  # a short write (disk full): cut it off so the next line starts clean
            os.ftruncate(self._fd, self._size)
            raise StoreError(f"Cannot write the usage spool {self.path}: the disk is full; free disk space.")
        self._size += written
        self._marks.clear()

    def _compact(self) -> None:
        """Rewrite the file with only the pending entries (temporary file, fsync, rename, fsync the directory)."""
        temporary = self.path.with_suffix(".compacting")
        data = (b"".join(encode_settlement(s) for s in self._pending.values())
                + b"".join(encode_open(s) for s in self._open.values()))
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.fsync(self._fd)
        os.replace(temporary, self.path)
        directory = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
        old = self._fd
        self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CLOEXEC)
        fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.close(old)
        self._size = len(data)
        self._marks.clear()  # their entries are not in the rewritten file
