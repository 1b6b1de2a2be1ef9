"""`llmgw users add|list|disable|enable|passwd` and `llmgw token create --owner` against a real store file in a
state directory: the password is asked twice or read from stdin, never printed, and a short one or a missing
account is a sentence, not a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import click
from click.testing import CliRunner

from llmgw.cli import token_cmds, users_cmds
from llmgw.store import open_store

PASSWORD = "correct horse battery"


def llmgw() -> click.Group:
    @click.group()
    def group() -> None:
        """A stand-in for the `llmgw` group holding only these verbs."""

    users_cmds.register(group)
    token_cmds.register(group)
    return group


def run(tmp_path: Path, *args: str, input: str | None = None, code: int = 0):
    result = CliRunner().invoke(llmgw(), [*args, "--state", str(tmp_path)], input=input)
    assert result.exit_code == code, result.output
    return result


def test_an_account_is_made_listed_disabled_and_given_a_new_password(tmp_path: Path) -> None:
    open_store(tmp_path / "llmgw.sqlite3").close()
    made = run(tmp_path, "users", "add", "Ada@Lab.example", "--name", "Ada Lovelace", input=f"{PASSWORD}\n{PASSWORD}\n")
    assert "Made the account of ada@lab.example (Ada Lovelace)" in made.output and PASSWORD not in made.output
    [listed] = json.loads(run(tmp_path, "users", "list", "--json").output)
    assert (listed["email"], listed["state"]) == ("ada@lab.example", "active") and "password" not in listed
    token = json.loads(run(tmp_path, "token", "create", "--scope", "admin", "--owner", "ada@lab.example",
                           "--json").output)
    assert token["owner"] == "ada@lab.example"
    run(tmp_path, "users", "passwd", "ada@lab.example", "--password-stdin", input="another long password\n")
    assert "is disabled" in run(tmp_path, "users", "disable", "ada@lab.example").output
    store = open_store(tmp_path / "llmgw.sqlite3")
    try:
        assert store.check_password("ada@lab.example", "another long password") is None  # disabled
        store.set_account_disabled("ada@lab.example", False)
        assert store.check_password("ada@lab.example", "another long password").name == "Ada Lovelace"
    finally:
        store.close()


def test_refusals_are_sentences(tmp_path: Path) -> None:
    open_store(tmp_path / "llmgw.sqlite3").close()
    short = run(tmp_path, "users", "add", "ada@lab.example", "--password-stdin", input="short\n", code=1)
    assert "A password needs at least 12 characters" in str(short.exception)
    missing = run(tmp_path, "users", "passwd", "bob@lab.example", "--password-stdin", input=PASSWORD + "\n", code=1)
    assert "There is no account 'bob@lab.example'; `llmgw users list` shows them." in str(missing.exception)
    nobody = run(tmp_path, "token", "create", "--scope", "admin", "--owner", "bob@lab.example", code=1)
    assert "bob@lab.example has no account" in str(nobody.exception)


def test_without_a_terminal_the_password_is_not_asked_for_but_refused_with_what_to_do(tmp_path: Path) -> None:
    """Run with stdin a pipe (a script, no --password-stdin), getpass fell back to asking with echo and leaked its
    Python warning; the command now says what to do instead, and makes no account."""
    import os
    import subprocess
    import sys

    open_store(tmp_path / "llmgw.sqlite3").close()
    checkout = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-m", "llmgw.cli", "users", "add", "ada@lab.example", "--state",
                           str(tmp_path)], input=f"{PASSWORD}\n{PASSWORD}\n", capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(checkout)}, timeout=60)
    assert done.returncode == 1, done.stderr
    assert "no terminal to ask the password on" in done.stderr and "--password-stdin" in done.stderr
    assert "Warning" not in done.stderr + done.stdout and PASSWORD not in done.stderr + done.stdout
    assert json.loads(run(tmp_path, "users", "list", "--json").output) == []
