"""`SqliteStore`: the runtime store in one SQLite file, for one control plane (and CLI commands beside it).

The file is in WAL mode with `synchronous=NORMAL`: a committed transaction survives a crash of the process
(it is in the WAL, written to the operating system before COMMIT returns) but the last transactions may be
lost on power failure or an OS crash, until the next checkpoint. `busy_timeout` makes a writer wait for
another process's write lock instead of failing at once.

Thread safety: one connection (`check_same_thread=False`) behind one lock; every method holds the lock for
one short transaction. Writes are `BEGIN IMMEDIATE` transactions, so a check and the write it decides are
atomic also against other processes using the same file. (One connection keeps writes in one process from
fighting over the file lock through SQLite's sleeping busy handler, which is much slower than a mutex.)

Checkpoints (copying the WAL back into the database file, with an fsync) run in a background thread on a
connection of its own every `checkpoint_interval` seconds (PASSIVE: writers never wait for it), not inside a
commit: SQLite's automatic checkpoint ran in whichever COMMIT crossed 1000 WAL pages and stalled that caller
(the gateway's event loop) 6-70 ms here. Durability is the same: a commit is in the WAL either way.

Format: https://www.sqlite.org/wal.html, https://www.sqlite.org/pragma.html.
"""

from __future__ import annotations

import secrets
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from llmgw.errors import StoreError, TemporaryError, UsageError
from llmgw.routes import QuotaLimits
from llmgw.store import keys, quotas
from llmgw.store import usage as usage_table
from llmgw.store.records import ApiKey, Headroom, KeyCheck, Rejection, Reservation, UsageRecord, UsageRow
from llmgw.store.schema import migrate

DEFAULT_BUSY_TIMEOUT = 5.0
DEFAULT_SLOT_TTL = 300.0
DEFAULT_CHECKPOINT_INTERVAL = 1.0
AUTOCHECKPOINT_PAGES = 1000  # SQLite's default, restored if the background checkpoint cannot run
PRUNE_INTERVAL = 30.0


def _now(now: float | None) -> float:
    return time.time() if now is None else now


