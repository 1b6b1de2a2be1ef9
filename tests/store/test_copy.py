"""`llmgw store copy`: every table of a SQLite store lands in PostgreSQL, the engine-key secret included."""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from llmgw.cli import store_cmds
from llmgw.errors import StoreError
from llmgw.routes import Quota
from llmgw.store import (
    BatchLine, BatchRecord, BenchRecord, FileRecord, Reservation, StoredResponse, UsageRecord, open_store,
)
from llmgw.store.sqlstore import TABLES

from .conftest import schema_url

NOW = 1_800_000_000.0


def fill(store) -> dict:
    """Rows in every table; returns what the test checks afterwards."""
    secret = store.get_or_create_secret("engine-key")
    store.put("route-table", "v7")
    admin = store.create_admin_token()
    key, plaintext = store.create_api_key("chat", name="ci", expires_at=NOW + 86400, now=NOW)
    revoked, _ = store.create_api_key("chat", now=NOW)
    store.revoke_api_key(revoked.key_id, NOW + 5)
    scopes = [("project:chat", Quota(concurrent_requests=4, tokens_per_minute=1000, budget=10.0))]
    settled = store.reserve(scopes, 100, 0.5, NOW)
    store.settle(settled, 40, 0.2, NOW + 1, usage=UsageRecord(
        "chat", "gemma", NOW + 1, key_id=key.key_id, prompt_tokens=30, completion_tokens=10, cost=0.2,
        client_request_id="client-7", settings_commit="c0ffee" * 6 + "c0ff", trace_id="ab" * 16))
    held = store.reserve(scopes, 200, 1.0, NOW + 2)
    for i in range(3):
        store.record_usage(UsageRecord("chat", "gemma", NOW + 3 + i, prompt_tokens=i, ttft_seconds=0.25))
    store.acquire_lease("llmgw-reconciler", "cp-1", 30.0, NOW)
    store.assign_slurm_users([("ada@lab.example", ("ada",)), ("bob@lab.example", ("bob",))], 200000, NOW)
    store.save_response(StoredResponse("resp_" + "0" * 32, "chat", NOW, NOW + 86400, "gemma",
                                       [{"role": "user", "content": "hi"}], {"id": "resp_" + "0" * 32}))
    store.record_bench(BenchRecord(NOW, "gemma-0", "gemma", "n1", "cpu 16 cores", "b11434", "engine", 128, 64, 2, 8,
                                   0.05, 0.07, 0.01, 210.5, {"requests": 8}))
    store.save_file(FileRecord("file-" + "0" * 24, "chat", "batch", "in.jsonl", 3, NOW, NOW + 86400), b"{}\n")
    store.create_batch(BatchRecord("batch_" + "0" * 32, "chat", key.key_id, "in_progress", NOW, NOW + 86400,
                                   {"endpoint": "/v1/embeddings"}), [BatchLine(0, "c0", "{}")])
    store.record_usage(UsageRecord("chat", "gemma", NOW + 9, prompt_tokens=5, batch_id="batch_" + "0" * 32))
    assert isinstance(held, Reservation)
    return {"secret": secret, "admin": admin, "plaintext": plaintext, "held": held, "scopes": scopes}


def llmgw() -> click.Group:
    @click.group()
    def group() -> None:
        """Stand-in for the llmgw group."""

    store_cmds.register(group)
    return group


def test_a_sqlite_store_copied_to_postgresql_holds_the_same_rows_in_every_table(tmp_path: Path,
                                                                                postgres_schema: str) -> None:
    source_path = tmp_path / "llmgw.sqlite3"
    source = open_store(source_path)
    made = fill(source)
    source.close()
    destination_url = schema_url(postgres_schema)

    result = CliRunner().invoke(llmgw(), ["store", "copy", str(source_path), destination_url, "--json"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    counts = json.loads(result.output)["rows"]
    assert counts["secrets"] == 1 and counts["api_keys"] == 2 and counts["usage"] == 5

    source, destination = open_store(source_path), open_store(destination_url)
    try:
        for table in TABLES:
            assert list(destination.table_rows(table)) == list(source.table_rows(table)), table
            assert len(list(source.table_rows(table))) > 0, f"fill() left {table} empty"
        # the copy works as the original did
        assert destination.get_or_create_secret("engine-key") == made["secret"]
        assert destination.check_admin_token(made["admin"])
        assert destination.authenticate(made["plaintext"], NOW).project == "chat"
        assert destination.settle(made["held"], 50, 0.1, NOW + 10)
        assert destination.headroom(made["scopes"], NOW + 10).tokens.remaining == 1000 - 40 - 50
        destination.record_usage(UsageRecord("chat", "gemma", NOW + 20))
        assert [r[0] for r in destination.table_rows("usage")] == [1, 2, 3, 4, 5, 6]
        assert destination.lease_holder("llmgw-reconciler", NOW + 1) == "cp-1"
        (_, kept), = destination.usage_of_client_request("client-7")  # the client's id, commit and trace id too
        assert (kept.settings_commit, kept.trace_id) == ("c0ffee" * 6 + "c0ff", "ab" * 16)
        # the Linux users keep their UIDs, and the next member gets a new one, never one given before
        [ada, cy] = destination.assign_slurm_users([("ada@lab.example", ("x",)), ("cy@lab.example", ("cy",))], 200000)
        assert (ada.login, ada.uid, cy.uid) == ("ada", 200000, 200002)
    finally:
        source.close()
        destination.close()


def test_a_copy_into_a_store_that_holds_rows_is_refused_and_writes_nothing(tmp_path: Path,
                                                                           postgres_schema: str) -> None:
    from llmgw.store.copying import copy_store

    source = open_store(tmp_path / "a.sqlite3")
    fill(source)
    destination = open_store(schema_url(postgres_schema))
    try:
        destination.put("something", "here")
        with pytest.raises(StoreError, match=r"is not empty \(rows in kv\)"):
            copy_store(source, destination)
        assert list(destination.table_rows("api_keys")) == []
    finally:
        source.close()
        destination.close()
