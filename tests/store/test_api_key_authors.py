"""Who made and who revoked an API key (issue 36: "every admin action names them"), on both backends: the e-mail the
admin API passes is kept on the key (`created_by`, `revoked_by`), a second revocation keeps the first revoker, a key
of nobody's token or of `llmgw keys` names nobody, and keys of a store written before llmgw recorded it (SQLite
schema 11, PostgreSQL schema 9) migrate with nobody named, and record the next revoker."""

from __future__ import annotations

from pathlib import Path

from llmgw.store import Store, open_store
from llmgw.store.keys import digest, new_token

from .conftest import postgres_at_version, schema_url, sqlite_at_version

NOW = 1_800_000_000.0


def test_a_key_names_who_made_it_and_who_revoked_it_first(store: Store) -> None:
    made, plaintext = store.create_api_key("chat", "laptop", now=NOW, created_by="ada@lab.example")
    plain, _ = store.create_api_key("chat", now=NOW + 1)
    assert (made.created_by, made.revoked_by) == ("ada@lab.example", None)
    assert (plain.created_by, plain.revoked_by) == (None, None)
    assert store.authenticate(plaintext, NOW + 2) == made

    revoked = store.revoke_api_key(made.key_id, now=NOW + 10, by="ops@lab.example")
    assert (revoked.revoked_at, revoked.created_by, revoked.revoked_by) == (NOW + 10, "ada@lab.example",
                                                                            "ops@lab.example")
    again = store.revoke_api_key(made.key_id, now=NOW + 20, by="ada@lab.example")
    assert (again.revoked_at, again.revoked_by) == (NOW + 10, "ops@lab.example")  # the first time and revoker stay
    assert store.revoke_api_key(plain.key_id, now=NOW + 30).revoked_by is None  # nobody's
    listed = {key.key_id: key for key in store.list_api_keys("chat")}
    assert listed[made.key_id] == again and listed[plain.key_id].revoked_by is None
    rows = {row[0]: row[-2:] for row in store.table_rows("api_keys")}  # what `llmgw store copy` moves
    assert rows == {made.key_id: ("ada@lab.example", "ops@lab.example"), plain.key_id: (None, None)}


def _old_key_checks(store: Store, plaintext: str) -> None:
    (old,) = store.list_api_keys()
    assert (old.project, old.created_at, old.created_by, old.revoked_by) == ("chat", 42.0, None, None)
    assert store.authenticate(plaintext) == old
    assert store.revoke_api_key(old.key_id, by="ops@lab.example").revoked_by == "ops@lab.example"


OLD_KEY = ("INSERT INTO api_keys (id, project, name, prefix, created_at, expires_at, revoked_at, hash) "
           "VALUES ('key_0a0b0c0d', 'chat', NULL, 'sk-llmgw-AbCd', 42.0, NULL, NULL, {mark})")


def test_keys_of_a_version_12_sqlite_store_name_nobody_and_then_their_revoker(store_path: Path) -> None:
    from llmgw.store.schema import SCHEMA_VERSION

    plaintext = new_token("sk-llmgw-")
    sqlite_at_version(store_path, 12, OLD_KEY.format(mark="?"), (digest(plaintext),))
    store = open_store(store_path)
    try:
        assert store.schema_version == SCHEMA_VERSION == 13
        _old_key_checks(store, plaintext)
    finally:
        store.close()


def test_keys_of_a_version_10_postgres_store_name_nobody_and_then_their_revoker(postgres_schema: str) -> None:
    from llmgw.store.postgres_schema import SCHEMA_VERSION

    plaintext = new_token("sk-llmgw-")
    postgres_at_version(postgres_schema, 10, OLD_KEY.format(mark="%s"), (digest(plaintext),))
    store = open_store(schema_url(postgres_schema))
    try:
        assert store.schema_version == SCHEMA_VERSION == 11
        _old_key_checks(store, plaintext)
    finally:
        store.close()
