"""Stored responses of /v1/responses, on SQLite and PostgreSQL: found by id for the owning project only, never past
their retention, deleted by id, purged when expired and per project, and copied with the rest of a store."""

from __future__ import annotations

from llmgw.store import StoredResponse, open_store
from llmgw.store.copying import copy_store


def _stored(response_id: str, project: str, created: float, kept: float) -> StoredResponse:
    return StoredResponse(id=response_id, project=project, created_at=created, expires_at=created + kept,
                          model="gemma", input=[{"role": "user", "content": "héllo ✓"}],
                          response={"id": response_id, "object": "response", "output": [], "usage": None})


def test_a_response_is_found_by_its_project_only_and_never_past_its_retention(store):
    store.save_response(_stored("resp_a", "chat", 1000.0, 100.0))
    found = store.load_response("resp_a", "chat", now=1050.0)
    assert found is not None and found.input == [{"role": "user", "content": "héllo ✓"}]
    assert found.response["id"] == "resp_a" and found.expires_at == 1100.0 and found.model == "gemma"
    assert store.load_response("resp_a", "other", now=1050.0) is None
    assert store.load_response("resp_a", "chat", now=1100.0) is None  # expired, even before a purge
    assert store.load_response("resp_missing", "chat", now=1050.0) is None


def test_delete_takes_the_owning_project_only(store):
    store.save_response(_stored("resp_a", "chat", 1000.0, 100.0))
    assert store.delete_response("resp_a", "other") is False
    assert store.delete_response("resp_a", "chat") is True
    assert store.delete_response("resp_a", "chat") is False
    assert store.load_response("resp_a", "chat", now=1001.0) is None


def test_purges_delete_expired_rows_and_every_row_of_a_project(store):
    store.save_response(_stored("resp_old", "chat", 1000.0, 10.0))
    store.save_response(_stored("resp_new", "chat", 1000.0, 1000.0))
    store.save_response(_stored("resp_team", "team", 1000.0, 1000.0))
    assert store.purge_responses(now=1500.0) == 1
    assert store.load_response("resp_new", "chat", now=1500.0) is not None
    assert store.purge_responses(project="chat") == 1
    assert store.load_response("resp_new", "chat", now=1500.0) is None
    assert store.load_response("resp_team", "team", now=1500.0) is not None


def test_a_store_copy_carries_the_responses(store, tmp_path):
    store.save_response(_stored("resp_a", "chat", 1000.0, 100.0))
    copy = open_store(tmp_path / "copy.sqlite3")
    try:
        assert copy_store(store, copy)["responses"] == 1
        assert copy.load_response("resp_a", "chat", now=1001.0) == store.load_response("resp_a", "chat", now=1001.0)
    finally:
        copy.close()


def test_llmgw_purge_deletes_one_projects_responses_and_prints_counts_only(store, store_url):
    from click.testing import CliRunner

    from llmgw.cli.main import cli

    store.save_response(_stored("resp_a", "chat", 1000.0, 10.0))
    store.save_response(_stored("resp_b", "team", 1000.0, 10.0))
    runner = CliRunner()
    refused = runner.invoke(cli, ["purge", "--store", store_url])
    assert refused.exit_code == 2 and "--project" in refused.output
    done = runner.invoke(cli, ["purge", "--project", "chat", "--store", store_url])
    assert done.exit_code == 0 and "Purged 1 stored responses, 0 files and 0 batches of project 'chat'" in done.output
    assert "héllo" not in done.output
    expired = runner.invoke(cli, ["purge", "--expired", "--store", store_url])
    assert expired.exit_code == 0 and "Purged 1 stored responses, 0 files and 0 batches past their retention" in expired.output
