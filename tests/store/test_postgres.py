"""What only the PostgreSQL store has: URLs with passwords that are never shown, a database that is not there,
its own migrations, and two stores (two control planes) on one database."""

from __future__ import annotations

import threading

import psycopg
import pytest
from click.testing import CliRunner

from llmgw.cli import store_cmds
from llmgw.errors import StoreError
from llmgw.routes import Quota
from llmgw.store import Reservation, open_store, open_store_from_settings, redacted, store_url_from_settings
from llmgw.store.postgres import redact_url
from llmgw.store.postgres_schema import SCHEMA_VERSION

from .conftest import POSTGRES_URL, schema_url

SECRET = "pa55-w0rd-never-shown"
NOW = 1_800_000_000.0


@pytest.mark.parametrize(("url", "shown"), [
    (f"postgresql://llmgw:{SECRET}@db.example:5432/llmgw", "postgresql://llmgw:***@db.example:5432/llmgw"),
    (f"postgresql://db.example/llmgw?user=llmgw&password={SECRET}&sslmode=require",
     "postgresql://db.example/llmgw?user=llmgw&password=***&sslmode=require"),
    ("postgresql://llmgw@db.example/llmgw", "postgresql://llmgw@db.example/llmgw"),
    # a password holding "@" (written unquoted): the host is after the last "@", all before it up to ":" hidden
    ("postgresql://llmgw:p@ss@word@db.example:5432/llmgw", "postgresql://llmgw:***@db.example:5432/llmgw"),
    ("postgresql://llmgw:@@db.example/llmgw", "postgresql://llmgw:***@db.example/llmgw"),
    (f"postgresql://llmgw:{SECRET}%40x@db.example/llmgw", "postgresql://llmgw:***@db.example/llmgw"),
])
def test_a_password_in_a_url_is_shown_as_stars(url: str, shown: str) -> None:
    assert redact_url(url) == shown
    assert redacted(url) == shown


def test_an_unreachable_database_is_a_sentence_naming_the_url_without_its_password_and_the_error() -> None:
    with pytest.raises(StoreError) as refused:
        open_store(f"postgresql://llmgw:{SECRET}@127.0.0.1:1/test")
    message = str(refused.value)
    assert SECRET not in message and "\n" not in message
    assert message.startswith("Cannot open the store postgresql://llmgw:***@127.0.0.1:1/test (")
    assert "Connection refused" in message


def test_a_password_is_never_echoed_even_when_the_server_quotes_it() -> None:
    password = SECRET.replace("-", "_")  # also the database's name, which the server's refusal quotes
    with pytest.raises(StoreError) as refused:
        open_store(f"postgresql://127.0.0.1:5432/{password}?password={password}")
    message = str(refused.value)
    assert message.count(password) == 1  # the database name in the URL; neither the password nor the quote
    assert "?password=*** (" in message and 'database "***" does not exist' in message


def test_the_cli_never_prints_the_password_of_a_store_url() -> None:
    import click

    @click.group()
    def group() -> None:
        """Stand-in."""

    store_cmds.register(group)
    result = CliRunner().invoke(group, ["store", "migrate", "--store", f"postgresql://u:{SECRET}@127.0.0.1:1/x"])
    assert result.exit_code != 0 and SECRET not in result.output + str(result.exception)


def test_migrations_are_applied_once_and_recorded(postgres_schema: str) -> None:
    url = schema_url(postgres_schema)
    for _ in range(2):
        store = open_store(url)
        assert store.schema_version == SCHEMA_VERSION
        store.close()
    with psycopg.connect(url) as conn:
        versions = conn.execute("SELECT version FROM schema_migrations ORDER BY version").fetchall()
    assert [v for (v,) in versions] == list(range(1, SCHEMA_VERSION + 1))


def test_a_database_with_a_newer_schema_is_refused_naming_both_versions(postgres_schema: str) -> None:
    url = schema_url(postgres_schema)
    open_store(url).close()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("INSERT INTO schema_migrations VALUES (%s, 0)", (SCHEMA_VERSION + 4,))
        conn.execute("UPDATE schema_readable SET readable_from = %s", (SCHEMA_VERSION + 4,))
    with pytest.raises(StoreError, match=f"schema version {SCHEMA_VERSION + 4}, newer than this llmgw knows "
                                         rf"\(PostgreSQL schema {SCHEMA_VERSION}\)"):
        open_store(url)


def test_an_older_schema_is_refused_without_migrate_and_brought_up_to_date_by_store_migrate(
        postgres_schema: str) -> None:
    url = schema_url(postgres_schema)
    with pytest.raises(StoreError, match="older than this llmgw's .*llmgw store migrate"):
        open_store(url, migrate=False)
    import click

    @click.group()
    def group() -> None:
        """Stand-in."""

    store_cmds.register(group)
    result = CliRunner().invoke(group, ["store", "migrate", "--store", url], catch_exceptions=False)
    assert result.exit_code == 0 and f"from schema version 0 to {SCHEMA_VERSION}" in result.output
    open_store(url, migrate=False).close()


def test_several_control_planes_starting_at_once_migrate_the_database_once(postgres_schema: str) -> None:
    url = schema_url(postgres_schema)
    errors: list[BaseException] = []

    def start() -> None:
        try:
            open_store(url).close()
        except BaseException as exc:  # collected, re-raised by the assert
            errors.append(exc)

    threads = [threading.Thread(target=start) for _ in range(6)]
    [t.start() for t in threads]
    [t.join(60) for t in threads]
    assert not errors, errors


