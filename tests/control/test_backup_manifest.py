"""The pure parts of backup and restore (`llmgw.backup`): which member names a restore may write, how a manifest is
read back and compared with the members found, and how a pg_dump script's schema is renamed without touching the
copied rows."""

from __future__ import annotations

import pytest

from llmgw.backup import Manifest, Member, damaged_members, parse_manifest
from llmgw.backup.manifest import check_member_name
from llmgw.backup.postgres_dump import rename_schema, schema_of
from llmgw.errors import BackupError

A, B = "a" * 64, "b" * 64


@pytest.mark.parametrize("name", ["store/llmgw.sqlite3", "ca/ca.key", "secrets/hf-token", "settings.bundle",
                                  "admin-token"])
def test_the_names_a_backup_writes_are_accepted(name):
    assert check_member_name(name) == name


@pytest.mark.parametrize("name", ["../etc/passwd", "/etc/passwd", "ca/../../x", "secrets/.hidden", "ca/a/b",
                                  "other/file", "store/", "admin-token/x", ""])
def test_a_name_outside_the_backups_layout_is_refused(name):
    with pytest.raises(BackupError, match="no llmgw backup writes"):
        check_member_name(name)


def test_a_manifest_reads_back_and_names_each_damaged_missing_or_extra_member():
    manifest = Manifest("0.1.0", "2026-12-04T21:00:00Z", "sqlite", "main",
                        (Member("admin-token", B, 5), Member("ca/ca.crt", A, 10)))  # in name order
    assert parse_manifest(manifest.to_json().encode()) == manifest
    assert damaged_members(manifest, {"ca/ca.crt": A, "admin-token": B}) == []
    said = damaged_members(manifest, {"ca/ca.crt": B, "secrets/x": A})
    assert said == ["member admin-token is missing",
                    f"member ca/ca.crt is damaged: its sha256 is {B[:16]}..., the manifest says {A[:16]}...",
                    "member secrets/x is not in the manifest"]


@pytest.mark.parametrize("text, said", [
    (b"not json", "is damaged"), (b'{"format": 2, "llmgw_version": "9.0"}', "format 2"),
    (b'{"format": 1, "members": {}}', "is damaged"),
    (b'{"format": 1, "llmgw_version": "1", "created": "x", "store": {"kind": "sqlite"}, '
     b'"members": {"../x": {"sha256": "' + A.encode() + b'", "size": 1}}}', "no llmgw backup writes"),
])
def test_a_damaged_or_foreign_manifest_is_refused_with_a_sentence(text, said):
    with pytest.raises(BackupError, match=said):
        parse_manifest(text)


def test_the_schema_is_renamed_in_statements_only_never_in_copied_rows():
    script = "\n".join([
        "CREATE SCHEMA old_s;", "CREATE TABLE old_s.kv (key text, value text);",
        "COPY old_s.kv (key, value) FROM stdin;", "old_s.x\told_s.y", "CREATE SCHEMA old_s;", "\\.",
        "SELECT pg_catalog.setval('old_s.seq', 3, true);", "ALTER TABLE ONLY old_s_more.t ADD x;"])
    renamed = rename_schema(script, "old_s", "new_s").split("\n")
    assert renamed == [
        "CREATE SCHEMA IF NOT EXISTS new_s;", "CREATE TABLE new_s.kv (key text, value text);",
        "COPY new_s.kv (key, value) FROM stdin;", "old_s.x\told_s.y", "CREATE SCHEMA old_s;", "\\.",
        "SELECT pg_catalog.setval('new_s.seq', 3, true);", "ALTER TABLE ONLY old_s_more.t ADD x;"]


@pytest.mark.parametrize("url, schema", [
    ("postgresql://127.0.0.1/test", "public"), ("postgresql://h/db?options=-csearch_path%3Dllmgw_a", "llmgw_a"),
    ("postgresql://h/db?options=-c%20search_path%3Dllmgw", "llmgw"),
])
def test_the_store_urls_schema_is_its_search_path(url, schema):
    assert schema_of(url) == schema


def test_a_schema_name_that_would_need_quoting_is_refused():
    with pytest.raises(BackupError, match="plain lower-case"):
        schema_of("postgresql://h/db?options=-csearch_path%3DMixed")
