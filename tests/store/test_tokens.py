"""Tokens of the admin listener: one kind with a scope each, kept as hashes, on both backends; the admin tokens of
an older store become tokens of scope admin."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.errors import StoreError, UsageError
from llmgw.store import TOKEN_SCOPES, Store, open_store
from llmgw.store.keys import digest, new_token
from llmgw.store.postgres_schema import SCHEMA_VERSION as PG_SCHEMA_VERSION
from llmgw.store.schema import SCHEMA_VERSION

from .conftest import postgres_at_version, schema_url, sqlite_at_version


def test_a_token_passes_its_own_scope_and_an_admin_token_passes_every_scope(store: Store) -> None:
    made = {scope: store.create_token(scope, name=f"for {scope}") for scope in TOKEN_SCOPES}
    for scope, (record, plaintext) in made.items():
        assert plaintext.startswith(f"llmgw-{scope}-") and record.scope == scope
        assert record.prefix == plaintext[: len(f"llmgw-{scope}-") + 4]
        for wanted in TOKEN_SCOPES:
            assert store.check_token(plaintext, wanted) is (wanted == scope or scope == "admin"), (scope, wanted)


def test_a_token_is_stored_only_as_its_digest(store: Store) -> None:
    record, plaintext = store.create_token("review")
    rows = list(store.table_rows("tokens"))
    assert rows == [(record.token_id, "review", None, record.prefix, record.created_at, None, None, digest(plaintext),
                     None)]
    assert all(plaintext not in str(value) for value in rows[0][:-1])


def test_malformed_unknown_and_cross_scope_tokens_are_refused(store: Store) -> None:
    _record, plaintext = store.create_token("metrics")
    assert not store.check_token("", "metrics")
    assert not store.check_token(plaintext[:-1], "metrics")
    assert not store.check_token(new_token("llmgw-metrics-"), "metrics")  # well formed, never issued
    assert not store.check_token("llmgw-metrics-" + "é" * 43, "metrics")
    assert not store.check_token(plaintext, "console")
    # the prefix is only a label: a metrics token renamed "admin" is still unknown
    assert not store.check_token("llmgw-admin-" + plaintext[len("llmgw-metrics-"):], "admin")


def test_an_unknown_scope_is_a_usage_error_naming_the_scopes(store: Store) -> None:
    with pytest.raises(UsageError, match="admin, metrics, review, console"):
        store.create_token("root")
    with pytest.raises(UsageError, match="no token scope 'root'"):
        store.check_token("llmgw-admin-x", "root")


def test_a_revoked_or_expired_token_is_refused_and_listed_with_its_state(store: Store) -> None:
    revoked, revoked_text = store.create_token("console", now=100.0)
    expiring, expiring_text = store.create_token("review", expires_at=200.0, now=101.0)
    assert store.check_token(expiring_text, "review", now=150.0)
    assert not store.check_token(expiring_text, "review", now=200.0)
    assert store.check_token(revoked_text, "console", now=150.0)
    first = store.revoke_token(revoked.token_id, now=160.0)
    assert store.revoke_token(revoked.token_id, now=170.0).revoked_at == first.revoked_at == 160.0
    assert not store.check_token(revoked_text, "console", now=161.0)
    listed = store.list_tokens()
    assert [t.token_id for t in listed] == [revoked.token_id, expiring.token_id]
    assert [t.state(180.0) for t in listed] == ["revoked", "active"]
    assert [t.token_id for t in store.list_tokens("review")] == [expiring.token_id]
    with pytest.raises(StoreError, match="llmgw token list"):
        store.revoke_token("tok_nothere")


def test_admin_tokens_of_a_version_3_sqlite_store_become_tokens_of_scope_admin(store_path: Path) -> None:
    old = new_token("llmgw-admin-")
    sqlite_at_version(store_path, 3, "INSERT INTO admin_tokens VALUES (?, 42.0)", (digest(old),))

    store = open_store(store_path)
    try:
        assert store.schema_version == SCHEMA_VERSION  # every later migration applied too
        assert store.check_token(old, "admin") and store.check_token(old, "review")
        (migrated,) = store.list_tokens()
        assert (migrated.scope, migrated.created_at, migrated.prefix) == ("admin", 42.0, "llmgw-admin-")
        assert migrated.token_id == "tok_" + digest(old)[:6].hex()
        store.revoke_token(migrated.token_id)
        assert not store.check_admin_token(old)
    finally:
        store.close()


def test_admin_tokens_of_a_version_1_postgres_store_become_tokens_of_scope_admin(postgres_schema: str) -> None:
    old = new_token("llmgw-admin-")
    postgres_at_version(postgres_schema, 1, "INSERT INTO admin_tokens VALUES (%s, 42.0)", (digest(old),))

    store = open_store(schema_url(postgres_schema))
    try:
        assert store.schema_version == PG_SCHEMA_VERSION
        assert store.check_token(old, "admin") and store.check_admin_token(old)
        (migrated,) = store.list_tokens()
        assert (migrated.scope, migrated.created_at) == ("admin", 42.0)
        assert migrated.token_id == "tok_" + digest(old)[:6].hex()
    finally:
        store.close()
