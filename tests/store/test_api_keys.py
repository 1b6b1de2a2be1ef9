"""API keys: shown once, kept only as SHA-256 hashes, looked up by hash, refused with a reason."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

from llmgw.errors import StoreError
from llmgw.store import KEY_EXPIRED, KEY_MALFORMED, KEY_REVOKED, KEY_UNKNOWN, SqliteStore, Store, open_store

NOW = 1_800_000_000.0


def test_a_new_key_is_sk_llmgw_and_32_random_bytes_with_a_short_printable_id(store: Store) -> None:
    record, plaintext = store.create_api_key("chat", name="alice", now=NOW)
    assert re.fullmatch(r"sk-llmgw-[A-Za-z0-9_-]{43}", plaintext)
    assert re.fullmatch(r"key_[0-9a-f]{8}", record.key_id)
    assert record.project == "chat" and record.name == "alice" and record.created_at == NOW
    assert plaintext.startswith(record.prefix) and len(record.prefix) == len("sk-llmgw-") + 4
    _other, second = store.create_api_key("chat", now=NOW)
    assert second != plaintext


def test_the_key_authenticates_to_its_record(store: Store) -> None:
    record, plaintext = store.create_api_key("chat", now=NOW)
    assert store.authenticate(plaintext, NOW + 1) == record


@pytest.mark.parametrize("presented, reason", [
    ("", KEY_MALFORMED),
    ("Bearer nope", KEY_MALFORMED),
    ("sk-llmgw-short", KEY_MALFORMED),
    ("sk-llmgw-" + "é" * 43, KEY_MALFORMED),
    ("sk-llmgw-" + "A" * 43, KEY_UNKNOWN),
])
def test_a_malformed_or_unknown_key_is_refused_with_its_reason(store: Store, presented: str,
                                                               reason: str) -> None:
    store.create_api_key("chat", now=NOW)
    check = store.check_api_key(presented, NOW)
    assert check.key is None and check.reason == reason
    assert "llmgw keys create" in check.message
    assert store.authenticate(presented, NOW) is None


def test_a_revoked_key_is_refused_from_the_moment_it_is_revoked(store: Store) -> None:
    record, plaintext = store.create_api_key("chat", now=NOW)
    revoked = store.revoke_api_key(record.key_id, now=NOW + 10)
    assert revoked.revoked_at == NOW + 10
    assert store.revoke_api_key(record.key_id, now=NOW + 20).revoked_at == NOW + 10  # idempotent
    check = store.check_api_key(plaintext, NOW + 11)
    assert check.key is None and check.reason == KEY_REVOKED and "revoked" in check.message


def test_an_expired_key_is_refused_at_its_expiry_time(store: Store) -> None:
    _record, plaintext = store.create_api_key("chat", expires_at=NOW + 60, now=NOW)
    assert store.authenticate(plaintext, NOW + 59.9) is not None
    check = store.check_api_key(plaintext, NOW + 60)
    assert check.key is None and check.reason == KEY_EXPIRED


def test_revoking_an_unknown_id_says_where_to_find_ids(store: Store) -> None:
    with pytest.raises(StoreError, match="llmgw keys list"):
        store.revoke_api_key("key_00000000")


def test_keys_are_listed_per_project_oldest_first(store: Store) -> None:
    a, _ = store.create_api_key("chat", now=NOW)
    b, _ = store.create_api_key("search", now=NOW + 1)
    c, _ = store.create_api_key("chat", now=NOW + 2)
    assert [k.key_id for k in store.list_api_keys()] == [a.key_id, b.key_id, c.key_id]
    assert [k.key_id for k in store.list_api_keys("chat")] == [a.key_id, c.key_id]
    assert store.list_api_keys("nobody") == []


def test_the_plaintext_key_never_reaches_sqlite_nor_the_file(sqlite_store: SqliteStore, store_path: Path) -> None:
    store = sqlite_store
    statements: list[str] = []
    store._conn.set_trace_callback(statements.append)  # Python passes SQL with bound values expanded
    _record, plaintext = store.create_api_key("chat", now=NOW)
    assert store.authenticate(plaintext, NOW) is not None
    assert store.check_api_key(plaintext[:-1] + "x", NOW).key is None
    store._conn.set_trace_callback(None)
    assert statements, "the trace callback saw no statement"
    assert any("api_keys" in s for s in statements)
    secret_part = plaintext[len("sk-llmgw-"):]
    assert not [s for s in statements if secret_part[:16] in s]
    # The digest is bound as a BLOB parameter, never formatted into the SQL text by llmgw.
    digest_hex = hashlib.sha256(plaintext.encode()).hexdigest().upper()
    assert any(digest_hex in s.upper() for s in statements), "expected to see the bound digest in the trace"
    store.close()
    files = b"".join(p.read_bytes() for p in store_path.parent.iterdir() if p.is_file())
    assert secret_part.encode() not in files
    assert hashlib.sha256(plaintext.encode()).digest() in files


def test_a_key_made_by_one_process_authenticates_in_another_open_store(store_url: str) -> None:
    writer = open_store(store_url)
    reader = open_store(store_url)
    try:
        _record, plaintext = writer.create_api_key("chat", now=NOW)
        assert reader.authenticate(plaintext, NOW) is not None
        key_id = reader.list_api_keys()[0].key_id
        writer.revoke_api_key(key_id, now=NOW)
        assert reader.authenticate(plaintext, NOW) is None
    finally:
        writer.close()
        reader.close()
