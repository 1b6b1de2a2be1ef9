"""Copying a whole store into another (`llmgw store copy`), and bringing a store's schema up to date
(`llmgw store migrate`).

A copy moves every table of `sqlstore.TABLES` (secrets, including the engine-key secret without which a gateway
is locked out of every running engine; key/value; tokens of the admin listener; API keys; quota windows, slots and open
reservations; usage with its ids; leases; the Slurm nodes' Linux users with their UIDs; the stored responses of /v1/responses) row for row, in one transaction per table, into a store whose tables
are all empty. Stop the control planes that write the source first: a copy reads each table once, not the whole
store at one instant.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from llmgw.errors import StoreError
from llmgw.store.opening import POSTGRES_SCHEMES, open_store, redacted
from llmgw.store.protocol import Store
from llmgw.store.sqlstore import TABLES

BATCH_ROWS = 5000


def copy_store(source: Store, destination: Store) -> dict[str, int]:
    """Copy every table of `source` into `destination`; returns rows copied per table (in TABLES order).

    Raises StoreError, naming the tables that hold rows, when `destination` is not empty (nothing is copied).
    """
    occupied = [table for table in TABLES if next(iter(destination.table_rows(table)), None) is not None]
    if occupied:
        raise StoreError(f"The store {destination.url} is not empty (rows in {', '.join(occupied)}); copy into a "
                         "new, empty store.")
    counts: dict[str, int] = {}
    for table in TABLES:
        rows = list(source.table_rows(table))
        for start in range(0, len(rows), BATCH_ROWS):
            destination.insert_rows(table, rows[start:start + BATCH_ROWS])
        counts[table] = len(rows)
    return counts


def schema_version_at(url: str | Path) -> int:
    """The schema version of the store at `url` without changing it (0: no store there yet)."""
    text = str(url)
    parts = urlsplit(text)
    if "://" in text and parts.scheme.lower().split("+")[0] in POSTGRES_SCHEMES:
        import psycopg

        from llmgw.store.postgres import PostgresStore
        from llmgw.store.postgres_schema import schema_version

        try:
            with psycopg.connect(text, autocommit=True, connect_timeout=5) as conn:
                return schema_version(conn)
        except psycopg.Error:
            PostgresStore(text, migrate=False)  # raises the sentence naming the redacted URL and the error
            raise
    import sqlite3

    from llmgw.store.schema import schema_version

    path = Path(parts.path if "://" in text else text).expanduser()
    if not path.exists():
        return 0
    conn = sqlite3.connect(path)
    try:
        return schema_version(conn)
    except sqlite3.DatabaseError as exc:
        raise StoreError(f"The store {path} is not a usable SQLite database: {exc}.") from exc
    finally:
        conn.close()


def migrate_store(url: str | Path) -> tuple[int, int]:
    """Apply the missing migrations of the store at `url` (creating it if missing): (version before, after).

    Raises StoreError when the store's schema is newer than this llmgw knows (both versions named).
    """
    before = schema_version_at(url)
    store = open_store(url, migrate=True)
    try:
        return before, store.schema_version
    finally:
        store.close()


__all__ = ["copy_store", "migrate_store", "redacted", "schema_version_at"]
