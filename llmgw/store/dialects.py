"""The two SQL dialects of the store behind one small connection interface.

The statements of `keys`, `quotas` and `usage` are written once, in the SQL that SQLite (>= 3.35) and PostgreSQL
(>= 13) both speak (`INSERT ... ON CONFLICT`, `DELETE ... RETURNING`, row values), with `?` placeholders. A
`SqlConnection` runs them on one backend: `SqliteSql` hands them to `sqlite3` as they are; `PostgresSql` turns
`?` into psycopg's `%s` (no statement of ours holds a literal `?` or `%`). "How many rows" is asked with
`RETURNING`, never `rowcount`. What differs beyond placeholders is
named here and nowhere else:

- `day_expression`: the UTC day ("YYYY-MM-DD") of the epoch-seconds column `time`.
- `lock_scopes(scopes)`: serialise reservations of the same quota scopes. SQLite needs nothing (every write is
  `BEGIN IMMEDIATE`, one writer at a time for the whole file); PostgreSQL takes a row lock per scope in
  `quota_scopes`, in sorted order (no deadlock between two reservations), held until the transaction ends, so
  two gateways cannot both read "99 used" and both admit the 100th request.

Format: https://www.sqlite.org/lang_upsert.html, https://www.postgresql.org/docs/15/sql-insert.html.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol


class SqlConnection(Protocol):
    """One open connection inside the caller's transaction (or in autocommit for a plain read)."""

    dialect: str
    day_expression: str

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


class PostgresSql:
    """`SqlConnection` over a psycopg 3 connection."""

    dialect = "postgresql"
    day_expression = "to_char(to_timestamp(time) AT TIME ZONE 'UTC', 'YYYY-MM-DD')"

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
        ordered = sorted(set(scopes))
        if ordered:
            # DO UPDATE (not DO NOTHING) so that an existing row is locked too; rows in sorted order
            self.conn.execute(
                "INSERT INTO quota_scopes (scope) VALUES "
                + ", ".join(["(%s)"] * len(ordered))
                + " ON CONFLICT (scope) DO UPDATE SET scope = excluded.scope",
                ordered,
            )
