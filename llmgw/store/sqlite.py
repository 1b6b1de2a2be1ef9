"""`SqliteStore`: the runtime store in one SQLite file, for one control plane (and CLI commands beside it).

The file is in WAL mode with `synchronous=NORMAL`: a committed transaction survives a crash of the process
(it is in the WAL, written to the operating system before COMMIT returns) but the last transactions may be
lost on power failure or an OS crash, until the next checkpoint. `busy_timeout` makes a writer wait for
another process's write lock instead of failing at once.

Thread safety: one write connection (`check_same_thread=False`) behind one lock; every write holds the lock
for one short transaction. Writes are `BEGIN IMMEDIATE` transactions, so a check and the write it decides are
atomic also against other processes using the same file. (One connection keeps writes in one process from
fighting over the file lock through SQLite's sleeping busy handler, which is much slower than a mutex.) A
writer waits at most `busy_timeout` for that lock too, then gets TemporaryError, so a queue of writers behind a
file locked by another process fails in bounded time instead of one busy timeout after another. Reads run
on a second connection behind a lock of their own: in WAL mode they never wait for a writer, so an API key
is still checked while another process holds the write lock.

Writes without waiting (`call_nowait`): the gateway's event loop runs its per-request writes (a quota reservation,
a settlement) on its own thread when they need not wait, saving a worker-thread hop each (two per request: about
0.5 M of a request's 4.7 M instructions, and most of its futex and epoll system calls; docs/gateway.md).
Such a write takes this process's write lock only if it is free and runs with SQLite's busy timeout at 0, so it
never waits for another thread or process: when either holds the lock it raises `trio.WouldBlock` (nothing was
written; a transaction begun is rolled back) and the caller runs it in a worker thread as before. What the write
then costs the caller is its own work (a short transaction; `synchronous=NORMAL` in WAL mode does no fsync at
COMMIT, and checkpoints run elsewhere, below).

Checkpoints (copying the WAL back into the database file, with an fsync) run in a background thread on a
connection of its own every `checkpoint_interval` seconds (PASSIVE: writers never wait for it), not inside a
commit: SQLite's automatic checkpoint ran in whichever COMMIT crossed 1000 WAL pages and stalled that caller
(the gateway's event loop) 6-70 ms here. Durability is the same: a commit is in the WAL either way.

Format: https://www.sqlite.org/wal.html, https://www.sqlite.org/pragma.html.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import trio

from llmgw.errors import StoreError, TemporaryError
from llmgw.store.dialects import SqliteSql
from llmgw.store.schema import SCHEMA_VERSION, migrate, schema_version
from llmgw.store.sqlstore import SqlStore

DEFAULT_BUSY_TIMEOUT = 5.0
DEFAULT_SLOT_TTL = 300.0
DEFAULT_CHECKPOINT_INTERVAL = 1.0
AUTOCHECKPOINT_PAGES = 1000  # SQLite's default, restored if the background checkpoint cannot run
T = TypeVar("T")


class SqliteStore(SqlStore):
    """The `Store` in a SQLite file at `path` (created with its parent directories if missing).

    `busy_timeout` (seconds) is how long a write waits for another process's lock before TemporaryError.
    `slot_ttl` (seconds) is how long a concurrency slot counts without being renewed, settled or released:
    after it, a slot left by a crashed gateway stops counting. Raises StoreError when the file cannot be
    opened, is not a SQLite database, or has a newer schema (naming both versions); with `migrate=False`, also
    when its schema is older than this llmgw's (`llmgw store migrate` brings it up to date).
    """

    dialect = "sqlite"
    SCHEMA_VERSION = SCHEMA_VERSION

    def __init__(self, path: str | Path, *, busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
                 slot_ttl: float = DEFAULT_SLOT_TTL,
                 checkpoint_interval: float | None = DEFAULT_CHECKPOINT_INTERVAL, migrate: bool = True):
        self.path = Path(path)
        self.url = f"sqlite:///{self.path.resolve()}"
        self.slot_ttl = slot_ttl
        self.busy_timeout = busy_timeout
        self._lock = threading.Lock()
        self._read_lock = threading.Lock()
        self._busy_ms = int(busy_timeout * 1000)  # the write connection's busy timeout now (0 inside call_nowait)
        self._nowait_thread: int | None = None  # the thread running call_nowait (it holds _lock)
        self._last_prune = 0.0
        self._reader: sqlite3.Connection | None = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._conn = sqlite3.connect(self.path, timeout=busy_timeout, isolation_level=None,
                                         check_same_thread=False)
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"Cannot open the store {self.path}: {exc}; check the path and its permissions.") from exc
        try:
            mode = self._conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if mode.lower() != "wal":
                raise StoreError(f"The store {self.path} cannot use WAL mode (got {mode!r}); "
                                 "put it on a local filesystem.")
            self._conn.execute("PRAGMA synchronous=NORMAL")
            self._conn.execute(f"PRAGMA busy_timeout={int(busy_timeout * 1000)}")
            self.schema_version = self._open_schema(migrate)
            self._reader = sqlite3.connect(self.path, timeout=busy_timeout, isolation_level=None,
                                           check_same_thread=False)
            self._reader.execute(f"PRAGMA busy_timeout={int(busy_timeout * 1000)}")
            self._checkpointer: threading.Thread | None = None
            self._stop_checkpoints = threading.Event()
            if checkpoint_interval is not None:
                self._conn.execute("PRAGMA wal_autocheckpoint=0")
                self._checkpointer = threading.Thread(target=self._checkpoint_loop, name="llmgw-store-checkpoint",
                                                      args=(checkpoint_interval, busy_timeout), daemon=True)
                self._checkpointer.start()
        except sqlite3.DatabaseError as exc:
            self._close_connections()
            raise StoreError(f"The store {self.path} is not a usable SQLite database: {exc}; "
                             "point llmgw at another file or move this one away.") from exc
        except BaseException:
            self._close_connections()
            raise

    def _open_schema(self, apply: bool) -> int:
        if apply:
            return migrate(self._conn, str(self.path))
        current = schema_version(self._conn)
        if current > SCHEMA_VERSION:
            return migrate(self._conn, str(self.path))  # raises, naming both versions, unless readable by this llmgw
        if current < SCHEMA_VERSION:
            raise StoreError(f"The store {self.path} has schema version {current}, older than this llmgw's "
                             f"({SCHEMA_VERSION}); run `llmgw store migrate --store {self.url}` first.")
        return current

    def _close_connections(self) -> None:
        self._conn.close()
        if self._reader is not None:
            self._reader.close()

    def __repr__(self) -> str:
        return f"SqliteStore({str(self.path)!r})"

    def close(self) -> None:
        if self._checkpointer is not None:
            self._stop_checkpoints.set()
            self._checkpointer.join(timeout=10)
        with self._lock, self._read_lock:
            self._close_connections()

    def _checkpoint_loop(self, interval: float, busy_timeout: float) -> None:
        """Run PASSIVE checkpoints every `interval` s until close(); if they cannot run at all (the file became
        unusable), hand checkpointing back to SQLite's automatic one so the WAL cannot grow without bound."""
        try:
            conn = sqlite3.connect(self.path, timeout=busy_timeout, isolation_level=None, check_same_thread=False)
        except sqlite3.Error:
            self._restore_autocheckpoint()
            return
        try:
            while not self._stop_checkpoints.wait(interval):
                try:
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
                except sqlite3.OperationalError:
                    continue  # busy or locked by another process: the next round catches up
        except sqlite3.Error:
            self._restore_autocheckpoint()
        finally:
            conn.close()

    def _restore_autocheckpoint(self) -> None:
        with self._lock:
            try:
                self._conn.execute(f"PRAGMA wal_autocheckpoint={AUTOCHECKPOINT_PAGES}")
            except sqlite3.ProgrammingError:
                pass  # the store was closed meanwhile

    def call_nowait(self, function: Callable[..., T], *args) -> T:
        """`function(*args)` on this thread, now, if its writes to this store need not wait (see the module
        docstring): `function` is a method of this store, or code calling them. Raises trio.WouldBlock, having
        written nothing, when this process's write lock is taken or another process holds the file's; otherwise
        what `function` returns or raises. Not reentrant.
        """
        if not self._lock.acquire(blocking=False):
            raise trio.WouldBlock
        self._nowait_thread = threading.get_ident()
        try:
            self._set_busy_timeout(0)
            return function(*args)
        finally:
            self._nowait_thread = None
            self._lock.release()

    def _set_busy_timeout(self, milliseconds: int) -> None:
        """(Holding _lock.) The write connection's busy timeout, set only when it changes."""
        if self._busy_ms != milliseconds:
            self._conn.execute(f"PRAGMA busy_timeout={milliseconds}")
            self._busy_ms = milliseconds

    # -- transactions ------------------------------------------------------------------------------------------
    @contextmanager
    def _write(self) -> Iterator[SqliteSql]:
        nowait = self._nowait_thread == threading.get_ident()  # inside call_nowait: _lock is this thread's
        if not nowait:
            if not self._lock.acquire(timeout=self.busy_timeout):
                raise TemporaryError(f"The store {self.path} stayed busy for {self.busy_timeout:g} s (another write "
                                     "of this process waits for its lock); retry in a moment.", delay=0.5)
        try:
            with self._errors(nowait):
                if not nowait:
                    self._set_busy_timeout(int(self.busy_timeout * 1000))
                self._conn.execute("BEGIN IMMEDIATE")
                try:
                    yield SqliteSql(self._conn)
                    self._conn.execute("COMMIT")
                except BaseException:
                    if self._conn.in_transaction:  # also a COMMIT that failed: SQLite keeps its transaction open
                        self._conn.execute("ROLLBACK")
                    raise
        finally:
            if not nowait:
                self._lock.release()

    @contextmanager
    def _read(self) -> Iterator[SqliteSql]:
        with self._read_lock, self._errors():
            yield SqliteSql(self._reader)

    @contextmanager
    def _errors(self, nowait: bool = False) -> Iterator[None]:
        try:
            yield
        except sqlite3.OperationalError as exc:
            if ("locked" in str(exc) or "busy" in str(exc)) and nowait:
                raise trio.WouldBlock from exc
            if "locked" in str(exc) or "busy" in str(exc):
                raise TemporaryError(f"The store {self.path} is locked by another process ({exc}); "
                                     "retry in a moment.", delay=0.5) from exc
            if "full" in str(exc):
                raise TemporaryError(f"The store {self.path} cannot grow ({exc}); free disk space.", delay=5.0) from exc
            raise StoreError(f"The store {self.path} failed: {exc}.") from exc
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"The store {self.path} failed: {exc}; it may be damaged.") from exc
