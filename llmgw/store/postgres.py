"""`PostgresStore`: the runtime store in a PostgreSQL database, shared by several control planes.

psycopg 3 with a psycopg_pool connection pool (connections in autocommit; a write is one explicit transaction,
`BEGIN ... COMMIT`, its statements sent in as few round trips as its reads allow: `dialects.PostgresBatch`; a read
is one statement, prepared by psycopg after its fifth use). Measured with bench/store_reserve_settle.py: one
statement per round trip cost 553 µs of client CPU per reserve + settle, psycopg's pipeline mode 612 µs; the
batches see docs/ha.md. Every method of `SqlStore` runs its statements as they run on SQLite
(see `dialects`); reservations of one quota scope are serialised by a row lock on that scope (`quota_scopes`),
settles and releases touch only their own reservation row and add to windows with `INSERT ... ON CONFLICT DO
UPDATE`, leases are one conditional upsert: no read-then-write race between control planes.

`lock_timeout` and `statement_timeout` are `busy_timeout` seconds on every connection, and a free connection is
waited for that long: a write that cannot run in that time raises TemporaryError, as a locked SQLite file does.

The password of a URL is never printed: `url` is the redacted URL (`postgresql://user:***@host/db`), and error
text from the database is scrubbed of the password before it is raised.

Format: https://www.psycopg.org/psycopg3/docs/, https://www.psycopg.org/psycopg3/docs/advanced/pool.html,
connection URLs: https://www.postgresql.org/docs/15/libpq-connect.html#LIBPQ-CONNSTRING.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

import psycopg
import psycopg.errors
from psycopg_pool import ConnectionPool, PoolTimeout

from llmgw.errors import StoreError, TemporaryError
from llmgw.store.dialects import PostgresBatch, PostgresSql
from llmgw.store.postgres_schema import SCHEMA_VERSION, migrate, newer_schema, schema_version
from llmgw.store.sqlstore import SqlStore

DEFAULT_POOL_SIZE = 8
DEFAULT_CONNECT_TIMEOUT = 5.0
REDACTED = "***"

_RETRYABLE = (psycopg.OperationalError, psycopg.errors.SerializationFailure, psycopg.errors.DeadlockDetected,
              psycopg.errors.LockNotAvailable, psycopg.errors.QueryCanceled)


_SECRET_PARAMETERS = frozenset({"password", "passwd", "private_token", "access_token", "token", "api_key", "apikey",
                                "client_secret", "secret", "sig", "signature", "sslpassword"})
"""Query parameters whose values are redacted (llmgw.settings.url_secrets.TOKEN_QUERY_PARAMETERS, which the store
layer may not import, and libpq's sslpassword)."""


def redact_url(url: str) -> str:
    """`url` with its password (in the user part up to the authority's last "@", or a query parameter of
    _SECRET_PARAMETERS) replaced by ***."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, hostport = netloc.rpartition("@")
        user, colon, _password = userinfo.partition(":")
        netloc = f"{user}:{REDACTED}@{hostport}" if colon else netloc
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(name.lower() in _SECRET_PARAMETERS for name, _ in pairs):
            query = urlencode([(n, REDACTED if n.lower() in _SECRET_PARAMETERS else v) for n, v in pairs], safe="*")
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def url_password(url: str) -> str | None:
    """The password a URL carries (decoded), or None."""
    parts = urlsplit(url)
    if parts.password:
        return unquote(parts.password)
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if name == "password" and value:
            return value
    return None


class PostgresStore(SqlStore):
    """The `Store` in the PostgreSQL database at `url` (`postgresql://user:password@host:port/db?options=...`).

    Creates the tables (migrations) in the connection's schema (`search_path`) unless `migrate` is False, then
    the version must be this llmgw's. `slot_ttl` as SqliteStore. `pool_size`: connections at most.
    `busy_timeout` (seconds): see the module docstring. `connect_timeout` (seconds) bounds the first connection.
    Raises StoreError, naming the URL without its password and the database's error, when the database cannot
    be reached or used, or has a newer schema (both versions named).
    """

    dialect = "postgresql"
    SCHEMA_VERSION = SCHEMA_VERSION

    def __init__(self, url: str, *, slot_ttl: float = 300.0, busy_timeout: float = 5.0,
                 pool_size: int = DEFAULT_POOL_SIZE, connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
                 migrate: bool = True):
        self.url = redact_url(url)
        self._password = url_password(url)
        self.slot_ttl = slot_ttl
        self.busy_timeout = busy_timeout
        self._last_prune = 0.0
        try:
            with psycopg.connect(url, autocommit=True, connect_timeout=max(1, round(connect_timeout))) as conn:
                self.schema_version = self._open_schema(conn, migrate)
        except psycopg.Error as exc:
            raise StoreError(f"Cannot open the store {self.url} ({self._scrub(exc)}); check that PostgreSQL runs "
                             "there and that the URL's user, password and database are right.") from exc
        self._pool = ConnectionPool(url, min_size=1, max_size=pool_size, open=False, name="llmgw-store",
                                    timeout=busy_timeout, configure=self._configure,
                                    kwargs={"autocommit": True, "connect_timeout": max(1, round(connect_timeout))})
        try:
            self._pool.open(wait=True, timeout=connect_timeout + busy_timeout)
        except PoolTimeout as exc:
            self._pool.close()
            raise StoreError(f"Cannot open the store {self.url}: no connection within "
                             f"{connect_timeout + busy_timeout:g} s; check that PostgreSQL accepts connections.") from exc

    def _configure(self, conn: psycopg.Connection) -> None:
        timeout_ms = max(1, int(self.busy_timeout * 1000))
        conn.execute(f"SET lock_timeout = {timeout_ms}")
        conn.execute(f"SET statement_timeout = {max(timeout_ms, 30000)}")

    def _open_schema(self, conn: psycopg.Connection, apply: bool) -> int:
        if apply:
            return migrate(conn, self.url)
        current = schema_version(conn)
        if current > SCHEMA_VERSION:
            refusal = newer_schema(conn, self.url, current)
            if refusal is not None:
                raise refusal
            return current
        if current < SCHEMA_VERSION:
            raise StoreError(f"The store {self.url} has schema version {current}, older than this llmgw's "
                             f"({SCHEMA_VERSION}); run `llmgw store migrate --store {self.url}` first.")
        return current

    def __repr__(self) -> str:
        return f"PostgresStore({self.url!r})"

    def close(self) -> None:
        self._pool.close()

    def _scrub(self, exc: BaseException) -> str:
        text = " ".join(str(exc).split())  # libpq's messages run over several lines
        if self._password:
            text = text.replace(self._password, REDACTED)
        return text

    # -- transactions ------------------------------------------------------------------------------------------
    @contextmanager
    def _write(self) -> Iterator[PostgresBatch]:
        with self._errors(), self._pool.connection() as conn:
            batch = PostgresBatch(psycopg.ClientCursor(conn))
            batch.execute("BEGIN")
            try:
                yield batch
                batch.execute("COMMIT")
                batch.flush()
            except BaseException:
                if conn.pgconn.transaction_status != psycopg.pq.TransactionStatus.IDLE and not conn.closed:
                    try:
                        conn.execute("ROLLBACK")
                    except psycopg.Error:
                        pass  # a broken connection: the pool drops it
                raise

    @contextmanager
    def _read(self) -> Iterator[PostgresSql]:
        with self._errors(), self._pool.connection() as conn:
            yield PostgresSql(conn)

    @contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except PoolTimeout as exc:
            raise TemporaryError(f"The store {self.url} gave no connection within {self.busy_timeout:g} s "
                                 "(all busy, or the database is unreachable); retry in a moment.", delay=1.0) from exc
        except _RETRYABLE as exc:
            raise TemporaryError(f"The store {self.url} failed for now: {self._scrub(exc)}; retry in a moment.",
                                 delay=1.0) from exc
        except psycopg.Error as exc:
            raise StoreError(f"The store {self.url} failed: {self._scrub(exc)}.") from exc

    def _after_insert_rows(self, conn: PostgresBatch, table: str) -> None:
        if table in ("usage", "bench_results"):  # rows came with their ids: new rows must be numbered after them
            conn.execute(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), coalesce(max(id), 0) + 1, false) "
                         f"FROM {table}")
