"""A PostgreSQL schema of a test's own in the machine's test database (LLMGW_TEST_POSTGRES, default
postgresql://127.0.0.1:5432/test, trust authentication, as on every machine here and in CI).

    with postgres_schema() as name:
        url = schema_url(name)        # the database's URL with search_path set to the schema

A PostgreSQL that cannot be reached is an error of the test, never a skip.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator

import psycopg

POSTGRES_URL = os.environ.get("LLMGW_TEST_POSTGRES", "postgresql://127.0.0.1:5432/test")


def schema_url(schema: str, base: str = POSTGRES_URL) -> str:
    """`base` (the test database's URL) with `search_path` set to `schema` (libpq's `options` parameter)."""
    joiner = "&" if "?" in base else "?"
    return f"{base}{joiner}options=-csearch_path%3D{schema}"


@contextlib.contextmanager
def postgres_schema() -> Iterator[str]:
    """A fresh, empty schema in the test database; dropped with everything in it on exit."""
    name = "llmgw_test_" + secrets.token_hex(6)
    with psycopg.connect(POSTGRES_URL, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f"CREATE SCHEMA {name}")
    try:
        yield name
    finally:
        with psycopg.connect(POSTGRES_URL, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f"DROP SCHEMA {name} CASCADE")
