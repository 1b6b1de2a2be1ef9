"""Opening a store: paths and URLs, WAL mode, migrations, refusals with readable messages."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from llmgw.errors import StoreError
from llmgw.store import SCHEMA_VERSION, Store, open_store, store_url_for_state


def test_a_plain_path_creates_the_file_and_its_directory_in_wal_mode(store_path: Path) -> None:
    store = open_store(store_path)
    try:
        assert isinstance(store, Store)
        assert store_path.exists()
        raw = sqlite3.connect(store_path)
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert raw.execute("SELECT max(version) FROM schema_migrations").fetchone()[0] == SCHEMA_VERSION
        raw.close()
        assert store._conn.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
        assert store._conn.execute("PRAGMA busy_timeout").fetchone()[0] == 5000
    finally:
        store.close()


def test_a_sqlite_url_with_three_or_four_slashes_opens_the_absolute_path(tmp_path: Path) -> None:
    for url in (f"sqlite://{tmp_path}/a.sqlite3", f"sqlite:///{tmp_path}/a.sqlite3"):
        store = open_store(url)
        store.put("seen", url)
        store.close()
    again = open_store(tmp_path / "a.sqlite3")
    assert again.get("seen") == f"sqlite:///{tmp_path}/a.sqlite3"
    again.close()


def test_the_state_directory_holds_llmgw_sqlite3(tmp_path: Path) -> None:
    assert store_url_for_state(tmp_path) == str(tmp_path / "llmgw.sqlite3")


def test_reopening_keeps_data_and_applies_no_migration_twice(store_path: Path) -> None:
    first = open_store(store_path)
    secret = first.get_or_create_secret("engine-key")
    first.close()
    second = open_store(store_path)
    assert second.get_or_create_secret("engine-key") == secret
    assert second._conn.execute("SELECT count(*) FROM schema_migrations").fetchone()[0] == SCHEMA_VERSION
    second.close()


def test_an_unknown_scheme_or_an_empty_path_is_refused() -> None:
    with pytest.raises(StoreError, match="Unknown store URL scheme"):
        open_store("mysql://db/x")
    with pytest.raises(StoreError, match="no file path"):
        open_store("sqlite://")


def test_a_file_that_is_not_a_database_is_refused_and_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_bytes(b"these are not the tables you are looking for" * 100)
    with pytest.raises(StoreError, match="not a usable SQLite database"):
        open_store(path)
    assert path.read_bytes().startswith(b"these are not")


def test_a_store_with_a_newer_schema_is_refused(store_path: Path) -> None:
    """(One whose record says this llmgw may not use it: tests/store/test_expand_only.py has the one it may.)"""
    open_store(store_path).close()
    raw = sqlite3.connect(store_path)
    raw.execute("INSERT INTO schema_migrations (version, applied_at) VALUES (?, 0)", (SCHEMA_VERSION + 1,))
    raw.execute("UPDATE schema_readable SET readable_from = ?", (SCHEMA_VERSION + 1,))
    raw.commit()
    raw.close()
    with pytest.raises(StoreError, match="newer than this llmgw knows"):
        open_store(store_path)


def test_secrets_are_random_stable_and_sized(store: Store) -> None:
    first = store.get_or_create_secret("engine-key")
    assert len(first) == 32
    assert store.get_or_create_secret("engine-key") == first
    other = store.get_or_create_secret("webhook", nbytes=48)
    assert len(other) == 48 and other[:32] != first


def test_key_value_entries_are_replaced_by_a_later_put(store: Store) -> None:
    assert store.get("missing") is None
    store.put("route-table", "v1")
    store.put("route-table", "v2")
    assert store.get("route-table") == "v2"


def test_admin_tokens_are_checked_by_hash(store: Store, store_path: Path, backend: str) -> None:
    token = store.create_admin_token()
    assert token.startswith("llmgw-admin-")
    assert store.check_admin_token(token)
    assert not store.check_admin_token(token[:-1] + ("A" if token[-1] != "A" else "B"))
    assert not store.check_admin_token("")
    assert not store.check_admin_token("sk-llmgw-" + token[len("llmgw-admin-"):])
    if backend == "sqlite":
        store.close()
        assert token.encode() not in b"".join(p.read_bytes() for p in store_path.parent.iterdir())


def test_a_version_1_store_keeps_its_open_reservations_through_the_upgrade(store_path: Path) -> None:
    import json

    from llmgw.routes import Quota
    from llmgw.store import Reservation
    from llmgw.store.schema import MIGRATIONS

    store_path.parent.mkdir(parents=True)
    raw = sqlite3.connect(store_path, isolation_level=None)
    raw.executescript(MIGRATIONS[0])
    raw.execute("CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, applied_at REAL NOT NULL)")
    raw.execute("INSERT INTO schema_migrations VALUES (1, 0)")
    start = 60.0 * 1000
    charges = json.dumps([["project:p", "minute", start, 100, 0.0]])
    raw.execute("INSERT INTO quota_windows VALUES ('project:p', 'minute', ?, 2, 150, 0.0)", (start,))
    raw.execute("INSERT INTO quota_reservations VALUES ('res_open', ?, 'open', 100, 0.0, ?)", (start, charges))
    raw.execute("INSERT INTO quota_reservations VALUES ('res_done', ?, 'settled', 50, 0.0, ?)", (start, charges))
    raw.close()

    store = open_store(store_path)
    try:
        assert store._conn.execute("SELECT id FROM quota_reservations").fetchall() == [("res_open",)]
        scopes = (("project:p", Quota(tokens_per_minute=1000)),)
        held = Reservation("res_open", ("project:p",), 100, 0.0, start)
        assert store.settle(held, 10, 0.0, start + 1) is True
        assert store.settle(held, 10, 0.0, start + 1) is False  # settling stays idempotent
        assert store.headroom(scopes, start + 1).tokens.remaining == 1000 - 60
    finally:
        store.close()


def test_checkpoints_run_in_the_background_and_stop_with_the_store(store_path: Path) -> None:
    import threading
    import time

    from llmgw.store import SqliteStore, UsageRecord

    store = SqliteStore(store_path, checkpoint_interval=0.05)
    assert store._conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0  # no checkpoint inside a commit
    for n in range(2000):
        store.record_usage(UsageRecord(project="p", model="m", time=float(n), key_id="key_1", replica="m-1",
                                       node="node-a", prompt_tokens=n, completion_tokens=n))
    deadline = time.monotonic() + 5
    while store_path.stat().st_size < 100_000 and time.monotonic() < deadline:
        time.sleep(0.05)
    # with automatic checkpoints off, only the background thread can have moved the rows into the database file
    assert store_path.stat().st_size >= 100_000
    checkpointer = next(t for t in threading.enumerate() if t is store._checkpointer)
    store.close()
    assert not checkpointer.is_alive()  # this store's thread (stores of other tests may still run theirs)