def test_two_stores_on_one_database_share_one_concurrency_limit(postgres_schema: str) -> None:
    url = schema_url(postgres_schema)
    first, second = open_store(url), open_store(url)
    try:
        scopes = [("project:chat", Quota(concurrent_requests=3))]
        taken = [s.reserve(scopes, 1, 0.0, NOW) for s in (first, second, first, second, first)]
        assert [isinstance(t, Reservation) for t in taken] == [True, True, True, False, False]
        assert second.release(taken[0], NOW)  # a reservation made through one is closed through the other
        assert isinstance(second.reserve(scopes, 1, 0.0, NOW), Reservation)
    finally:
        first.close()
        second.close()


def test_the_store_named_by_llmgw_yaml_opens_with_its_password_from_a_named_secret(tmp_path,
                                                                                postgres_schema: str) -> None:
    from types import SimpleNamespace

    sqlite = SimpleNamespace(kind="sqlite", path="llmgw.sqlite3", url=None)
    assert store_url_from_settings(sqlite, tmp_path) == str(tmp_path / "llmgw.sqlite3")
    by_parts = SimpleNamespace(kind="postgresql", host="db.example", port=5433, database="llmgw", user="gw",
                               password_secret="store-password")
    built = store_url_from_settings(by_parts, tmp_path, {"store-password": "p@ss/word"}.get)
    assert built == "postgresql://gw:p%40ss%2Fword@db.example:5433/llmgw"
    with pytest.raises(StoreError, match="names the secret 'store-password'"):
        store_url_from_settings(by_parts, tmp_path, {}.get)
    by_url = SimpleNamespace(kind="postgresql", url=schema_url(postgres_schema), path="llmgw.sqlite3")
    store = open_store_from_settings(by_url, tmp_path, {}.get)
    try:
        assert store.dialect == "postgresql" and POSTGRES_URL.split("?")[0] in store.url
    finally:
        store.close()
    override = open_store_from_settings(by_url, tmp_path, override_url=tmp_path / "other.sqlite3")
    assert override.dialect == "sqlite"
    override.close()


def test_keys_made_by_the_cli_in_postgresql_authenticate_and_usage_is_summed_there(postgres_schema: str) -> None:
    import json

    import click

    from llmgw.cli import keys_cmds
    from llmgw.store import UsageRecord

    @click.group()
    def group() -> None:
        """Stand-in."""

    keys_cmds.register(group)
    url = schema_url(postgres_schema)
    created = CliRunner().invoke(group, ["keys", "create", "--store", url, "--project", "chat", "--json"],
                                 catch_exceptions=False)
    assert created.exit_code == 0, created.output
    plaintext = json.loads(created.stdout)["key"]
    store = open_store(url)
    try:
        assert store.authenticate(plaintext).project == "chat"
        store.record_usage(UsageRecord("chat", "gemma", NOW, prompt_tokens=3, completion_tokens=4, status=500))
    finally:
        store.close()
    usage = CliRunner().invoke(group, ["usage", "--store", url, "--by", "day", "--json"], catch_exceptions=False)
    rows = json.loads(usage.stdout)["rows"]
    assert [(r["group"], r["requests"], r["errors"], r["prompt_tokens"]) for r in rows] == [("2027-01-15", 1, 1, 3)]


AWKWARD = ["", "plain", "it's", "''", "back\\slash\\", "\\'", "a?b%s%%c", "-- not a comment", "/* nor this */",
           "$$dollar$$", "naïve ☃ 𝄞", "line\nbreak\ttab", 0, 7, -7, 2**62, -(2**62), 0.0, -0.0, 1.5, -2.25, 1e-05,
           1.7976931348623157e308, 1733030400.1234567, None]


@pytest.mark.parametrize("value", AWKWARD, ids=repr)
def test_a_value_bound_on_the_client_reads_back_from_postgresql_unchanged(value) -> None:
    from llmgw.store.dialects import PostgresBatch

    with psycopg.connect(POSTGRES_URL, autocommit=True, connect_timeout=5) as conn:
        batch = PostgresBatch(psycopg.ClientCursor(conn))
        kind = {str: "text", int: "bigint", float: "double precision"}.get(type(value), "text")
        # subtraction of the value: a negative one must not turn "- -7" into a "--" comment
        first = batch.execute(f"SELECT CAST(? AS {kind})", (value,))
        second = batch.execute("SELECT 1 - ?" if isinstance(value, (int, float)) else "SELECT 1", (value,)
                               if isinstance(value, (int, float)) else ())
        assert first.fetchone() == (value,)
        if isinstance(value, (int, float)):
            assert second.fetchone() == (1 - value,)


def test_a_statement_of_a_batch_that_fails_rolls_its_whole_transaction_back(postgres_schema) -> None:
    store = open_store(schema_url(postgres_schema))
    try:
        with pytest.raises(StoreError), store._write() as conn:
            conn.execute("INSERT INTO kv (key, value, updated_at) VALUES (?, ?, ?)", ("k", "v", NOW))
            conn.execute("INSERT INTO kv (key, value, updated_at) VALUES (?, ?, ?)", ("k", "again", NOW))
        assert store.get("k") is None
        store.put("k", "v")  # the pooled connection is usable again
        assert store.get("k") == "v"
    finally:
        store.close()
