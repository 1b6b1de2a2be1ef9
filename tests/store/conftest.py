"""Fixtures of the store tests: every `store` test runs on both backends, a SQLite file in a temporary directory
and a PostgreSQL schema of its own (created and dropped by the test) in the database of LLMGW_TEST_POSTGRES
(default postgresql://127.0.0.1:5432/test, trust authentication, as on every machine here and in CI).

A PostgreSQL that cannot be reached is an error of every postgresql test, never a skip.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import support.postgres
from llmgw.store import SqliteStore, Store, open_store
from support.postgres import POSTGRES_URL, schema_url  # noqa: F401 - the store tests import them from here

BACKENDS = ("sqlite", "postgresql")


@pytest.fixture
def postgres_schema() -> Iterator[str]:
    """A fresh, empty schema in the test database; dropped with everything in it when the test ends."""
    with support.postgres.postgres_schema() as name:
        yield name


@pytest.fixture
def store_path(tmp_path: Path) -> Path:
    return tmp_path / "state" / "llmgw.sqlite3"


@pytest.fixture(params=BACKENDS)
def backend(request) -> str:
    return request.param


@pytest.fixture
def store_url(backend: str, store_path: Path, request) -> str:
    """Where a test's store lives, on the backend of this run: a SQLite path or a PostgreSQL URL."""
    if backend == "sqlite":
        return str(store_path)
    return schema_url(request.getfixturevalue("postgres_schema"))


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    opened = open_store(store_url)
    yield opened
    opened.close()


@pytest.fixture
def sqlite_store(store_path: Path) -> Iterator[SqliteStore]:
    """A SQLite store, for what only SQLite has (its file, its connection)."""
    opened = open_store(store_path)
    assert isinstance(opened, SqliteStore)
    yield opened
    opened.close()


def rows(store: Store, sql: str, params: tuple = ()) -> list[tuple]:
    """The rows of one query (written with `?` placeholders) on either backend."""
    with store._read() as conn:  # type: ignore[attr-defined]
        return [tuple(row) for row in conn.execute(sql, params).fetchall()]


def sqlite_at_version(path: Path, version: int, sql: str = "", params: tuple = ()) -> None:
    """A SQLite store file at `path` written by an older llmgw: its first `version` migrations applied and recorded,
    then `sql` (one statement, `?` placeholders) run with `params`, e.g. a row of that time."""
    import sqlite3

    from llmgw.store.schema import MIGRATIONS

    path.parent.mkdir(parents=True, exist_ok=True)
    raw = sqlite3.connect(path, isolation_level=None)
    try:
        raw.execute("CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, applied_at REAL NOT NULL)")
        for number, migration in enumerate(MIGRATIONS[:version], start=1):
            raw.executescript(migration)
            raw.execute("INSERT INTO schema_migrations VALUES (?, 0)", (number,))
        if sql:
            raw.execute(sql, params)
    finally:
        raw.close()


def postgres_at_version(schema: str, version: int, sql: str = "", params: tuple = ()) -> None:
    """`sqlite_at_version` for the PostgreSQL schema `schema` of the test database (`sql` with `%s` placeholders)."""
    import psycopg

    from llmgw.store.postgres_schema import MIGRATIONS

    with psycopg.connect(POSTGRES_URL, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f"SET search_path TO {schema}")
        conn.execute("CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, applied_at DOUBLE PRECISION NOT NULL)")
        for number, migration in enumerate(MIGRATIONS[:version], start=1):
            conn.execute(migration)
            conn.execute("INSERT INTO schema_migrations VALUES (%s, 0)", (number,))
        if sql:
            conn.execute(sql, params)
