"""The two SQL dialects of the store behind one small connection interface.

The statements of `keys`, `quotas` and `usage` are written once, in the SQL that SQLite (>= 3.35) and PostgreSQL
(>= 13) both speak (`INSERT ... ON CONFLICT`, `DELETE ... RETURNING`, row values), with `?` placeholders. A
`SqlConnection` runs them on one backend: `SqliteSql` hands them to `sqlite3` as they are; `PostgresSql` turns
`?` into psycopg's `%s` (no statement of ours holds a literal `?` or `%`). "How many rows" is asked with
`RETURNING`, never `rowcount`. What differs beyond placeholders is
named here and nowhere else:

- `day_expression`: the UTC day ("YYYY-MM-DD") of the epoch-seconds column `time`.
- `hour_expression`: the clock hour (whole hours since the epoch, UTC) of the column `time`.
- `lock_scopes(scopes)`: serialise reservations of the same quota scopes. SQLite needs nothing (every write is
  `BEGIN IMMEDIATE`, one writer at a time for the whole file); PostgreSQL takes a row lock per scope in
  `quota_scopes`, in sorted order (no deadlock between two reservations), held until the transaction ends, so
  two gateways cannot both read "99 used" and both admit the 100th request.

Format: https://www.sqlite.org/lang_upsert.html, https://www.postgresql.org/docs/15/sql-insert.html.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any, Protocol


class SqlConnection(Protocol):
    """One open connection inside the caller's transaction (or in autocommit for a plain read)."""

    dialect: str
    day_expression: str
    hour_expression: str
    now_expression: str
    """SQL for the database's clock in unix seconds (leases expire by it: one clock for every control plane)."""
    batched: bool
    """True when statements are sent in batches (`PostgresBatch`): their rows can still be read after the
    transaction's end."""

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        """Run one statement; its result has `fetchone()` and `fetchall()`."""

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        """Run one statement once per row of parameters."""

    def lock_scopes(self, scopes: Sequence[str]) -> None:
        """Hold the quota scopes `scopes` for this transaction (see the module docstring)."""


class SqliteSql:
    """`SqlConnection` over a `sqlite3.Connection` (its own `execute` and `executemany`, unchanged)."""

    dialect = "sqlite"
    day_expression = "strftime('%Y-%m-%d', time, 'unixepoch')"
    hour_expression = "CAST(time / 3600 AS INTEGER)"
    now_expression = "((julianday('now') - 2440587.5) * 86400.0)"
    """The database's clock in unix seconds (SQLite: the machine's, the one every process on the file shares)."""
    batched = False

    def __init__(self, conn) -> None:
        self.conn = conn
        self.execute = conn.execute
        self.executemany = conn.executemany

    def lock_scopes(self, scopes: Sequence[str]) -> None:
        return None  # BEGIN IMMEDIATE already holds the whole file


_PG_TEXT: dict[str, str] = {}


def postgres_text(sql: str) -> str:
    """`sql` with psycopg's `%s` placeholders instead of `?` (cached: the statements are few and fixed)."""
    text = _PG_TEXT.get(sql)
    if text is None:
        text = _PG_TEXT[sql] = sql.replace("?", "%s")
    return text


_PG_PARTS: dict[str, list[str]] = {}


def postgres_literal(value: Any, standard_strings: bool = True) -> str | None:
    """`value` as a PostgreSQL literal, for the plain types of the store's statements (None, int, finite float, str
    without NUL); None for any other value (the caller lets psycopg render it, or refuse it).

    A string is quoted the SQL-standard way (each ' doubled), which is exact only with
    `standard_conforming_strings` on (PostgreSQL's default since 9.1; `standard_strings` False renders no string).
    A negative integer is put in parentheses, so that no `-` ever follows another; a float is a typed literal
    (`'1.5'::float8`, Python's repr: the same double back). psycopg's `ClientCursor.mogrify`
    renders the same values, at about 110 µs for a 14-value statement here against a few µs.
    Format: https://www.postgresql.org/docs/15/sql-syntax-lexical.html#SQL-SYNTAX-CONSTANTS.
    """
    kind = type(value)
    if value is None:
        return "NULL"
    if kind is int:
        return str(value) if value >= 0 else f"({value})"
    if kind is float:
        if not math.isfinite(value):
            return None
        return f"'{value!r}'::float8"  # typed: a bare 1.5 would be numeric, and exact arithmetic on it too
    if kind is str and standard_strings and "\x00" not in value:
        return "'" + value.replace("'", "''") + "'"
    return None