class SqliteStore:
    """The `Store` in a SQLite file at `path` (created with its parent directories if missing).

    `busy_timeout` (seconds) is how long a write waits for another process's lock before TemporaryError.
    `slot_ttl` (seconds) is how long a concurrency slot counts without being renewed, settled or released:
    after it, a slot left by a crashed gateway stops counting. Raises StoreError when the file cannot be
    opened, is not a SQLite database, or has a newer schema.
    """

    def __init__(self, path: str | Path, *, busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
                 slot_ttl: float = DEFAULT_SLOT_TTL,
                 checkpoint_interval: float | None = DEFAULT_CHECKPOINT_INTERVAL):
        self.path = Path(path)
        self.url = f"sqlite:///{self.path.resolve()}"
        self.slot_ttl = slot_ttl
        self._lock = threading.Lock()
        self._last_prune = 0.0
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
            self.schema_version = migrate(self._conn, str(self.path))
            self._checkpointer: threading.Thread | None = None
            self._stop_checkpoints = threading.Event()
            if checkpoint_interval is not None:
                self._conn.execute("PRAGMA wal_autocheckpoint=0")
                self._checkpointer = threading.Thread(target=self._checkpoint_loop, name="llmgw-store-checkpoint",
                                                      args=(checkpoint_interval, busy_timeout), daemon=True)
                self._checkpointer.start()
        except sqlite3.DatabaseError as exc:
            self._conn.close()
            raise StoreError(f"The store {self.path} is not a usable SQLite database: {exc}; "
                             "point llmgw at another file or move this one away.") from exc
        except BaseException:
            self._conn.close()
            raise

    def __repr__(self) -> str:
        return f"SqliteStore({str(self.path)!r})"

    def close(self) -> None:
        if self._checkpointer is not None:
            self._stop_checkpoints.set()
            self._checkpointer.join(timeout=10)
        with self._lock:
            self._conn.close()

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
    def _write(self) -> Iterator[sqlite3.Connection]:
        with self._lock, self._errors():
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        with self._lock, self._errors():
            yield self._conn

    @contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except sqlite3.OperationalError as exc:
            if "locked" in str(exc) or "busy" in str(exc):
                raise TemporaryError(f"The store {self.path} is locked by another process ({exc}); "
                                     "retry in a moment.", delay=0.5) from exc
            raise StoreError(f"The store {self.path} failed: {exc}.") from exc
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"The store {self.path} failed: {exc}; it may be damaged.") from exc

    # -- secrets and key/value ---------------------------------------------------------------------------------
    def get_or_create_secret(self, name: str, nbytes: int = 32) -> bytes:
        with self._read() as conn:
            row = conn.execute("SELECT value FROM secrets WHERE name = ?", (name,)).fetchone()
        if row is not None:
            return bytes(row[0])
        with self._write() as conn:
            conn.execute("INSERT OR IGNORE INTO secrets (name, value, created_at) VALUES (?, ?, ?)",
                         (name, secrets.token_bytes(nbytes), time.time()))
            return bytes(conn.execute("SELECT value FROM secrets WHERE name = ?", (name,)).fetchone()[0])

    def get(self, key: str) -> str | None:
        with self._read() as conn:
            row = conn.execute("SELECT value FROM kv WHERE key = ?", (key,)).fetchone()
        return None if row is None else row[0]

    def put(self, key: str, value: str) -> None:
        with self._write() as conn:
            conn.execute("INSERT INTO kv (key, value, updated_at) VALUES (?, ?, ?) "
                         "ON CONFLICT (key) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at",
                         (key, value, time.time()))

    # -- admin tokens ------------------------------------------------------------------------------------------
    def create_admin_token(self) -> str:
        with self._write() as conn:
            return keys.insert_admin_token(conn, time.time())

    def check_admin_token(self, token: str) -> bool:
        with self._read() as conn:
            return keys.check_admin_token(conn, token)

    # -- API keys ----------------------------------------------------------------------------------------------
    def create_api_key(self, project: str, name: str | None = None, expires_at: float | None = None,
                       now: float | None = None) -> tuple[ApiKey, str]:
        with self._write() as conn:
            return keys.insert_api_key(conn, project, name, expires_at, _now(now))

    def check_api_key(self, plaintext: str, now: float | None = None) -> KeyCheck:
        with self._read() as conn:
            return keys.check_api_key(conn, plaintext, _now(now))

    def authenticate(self, plaintext: str, now: float | None = None) -> ApiKey | None:
        return self.check_api_key(plaintext, now).key

    def list_api_keys(self, project: str | None = None) -> list[ApiKey]:
        with self._read() as conn:
            return keys.list_api_keys(conn, project)

    def revoke_api_key(self, key_id: str, now: float | None = None) -> ApiKey:
        with self._write() as conn:
            return keys.revoke_api_key(conn, key_id, _now(now))

    # -- quotas ------------------------------------------------------------------------------------------------
    def reserve(self, scopes: Sequence[tuple[str, QuotaLimits]], estimated_tokens: int, estimated_cost: float,
                now: float | None = None) -> Reservation | Rejection:
        if estimated_tokens < 0 or estimated_cost < 0:
            raise UsageError("A reservation's estimated tokens and cost cannot be negative.")
        now = _now(now)
        if not any(quotas.has_limits(limits) for _scope, limits in scopes):
            return Reservation(None, (), estimated_tokens, estimated_cost, now)
        with self._write() as conn:
            if now - self._last_prune >= PRUNE_INTERVAL:
                quotas.prune(conn, now)
                self._last_prune = now
            return quotas.reserve(conn, scopes, estimated_tokens, estimated_cost, now,
                                  "res_" + uuid.uuid4().hex, self.slot_ttl)

    def settle(self, reservation: Reservation, actual_tokens: int, actual_cost: float, now: float | None = None,
               usage: UsageRecord | None = None) -> bool:
        now = _now(now)
        if reservation.reservation_id is None and usage is None:
            return True
        with self._write() as conn:
            settled = True
            if reservation.reservation_id is not None:
                settled = quotas.close(conn, reservation.reservation_id, (int(actual_tokens), float(actual_cost)), now,
                                       bool(reservation.slots))
            if usage is not None:
                usage_table.insert_usage(conn, usage)
            return settled

    def release(self, reservation: Reservation, now: float | None = None) -> bool:
        if reservation.reservation_id is None:
            return True
        with self._write() as conn:
            return quotas.close(conn, reservation.reservation_id, None, _now(now), bool(reservation.slots))

    def renew(self, reservation: Reservation, now: float | None = None) -> bool:
        if reservation.reservation_id is None or not reservation.slots:
            return False
        with self._write() as conn:
            return quotas.renew(conn, reservation.reservation_id, _now(now), self.slot_ttl) > 0

    def headroom(self, scopes: Sequence[tuple[str, QuotaLimits]], now: float | None = None) -> Headroom:
        if not any(quotas.has_limits(limits) for _scope, limits in scopes):
            return Headroom()
        with self._read() as conn:
            return quotas.read_headroom(conn, scopes, _now(now))

    # -- usage -------------------------------------------------------------------------------------------------
    def record_usage(self, record: UsageRecord) -> None:
        with self._write() as conn:
            usage_table.insert_usage(conn, record)

    def query_usage(self, project: str | None = None, since: float | None = None,
                    by: str = "model") -> list[UsageRow]:
        with self._read() as conn:
            return usage_table.query_usage(conn, project, since, by)

    def recent_usage(self, project: str | None = None, since: float | None = None,
                     limit: int = 100) -> list[UsageRecord]:
        with self._read() as conn:
            return usage_table.list_usage(conn, project, since, limit)

    # -- leases ------------------------------------------------------------------------------------------------
    def acquire_lease(self, name: str, holder: str, ttl_seconds: float, now: float | None = None) -> bool:
        now = _now(now)
        with self._write() as conn:
            row = conn.execute("SELECT holder, expires_at FROM leases WHERE name = ?", (name,)).fetchone()
            if row is not None and row[0] != holder and row[1] > now:
                return False
            conn.execute("INSERT INTO leases (name, holder, expires_at) VALUES (?, ?, ?) ON CONFLICT (name) "
                         "DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at",
                         (name, holder, now + ttl_seconds))
            return True

    def release_lease(self, name: str, holder: str) -> bool:
        with self._write() as conn:
            return conn.execute("DELETE FROM leases WHERE name = ? AND holder = ?", (name, holder)).rowcount > 0

    def lease_holder(self, name: str, now: float | None = None) -> str | None:
        with self._read() as conn:
            row = conn.execute("SELECT holder FROM leases WHERE name = ? AND expires_at > ?",
                               (name, _now(now))).fetchone()
        return None if row is None else row[0]

