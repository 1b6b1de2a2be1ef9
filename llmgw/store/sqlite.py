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

Checkpoints (copying the WAL back into the database file, with an fsync) run in a background thread on a
connection of its own every `checkpoint_interval` seconds (PASSIVE: writers never wait for it), not inside a
commit: SQLite's automatic checkpoint ran in whichever COMMIT crossed 1000 WAL pages and stalled that caller
(the gateway's event loop) 6-70 ms here. Durability is the same: a commit is in the WAL either way.

Format: https://www.sqlite.org/wal.html, https://www.sqlite.org/pragma.html.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from llmgw.errors import StoreError, TemporaryError
from llmgw.store.dialects import SqliteSql
from llmgw.store.schema import SCHEMA_VERSION, migrate, schema_version
from llmgw.store.sqlstore import SqlStore

DEFAULT_BUSY_TIMEOUT = 5.0
DEFAULT_SLOT_TTL = 300.0
DEFAULT_CHECKPOINT_INTERVAL = 1.0
AUTOCHECKPOINT_PAGES = 1000  # SQLite's default, restored if the background checkpoint cannot run


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
            migrate(self._conn, str(self.path))  # raises, naming both versions
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

    # -- transactions ------------------------------------------------------------------------------------------
    @contextmanager
    def _write(self) -> Iterator[SqliteSql]:
        if not self._lock.acquire(timeout=self.busy_timeout):
            raise TemporaryError(f"The store {self.path} stayed busy for {self.busy_timeout:g} s (another write of "
                                 "this process waits for its lock); retry in a moment.", delay=0.5)
        try:
            with self._errors():
                self._conn.execute("BEGIN IMMEDIATE")
                try:
                    yield SqliteSql(self._conn)
                except BaseException:
                    self._conn.execute("ROLLBACK")
                    raise
                self._conn.execute("COMMIT")
        finally:
            self._lock.release()

    @contextmanager
    def _read(self) -> Iterator[SqliteSql]:
        with self._read_lock, self._errors():
            yield SqliteSql(self._reader)

    @contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except sqlite3.OperationalError as exc:
            if "locked" in str(exc) or "busy" in str(exc):
                raise TemporaryError(f"The store {self.path} is locked by another process ({exc}); "
                                     "retry in a moment.", delay=0.5) from exc
            if "full" in str(exc):
                raise TemporaryError(f"The store {self.path} cannot grow ({exc}); free disk space.", delay=5.0) from exc
            raise StoreError(f"The store {self.path} failed: {exc}.") from exc
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"The store {self.path} failed: {exc}; it may be damaged.") from exc
