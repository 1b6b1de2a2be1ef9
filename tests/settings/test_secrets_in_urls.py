"""Secrets out of git (issue 26, items 5 and 3): `llmgw validate` refuses a password (or a forge token) inside any
URL of the settings with a sentence naming `store.password_secret`, never showing the value; redaction hides the
whole user part up to the authority's last "@" and the values of token query parameters."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from llmgw.cli.main import cli
from llmgw.errors import SettingsError
from llmgw.settings import load_directory, redact_url
from llmgw.settings.url_secrets import url_secret
from llmgw.store import redacted
from settings_trees import copy_example

SECRET = "Sup3rS3cret"


@pytest.mark.parametrize("url,found", [
    (f"postgresql://llmgw:{SECRET}@db.internal/llmgw", "a password"),
    (f"postgresql://llmgw:p@ss{SECRET}@db.internal/llmgw", "a password"),
    ("postgresql://llmgw@db.internal/llmgw", None),
    (f"postgresql://llmgw@db/llmgw?password={SECRET}", "a token (query parameter password)"),
    (f"https://gitlab.example/api/v4/x?private_token={SECRET}", "a token (query parameter private_token)"),
    (f"https://oauth2:{SECRET}@gitlab.example/group/settings.git", "a password"),
    (f"https://{SECRET}@github.com/org/settings.git", "a token (the user part of an https URL)"),
    ("https://huggingface.co/org/repo/resolve/main/x.gguf", None),
    ("hf://org/repo@" + "a" * 40 + "/", None),
    ("file:///srv/mirror/model@v1/x.gguf", None),
    ("not a url", None),
])
def test_secrets_inside_urls_are_found(url, found):
    assert url_secret(url) == found


@pytest.mark.parametrize("text", [
    f"https://u:{SECRET}@forge/x.git", f"https://u:tok@en{SECRET}@forge/x", f"https://{SECRET}@forge/x",
    f"https://forge/x?private_token={SECRET}", f"https://forge/x?a=1&access_token={SECRET}#frag",
    f"cannot fetch https://forge/x.git?Token={SECRET}: refused",
])
def test_redaction_hides_the_whole_user_part_and_token_parameters(text):
    assert SECRET not in redact_url(text) and "***" in redact_url(text)


def test_the_store_layer_redacts_the_same(tmp_path):
    for url in (f"postgresql://u:p@ss{SECRET}@h/db", f"postgresql://u@h/db?password={SECRET}",
                f"postgresql://u@h/db?sslmode=require&access_token={SECRET}"):
        assert SECRET not in redacted(url), url


def _with_store(tmp_path: Path, store_yaml: str) -> Path:
    tree = copy_example(tmp_path / "tree")
    path = tree / "llmgw.yaml"
    text = path.read_text()
    start = text.index("store:\n")
    end = text.index("\n\n", start)
    path.write_text(text[:start] + store_yaml + text[end:])
    return tree


def test_validate_refuses_a_password_in_store_url_and_names_password_secret(tmp_path):
    tree = _with_store(tmp_path, f"store:\n  kind: postgresql\n  url: postgresql://llmgw:{SECRET}@db/llmgw")
    with pytest.raises(SettingsError) as refused:
        load_directory(tree)
    text = str(refused.value)
    assert "llmgw.yaml:12:" in text and "store.url" in text and "store.password_secret" in text
    assert SECRET not in text
    result = CliRunner().invoke(cli, ["validate", str(tree)])
    assert result.exit_code == 1 and "store.password_secret" in result.output and SECRET not in result.output


def test_validate_accepts_the_password_as_a_named_secret(tmp_path):
    tree = _with_store(tmp_path, "store:\n  kind: postgresql\n  url: postgresql://llmgw@db/llmgw\n"
                                 "  password_secret: store-password")
    assert load_directory(tree).cluster.store.password_secret == "store-password"


@pytest.mark.parametrize("endpoint,what", [
    (f"https://collector.example:4318/?access_token={SECRET}", "query parameter access_token"),
    (f"https://{SECRET}@collector.example:4318", "the user part of an https URL"),
])
def test_a_token_in_any_url_of_the_settings_is_refused(tmp_path, endpoint, what):
    tree = copy_example(tmp_path / "tree")
    path = tree / "llmgw.yaml"
    path.write_text(path.read_text() + f"tracing:\n  endpoint: {endpoint}\n")
    with pytest.raises(SettingsError) as refused:
        load_directory(tree)
    message = str(refused.value)
    assert "tracing.endpoint" in message and what in message and "secret" in message and SECRET not in message
