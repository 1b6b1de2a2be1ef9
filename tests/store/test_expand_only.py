"""Expand in this release, contract in the next (issue 30, `llmgw.store.compat`): the previous release's code reads
and writes a store this tree migrated, on SQLite and PostgreSQL; migrations only expand unless listed as contracts,
and none that the previous release lacks drops what it still uses; a store newer than the code that opens it is
used when its record allows that code, refused naming both versions when not."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

import psycopg
import pytest

from llmgw.errors import StoreError
from llmgw.store import open_store
from llmgw.store import postgres_schema as pg_schema
from llmgw.store import schema as sqlite_schema
from llmgw.store.compat import (
    POSTGRES_CONTRACTS, READABLE_TABLE, SQLITE_CONTRACTS, contract_steps, readable_from,
)
from llmgw.store.records import UsageRecord
from support.postgres import schema_url
from support.previous_release import previous_tree, run_previous

BACKENDS = {"sqlite": (sqlite_schema.MIGRATIONS, SQLITE_CONTRACTS),
            "postgresql": (pg_schema.MIGRATIONS, POSTGRES_CONTRACTS)}

PREVIOUS_USES_THE_STORE = """
import json, os, sys, time
import llmgw
from llmgw.store import open_store
from llmgw.store.records import UsageRecord
from llmgw.store.schema import SCHEMA_VERSION as SQLITE
from llmgw.store.postgres_schema import SCHEMA_VERSION as POSTGRES
url, key = sys.argv[1], sys.argv[2]
assert llmgw.__file__.startswith(os.getcwd()), llmgw.__file__  # the previous release's tree, not this one
store = open_store(url)
theirs = store.authenticate(key)                       # a key this tree made
record, secret = store.create_api_key("old-project", name="old")
store.record_usage(UsageRecord(project="old-project", model="m", time=time.time(), key_id=record.key_id,
                               prompt_tokens=5, completion_tokens=7, status=200, cost=0.5))
rows = store.query_usage("new-project")                 # usage this tree wrote
print(json.dumps({"theirs": theirs.project if theirs else None, "secret": secret, "key_id": record.key_id,
                  "new_usage": [[r.group, r.requests, r.prompt_tokens] for r in rows],
                  "versions": [SQLITE, POSTGRES], "listed": [k.name for k in store.list_api_keys("new-project")]}))
