"""People's accounts in the store, on SQLite and PostgreSQL: only a scrypt hash of the password is kept, a login
needs the right password of an active account, e-mails are one account whatever their case, and a token can belong
to a person with an active account only."""

from __future__ import annotations

import pytest

from llmgw.errors import StoreError, UsageError
from llmgw.store import Store, accounts

from .conftest import rows

NOW = 1_800_000_000.0
PASSWORD = "correct horse battery"


def test_an_account_logs_in_with_its_password_only_and_keeps_no_plaintext(store: Store, monkeypatch) -> None:
    monkeypatch.setattr(accounts, "SCRYPT_N", 2 ** 15)  # the product's cost, not the suite's (tests/conftest.py)
    made = store.add_account("Ada@Lab.example", "Ada Lovelace", PASSWORD, NOW)
    assert (made.email, made.name, made.active) == ("ada@lab.example", "Ada Lovelace", True)
    assert store.check_password("ada@lab.example", PASSWORD) == made
    assert store.check_password("ADA@lab.example ", PASSWORD) == made  # the same person however it is typed
    assert store.check_password("ada@lab.example", PASSWORD + "x") is None
    assert store.check_password("bob@lab.example", PASSWORD) is None
    [(stored,)] = rows(store, "SELECT password FROM accounts")
    assert stored.startswith("scrypt$32768$8$1$") and PASSWORD not in stored
    with pytest.raises(StoreError, match="ada@lab.example has an account already; `llmgw users passwd"):
        store.add_account("ada@lab.example", "Other", PASSWORD, NOW)


def test_a_new_password_replaces_the_old_and_a_disabled_account_cannot_log_in(store: Store) -> None:
    store.add_account("ada@lab.example", "", PASSWORD, NOW)
    assert store.account("ada@lab.example").name == "ada@lab.example"  # no name given: the e-mail
    changed = store.set_password("ada@lab.example", "a much longer passphrase", NOW + 10)
    assert changed.password_changed_at == NOW + 10
    assert store.check_password("ada@lab.example", PASSWORD) is None
    assert store.check_password("ada@lab.example", "a much longer passphrase") is not None
    disabled = store.set_account_disabled("ada@lab.example", True, NOW + 20)
    assert disabled.disabled_at == NOW + 20 and not disabled.active
    assert store.check_password("ada@lab.example", "a much longer passphrase") is None
    assert [a.email for a in store.list_accounts()] == ["ada@lab.example"]
    with pytest.raises(StoreError, match="There is no account 'bob@lab.example'; `llmgw users list`"):
        store.set_password("bob@lab.example", PASSWORD)


@pytest.mark.parametrize("email,password,message", [
    ("not-an-address", PASSWORD, "'not-an-address' is not an e-mail address"),
    ("ada@lab.example", "short", "A password needs at least 12 characters; this one has 5"),
])
def test_a_bad_email_or_short_password_is_refused_with_a_sentence(store: Store, email, password, message) -> None:
    with pytest.raises(UsageError, match=message):
        store.add_account(email, "Ada", password, NOW)
    assert store.list_accounts() == []


def test_a_token_belongs_to_a_person_with_an_active_account(store: Store) -> None:
    store.add_account("ada@lab.example", "Ada", PASSWORD, NOW)
    token, plaintext = store.create_token("admin", owner="Ada@lab.example", now=NOW)
    assert token.owner == "ada@lab.example"
    assert store.find_token(plaintext).owner == "ada@lab.example"
    assert store.token_by_id(token.token_id).owner == "ada@lab.example"
    assert store.create_token("metrics", now=NOW)[0].owner is None  # nobody's, as before
    with pytest.raises(StoreError, match="bob@lab.example has no account"):
        store.create_token("admin", owner="bob@lab.example")
    store.set_account_disabled("ada@lab.example", True, NOW)
    with pytest.raises(StoreError, match="ada@lab.example has a disabled account"):
        store.create_token("admin", owner="ada@lab.example")


def test_a_store_made_before_accounts_keeps_its_tokens_when_migrated(backend, store_url) -> None:
    """SQLite's migration 10 and PostgreSQL's 8 on a store holding a token of the schema before: it still checks,
    belongs to nobody, and accounts can be made beside it."""
    import sqlite3
    from pathlib import Path

    import psycopg

    from llmgw.store import open_store, postgres_schema, schema
    from llmgw.store.keys import digest, new_token

    plaintext = new_token("llmgw-admin-")
    row = ("tok_0123456789ab", "admin", "old", "llmgw-admin-abcd", NOW, None, None, digest(plaintext))
    insert = "INSERT INTO tokens (id, scope, name, prefix, created_at, expires_at, revoked_at, hash) VALUES "
    if backend == "sqlite":
        Path(store_url).parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(store_url, isolation_level=None)
        conn.execute("CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, applied_at REAL NOT NULL)")
        for version, migration in enumerate(schema.MIGRATIONS[:-1], start=1):
            conn.executescript(migration)
            conn.execute("INSERT INTO schema_migrations VALUES (?, 0)", (version,))
        conn.execute(insert + "(?, ?, ?, ?, ?, ?, ?, ?)", row)
        conn.close()
    else:
        with psycopg.connect(store_url, autocommit=True) as conn:
            conn.execute("CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, applied_at DOUBLE PRECISION)")
            for version, migration in enumerate(postgres_schema.MIGRATIONS[:-1], start=1):
                conn.execute(migration)
                conn.execute("INSERT INTO schema_migrations VALUES (%s, 0)", (version,))
            conn.execute(insert + "(%s, %s, %s, %s, %s, %s, %s, %s)", row)
    store = open_store(store_url)
    try:
        assert store.find_token(plaintext).owner is None and store.check_token(plaintext, "admin", NOW + 1)
        store.add_account("ada@lab.example", "Ada", PASSWORD, NOW)
        assert store.create_token("admin", owner="ada@lab.example", now=NOW)[0].owner == "ada@lab.example"
    finally:
        store.close()
