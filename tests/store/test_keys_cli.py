"""`llmgw keys create|list|revoke` and `llmgw usage` against a real store file in a state directory."""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from llmgw.cli import keys_cmds
from llmgw.errors import UsageError
from llmgw.store import UsageRecord, open_store


@pytest.fixture
def llmgw() -> click.Group:
    @click.group()
    def group() -> None:
        """A stand-in for the `llmgw` group holding only these verbs."""

    keys_cmds.register(group)
    return group


@pytest.fixture(autouse=True)
def stores(tmp_path: Path) -> None:
    """The stores a control plane (or `llmgw store init`) made in the state directories these tests name: the
    commands use an existing store only (tests/control/test_one_store.py)."""
    for state in (tmp_path, tmp_path / ".state"):
        state.mkdir(exist_ok=True)
        open_store(state / "llmgw.sqlite3").close()


def run(group: click.Group, *args: str) -> str:
    result = CliRunner().invoke(group, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.stdout


def test_a_created_key_is_printed_once_and_authenticates(llmgw: click.Group, tmp_path: Path) -> None:
    state = tmp_path / ".state"
    created = json.loads(run(llmgw, "keys", "create", "--state", str(state), "--project", "chat",
                             "--name", "ci", "--expires", "2999-01-31", "--json"))
    assert created["key"].startswith("sk-llmgw-") and created["project"] == "chat" and created["name"] == "ci"
    assert created["expires_at"] == "2999-01-31T00:00:00Z"
    store = open_store(state / "llmgw.sqlite3")
    try:
        assert store.authenticate(created["key"]).key_id == created["id"]
    finally:
        store.close()
    listed = json.loads(run(llmgw, "keys", "list", "--state", str(state), "--json"))
    assert [k["id"] for k in listed] == [created["id"]] and "key" not in listed[0]
    assert created["key"] not in run(llmgw, "keys", "list", "--state", str(state))


def test_plain_create_prints_only_the_key_on_stdout(llmgw: click.Group, tmp_path: Path) -> None:
    out = run(llmgw, "keys", "--state", str(tmp_path), "create", "--project", "chat")
    assert out.strip().startswith("sk-llmgw-") and len(out.strip().splitlines()) == 1


def test_a_revoked_key_is_listed_as_revoked(llmgw: click.Group, tmp_path: Path) -> None:
    created = json.loads(run(llmgw, "keys", "create", "--state", str(tmp_path), "--project", "chat", "--json"))
    assert "Revoked" in run(llmgw, "keys", "revoke", "--state", str(tmp_path), created["id"])
    listed = run(llmgw, "keys", "list", "--state", str(tmp_path))
    assert created["id"] in listed and "revoked" in listed


def test_revoking_an_unknown_id_fails_with_a_sentence(llmgw: click.Group, tmp_path: Path) -> None:
    result = CliRunner().invoke(llmgw, ["keys", "revoke", "--state", str(tmp_path), "key_deadbeef"])
    assert result.exit_code != 0
    assert "llmgw keys list" in str(result.exception)


def test_usage_is_grouped_and_filtered(llmgw: click.Group, tmp_path: Path) -> None:
    now = time.time()
    store = open_store(tmp_path / "llmgw.sqlite3")
    store.record_usage(UsageRecord("chat", "gemma", now - 3 * 86400, prompt_tokens=3, completion_tokens=4))
    store.record_usage(UsageRecord("chat", "gemma", now - 60, prompt_tokens=5, completion_tokens=6, cost=0.25))
    store.record_usage(UsageRecord("search", "qwen", now - 30, prompt_tokens=1, completion_tokens=1,
                                   cost=0.0000234))
    store.close()
    everything = json.loads(run(llmgw, "usage", "--state", str(tmp_path), "--by", "model", "--json"))
    assert [(r["group"], r["requests"], r["prompt_tokens"]) for r in everything["rows"]] == \
        [("gemma", 2, 8), ("qwen", 1, 1)]
    recent = json.loads(run(llmgw, "usage", "--state", str(tmp_path), "--since", "1d", "--project", "chat", "--json"))
    assert [(r["group"], r["requests"], r["cost"]) for r in recent["rows"]] == [("gemma", 1, 0.25)]
    table = run(llmgw, "usage", "--state", str(tmp_path), "--by", "project")
    assert "chat" in table and "search" in table
    assert "0.2500" in table and "0.000023" in table  # a small cost is shown, not rounded to 0.0000


def test_times_are_dates_datetimes_or_durations() -> None:
    now = 1_800_000_000.0
    assert keys_cmds.parse_moment("2027-01-31", now, future=True) == \
        datetime(2027, 1, 31, tzinfo=timezone.utc).timestamp()
    assert keys_cmds.parse_moment("2027-01-31T12:00:00+02:00", now, future=True) == \
        datetime(2027, 1, 31, 10, tzinfo=timezone.utc).timestamp()
    assert keys_cmds.parse_moment("30d", now, future=True) == now + 30 * 86400
    assert keys_cmds.parse_moment("24h", now, future=False) == now - 86400
    with pytest.raises(UsageError, match="neither a date"):
        keys_cmds.parse_moment("next tuesday", now, future=True)


def test_an_expiry_in_the_past_is_refused(llmgw: click.Group, tmp_path: Path) -> None:
    result = CliRunner().invoke(llmgw, ["keys", "create", "--state", str(tmp_path), "--project", "chat",
                                        "--expires", "2001-01-01"])
    assert result.exit_code != 0 and "in the past" in str(result.exception)


def test_a_key_for_a_project_the_settings_do_not_name_is_created_with_a_warning(llmgw: click.Group,
                                                                                 tmp_path: Path) -> None:
    # `llmgw up` keeps its settings in <state>/settings.git: a typo in --project is caught there
    from llmgw.settings import init_repository

    state = tmp_path / ".state"
    init_repository(state / "settings.git", Path(__file__).resolve().parents[2] / "examples" / "cluster-repo")
    result = CliRunner().invoke(llmgw, ["keys", "create", "--state", str(state), "--project", "nosuch"])
    assert result.exit_code == 0 and result.stdout.startswith("sk-llmgw-")
    assert "has no project 'nosuch' (it has: assistants, ci, demo)" in result.stderr and "refused (403)" in result.stderr
    known = CliRunner().invoke(llmgw, ["keys", "create", "--state", str(state), "--project", "demo"])
    assert known.exit_code == 0 and "warning" not in known.stderr


def test_one_requests_usage_is_shown_with_its_cost_and_times_readable(llmgw: click.Group, tmp_path: Path) -> None:
    store = open_store(tmp_path / "llmgw.sqlite3")
    store.record_usage_once(UsageRecord("demo", "gemma", time.time(), key_id="key_1", prompt_tokens=8,
                                        completion_tokens=8, ttft_seconds=0.1284, duration_seconds=1.408074000999477,
                                        cost=9.600000000000001e-07), "req_" + "ab" * 16)
    store.close()
    table = run(llmgw, "usage", "--state", str(tmp_path), "--request", "req_" + "ab" * 16)
    assert "0.00000096" in table and "128 ms" in table and "1.41 s" in table
    assert "e-07" not in table and "1.408074" not in table


def test_keys_and_tokens_print_the_same_fields_but_what_they_belong_to(tmp_path: Path) -> None:
    from llmgw.cli import token_cmds

    @click.group()
    def both() -> None:
        """A stand-in for the `llmgw` group holding `keys` and `token`."""

    keys_cmds.register(both)
    token_cmds.register(both)
    state = str(tmp_path)
    key = json.loads(run(both, "keys", "create", "--state", state, "--project", "chat", "--expires", "1d", "--json"))
    token = json.loads(run(both, "token", "create", "--state", state, "--scope", "review", "--expires", "1d",
                           "--json"))
    assert [*key][:2] == ["id", "project"] and [*token][:2] == ["id", "scope"]
    assert [*key][2:-3] == [*token][2:-2] == ["name", "prefix", "state", "created_at", "expires_at", "revoked_at"]
    assert [*token][-2:] == ["owner", "token"] and token["owner"] is None  # a token may belong to a person
    # a key records who made and revoked it through the admin API: nobody here (`llmgw keys` opens the store)
    assert [*key][-3:] == ["created_by", "revoked_by", "key"] and key["created_by"] is key["revoked_by"] is None
    revoked = [json.loads(run(both, verb, "revoke", "--state", state, item["id"], "--json"))
               for verb, item in (("keys", key), ("token", token))]
    assert [r["state"] for r in revoked] == ["revoked", "revoked"] and revoked[0]["revoked_at"]
    tables = [run(both, verb, "list", "--state", state) for verb in ("keys", "token")]
    assert all(f" {word} " in table for table in tables for word in ("id", "name", "prefix", "state", "revoked"))
    assert " project " in tables[0] and " scope " in tables[1]