store.close()
"""


@pytest.fixture(scope="module")
def previous(tmp_path_factory) -> Path:
    return previous_tree(tmp_path_factory.mktemp("previous"))


def test_the_lint_finds_every_kind_of_contract_and_passes_an_expansion():
    assert contract_steps("CREATE TABLE t (a TEXT); ALTER TABLE u ADD COLUMN b TEXT; CREATE INDEX i ON u (b);"
                          "ALTER TABLE u ADD COLUMN c INTEGER NOT NULL DEFAULT 1") == []
    found = contract_steps("""
        DROP TABLE admin_tokens;
        ALTER TABLE usage DROP COLUMN node;
        ALTER TABLE t RENAME TO u;
        ALTER TABLE usage RENAME COLUMN node TO host;
        ALTER TABLE usage ALTER COLUMN cost TYPE numeric;
        ALTER TABLE usage ALTER COLUMN node SET NOT NULL;
        ALTER TABLE usage ADD COLUMN region TEXT NOT NULL;
        ALTER TABLE usage ADD CONSTRAINT positive CHECK (cost >= 0);
        DROP INDEX usage_request;
        DELETE FROM usage;
    """)
    assert [f.split(":")[0] for f in found] == [
        "drops a table", "drops a column", "renames", "renames", "changes a column's type",
        "makes a column NOT NULL", "adds a NOT NULL column without a DEFAULT", "adds a constraint", "drops a index",
        "deletes rows"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_migration_only_expands_unless_it_is_a_listed_contract(backend):
    migrations, contracts = BACKENDS[backend]
    for number, sql in enumerate(migrations, start=1):
        steps = contract_steps(sql)
        if number in contracts:
            assert steps, f"{backend} migration {number} is listed as a contract but drops and renames nothing"
            assert contracts[number] <= number
        else:
            assert steps == [], (f"{backend} migration {number} contracts ({steps}); make it expand only and drop "
                                 "in a later release (docs/store.md, Migrations)")


def test_no_migration_since_the_previous_release_drops_what_that_release_uses(previous):
    versions = json.loads(run_previous(previous, "import json; from llmgw.store.schema import SCHEMA_VERSION as a; "
                                       "from llmgw.store.postgres_schema import SCHEMA_VERSION as b; "
                                       "print(json.dumps([a, b]))"))
    for (backend, (migrations, contracts)), before in zip(BACKENDS.items(), versions):
        for number in range(before + 1, len(migrations) + 1):
            assert number not in contracts or contracts[number] <= before, (
                f"{backend} migration {number} is new in this release and removes what the previous release (schema "
                f"{before}) still uses (it needs schema {contracts.get(number)}); contract a release later")
        assert readable_from(len(migrations), contracts) <= before, "the previous release may open this tree's store"


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_previous_release_reads_and_writes_a_store_this_tree_migrated(backend, previous, tmp_path, request):
    url = _url(backend, tmp_path, request)
    store = open_store(url)  # migrated by this tree
    _, key = store.create_api_key("new-project", name="new")
    store.record_usage(UsageRecord(project="new-project", model="gemma", time=time.time(), prompt_tokens=3,
                                   completion_tokens=4, status=200, cost=0.1))
    store.close()
    started = time.monotonic()
    seen = json.loads(run_previous(previous, PREVIOUS_USES_THE_STORE, url, key))
    print(f"the previous release's run: {time.monotonic() - started:.2f} s")
    assert seen["theirs"] == "new-project" and seen["listed"] == ["new"]
    assert seen["new_usage"] == [["gemma", 1, 3]]
    store = open_store(url)  # and this tree reads what the previous release wrote
    try:
        assert store.authenticate(seen["secret"]).key_id == seen["key_id"]
        rows = store.query_usage("old-project")
        assert [(r.group, r.requests, r.prompt_tokens, r.completion_tokens) for r in rows] == [("m", 1, 5, 7)]
    finally:
        store.close()


def _url(backend: str, tmp_path: Path, request) -> str:
    if backend == "sqlite":
        return str(tmp_path / "llmgw.sqlite3")
    return schema_url(request.getfixturevalue("postgres_schema"))


def _bump(backend: str, url: str, version: int, readable: int | None) -> None:
    """Make the store at `url` look migrated by a newer llmgw: schema `version`, readable from `readable`."""
    if backend == "sqlite":
        with sqlite3.connect(url) as raw:
            raw.execute("INSERT INTO schema_migrations (version, applied_at) VALUES (?, 0)", (version,))
            raw.execute(f"UPDATE {READABLE_TABLE} SET readable_from = ?", (readable,))
        raw.close()
        return
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("INSERT INTO schema_migrations VALUES (%s, 0)", (version,))
        conn.execute(f"UPDATE {READABLE_TABLE} SET readable_from = %s", (readable,))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_newer_store_is_used_when_its_record_allows_this_llmgw_and_refused_naming_both_versions_when_not(
        backend, tmp_path, request):
    url = _url(backend, tmp_path, request)
    known = len(BACKENDS[backend][0])
    open_store(url).close()
    _bump(backend, url, known + 1, known)  # an expansion by the next release
    store = open_store(url)
    try:
        assert store.schema_version == known + 1
        _, key = store.create_api_key("p")
        assert store.authenticate(key).project == "p"
    finally:
        store.close()
    _bump(backend, url, known + 2, known + 2)  # a contract of the release after: this llmgw must not use it
    name = "SQLite" if backend == "sqlite" else "PostgreSQL"
    with pytest.raises(StoreError, match=rf"schema version {known + 2}, newer than this llmgw knows \({name} schema "
                                         rf"{known}\); it needs llmgw of {name} schema {known + 2} or newer"):
        open_store(url)