class PostgresSql:
    """`SqlConnection` over a psycopg 3 connection."""

    dialect = "postgresql"
    day_expression = "to_char(to_timestamp(time) AT TIME ZONE 'UTC', 'YYYY-MM-DD')"
    hour_expression = "CAST(floor(time / 3600) AS BIGINT)"
    now_expression = "CAST(EXTRACT(EPOCH FROM clock_timestamp()) AS DOUBLE PRECISION)"
    """The database server's clock in unix seconds: one clock for every control plane sharing the store."""
    batched = False

    def __init__(self, conn) -> None:
        self.conn = conn

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        return self.conn.execute(postgres_text(sql), params)

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        rows = list(rows)
        if rows:
            with self.conn.cursor() as cursor:
                cursor.executemany(postgres_text(sql), rows)

    def lock_scopes(self, scopes: Sequence[str]) -> None:
        _lock_scopes(self, scopes)


def _lock_scopes(conn: SqlConnection, scopes: Sequence[str]) -> None:
    ordered = sorted(set(scopes))
    if ordered:
        # DO UPDATE (not DO NOTHING) so that an existing row is locked too; rows in sorted order
        conn.execute("INSERT INTO quota_scopes (scope) VALUES " + ", ".join(["(?)"] * len(ordered))
                     + " ON CONFLICT (scope) DO UPDATE SET scope = excluded.scope", ordered)


class Deferred:
    """The rows of one statement of a `PostgresBatch`, there once its batch has been sent (reading them sends it)."""

    __slots__ = ("_batch", "rows")

    def __init__(self, batch: PostgresBatch) -> None:
        self._batch = batch
        self.rows: list[tuple] | None = None

    def fetchone(self) -> tuple | None:
        if self.rows is None:
            self._batch.flush()
        assert self.rows is not None
        return self.rows[0] if self.rows else None

    def fetchall(self) -> list[tuple]:
        if self.rows is None:
            self._batch.flush()
        assert self.rows is not None
        return list(self.rows)


class PostgresBatch:
    """`SqlConnection` over a psycopg 3 connection that sends its statements in batches: one round trip each.

    `execute` binds the parameters on the client (`postgres_literal`; other values by `cursor`, a psycopg
    `ClientCursor` of the connection, whose `mogrify` quotes them) and queues the statement; the queue goes to the server as
    one multi-statement query (the simple query protocol) when a queued statement's rows are read or `flush` is
    called, and each statement's rows are read back in order (`nextset`). Each statement still takes its own
    snapshot (READ COMMITTED), so a read queued after `lock_scopes` sees what the lock's previous holder committed.
    A reservation is two round trips (BEGIN, lock, read; then the writes and COMMIT), a settlement two; with one
    statement per round trip they were six and five, and the client's CPU went into the round trips
    (bench/store_reserve_settle.py, docs/ha.md). An error in any statement raises from the flush that sent it.
    Format: https://www.postgresql.org/docs/15/protocol-flow.html#PROTOCOL-FLOW-MULTI-STATEMENT,
    https://www.psycopg.org/psycopg3/docs/advanced/cursors.html#client-side-binding-cursors.
    """

    dialect = "postgresql"
    day_expression = PostgresSql.day_expression
    hour_expression = PostgresSql.hour_expression
    now_expression = PostgresSql.now_expression
    batched = True

    def __init__(self, cursor) -> None:
        self.cursor = cursor
        self._queued: list[tuple[str, Deferred]] = []
        self._standard_strings = cursor.connection.info.parameter_status("standard_conforming_strings") == "on"

    def _render(self, sql: str, params: Sequence[Any]) -> str:
        """`sql` with each `?` replaced by its parameter's literal (`postgres_literal`, else psycopg's `mogrify`)."""
        parts = _PG_PARTS.get(sql)
        if parts is None:
            parts = _PG_PARTS[sql] = sql.split("?")
        if len(parts) != len(params) + 1:
            return self.cursor.mogrify(postgres_text(sql), params)  # psycopg names the mismatch
        out = [parts[0]]
        for value, part in zip(params, parts[1:]):
            literal = postgres_literal(value, self._standard_strings)
            out.append(self.cursor.mogrify("%s", (value,)) if literal is None else literal)
            out.append(part)
        return "".join(out)

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Deferred:
        text = self._render(sql, params) if params else sql
        result = Deferred(self)
        self._queued.append((text, result))
        return result

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        """Run at once (after what is queued), with server-side binding: for whole tables (`llmgw store copy`)."""
        rows = list(rows)
        if rows:
            self.flush()
            with self.cursor.connection.cursor() as cursor:
                cursor.executemany(postgres_text(sql), rows)

    def lock_scopes(self, scopes: Sequence[str]) -> None:
        _lock_scopes(self, scopes)

    def flush(self) -> None:
        """Send every queued statement in one round trip and keep each one's rows (psycopg errors propagate)."""
        if not self._queued:
            return
        queued, self._queued = self._queued, []
        cursor = self.cursor
        # no parameters: one simple query; never prepared (its literals make every text new)
        cursor.execute("; ".join(text for text, _result in queued), prepare=False)
        for index, (_text, result) in enumerate(queued):
            if index:
                cursor.nextset()
            result.rows = cursor.fetchall() if cursor.description is not None else []
