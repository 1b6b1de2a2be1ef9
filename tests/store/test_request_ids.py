"""A usage record keeps the client's own x-request-id beside the gateway's unique one (found by either), the
settings commit its replica was started from and the request's trace id; stores written before keep their rows
through the migration (SQLite schema 6, PostgreSQL schema 4)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import psycopg

from llmgw.store import Store, UsageRecord, open_store
from llmgw.store.postgres_schema import SCHEMA_VERSION as PG_SCHEMA_VERSION
from llmgw.store.schema import SCHEMA_VERSION

from .conftest import POSTGRES_URL, schema_url

COMMIT = "3f" * 20
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
# a request recorded by an llmgw before the new columns (the same SQL on both backends)
OLD_ROW = ("INSERT INTO usage (time, project, model, prompt_tokens, completion_tokens, cached_tokens, duration_seconds, "
           "status, cost, request_id) VALUES (1.0, 'chat', 'gemma', 3, 4, 0, 0.5, 200, 0, 'req_old')")


def _record(time: float, client_id: str | None, **fields) -> UsageRecord:
    return UsageRecord("chat", "gemma", time, replica="gemma-0", node="n1", client_request_id=client_id,
                       settings_commit=COMMIT, trace_id=TRACE, **fields)


def test_a_client_id_used_twice_finds_both_requests_newest_first_and_the_gateway_ids_stay_unique(store: Store) -> None:
    assert store.record_usage_once(_record(100.0, "order-17", prompt_tokens=1), "req_" + "a" * 32)
    assert store.record_usage_once(_record(200.0, "order-17", prompt_tokens=2), "req_" + "b" * 32)
    assert not store.record_usage_once(_record(300.0, "order-18"), "req_" + "a" * 32)  # the key stays unique
    found = store.usage_of_client_request("order-17")
    assert [(rid, r.prompt_tokens) for rid, r in found] == [("req_" + "b" * 32, 2), ("req_" + "a" * 32, 1)]
    record = store.usage_of_request("req_" + "a" * 32)
    assert (record.client_request_id, record.settings_commit, record.trace_id) == ("order-17", COMMIT, TRACE)
    assert store.usage_of_client_request("order-18") == []
    assert [r.client_request_id for r in store.recent_usage()] == ["order-17", "order-17"]


def test_a_version_5_sqlite_store_keeps_its_usage_rows_and_gains_the_new_fields(store_path: Path) -> None:
    from llmgw.store.schema import MIGRATIONS

    store_path.parent.mkdir(parents=True)
    raw = sqlite3.connect(store_path, isolation_level=None)
    raw.execute("CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, applied_at REAL NOT NULL)")
    for version, migration in enumerate(MIGRATIONS[:5], start=1):
        raw.executescript(migration)
        raw.execute("INSERT INTO schema_migrations VALUES (?, 0)", (version,))
    raw.execute(OLD_ROW)
    raw.close()
    _check_migrated(open_store(store_path), SCHEMA_VERSION)  # 6 and on


def test_a_version_3_postgres_store_keeps_its_usage_rows_and_gains_the_new_fields(postgres_schema: str) -> None:
    from llmgw.store.postgres_schema import MIGRATIONS

    with psycopg.connect(POSTGRES_URL, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f"SET search_path TO {postgres_schema}")
        conn.execute("CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, applied_at DOUBLE PRECISION "
                     "NOT NULL)")
        for version, migration in enumerate(MIGRATIONS[:3], start=1):
            conn.execute(migration)
            conn.execute("INSERT INTO schema_migrations VALUES (%s, 0)", (version,))
        conn.execute(OLD_ROW)
    _check_migrated(open_store(schema_url(postgres_schema)), PG_SCHEMA_VERSION)  # 4 and on


def _check_migrated(store: Store, version: int) -> None:
    try:
        assert store.schema_version == version
        old = store.usage_of_request("req_old")
        assert (old.prompt_tokens, old.completion_tokens) == (3, 4)
        assert (old.client_request_id, old.settings_commit, old.trace_id) == (None, None, None)
        assert store.record_usage_once(_record(2.0, "mine"), "req_new")
        assert [rid for rid, _ in store.usage_of_client_request("mine")] == ["req_new"]
    finally:
        store.close()
