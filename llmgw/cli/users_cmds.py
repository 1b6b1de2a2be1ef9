"""`llmgw users add|list|disable|enable|passwd`: people's local accounts in the store, for the console's login and
the tokens that belong to a person (`llmgw token create --owner EMAIL`).

An account only says who someone is; what they may do follows projects.yaml (`people.operators`,
`people.viewers`, project `members`: docs/security.md). Like `llmgw token`, these commands open the store
directly (`--state DIR`, default `.state`, or `--store PATH|URL`). A password is asked twice on the terminal
(hidden), or read from the first line of stdin with `--password-stdin`; only a scrypt hash of it is kept.
"""

from __future__ import annotations

import json
import sys
import time

import click
from rich.table import Table

from llmgw.cli.credentials import format_moment, remember_store, store_options, table_console, with_store
from llmgw.errors import UsageError
from llmgw.store import MIN_PASSWORD_CHARS, Account


@click.group("users")
@store_options
@click.pass_context
def users_group(ctx: click.Context, state_dir: str | None, store_url: str | None) -> None:
    """People's accounts: add, list, disable, enable and set passwords (roles come from projects.yaml)."""
    remember_store(ctx, state_dir, store_url)


def _password(from_stdin: bool) -> str:
    """The new password: stdin's first line (`--password-stdin`), else asked twice, hidden, on the terminal.
    Raises: UsageError when stdin holds no password, or is no terminal to ask on."""
    if from_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
        if not password:
            raise UsageError("--password-stdin read no password: write it on the first line of stdin.")
        return password
    if sys.stdin is sys.__stdin__ and not sys.stdin.isatty():  # getpass would echo it, with a Python warning
        raise UsageError("no terminal to ask the password on: run this in a terminal, or give it with "
                         "--password-stdin (its first line)")
    return click.prompt(f"Password (at least {MIN_PASSWORD_CHARS} characters)", hide_input=True,
                        confirmation_prompt=True)


def _json(account: Account) -> dict:
    return {"email": account.email, "name": account.name, "state": "active" if account.active else "disabled",
            "created_at": format_moment(account.created_at),
            "password_changed_at": format_moment(account.password_changed_at),
            "disabled_at": format_moment(account.disabled_at)}


password_stdin = click.option("--password-stdin", is_flag=True,
                              help="Read the password from the first line of stdin instead of asking for it.")
as_json = click.option("--json", "as_json", is_flag=True, help="Print JSON.")


@users_group.command("add")
@click.argument("email")
@click.option("--name", default="", help="The person's name, as settings commits made for them will carry it "
              "[default: the e-mail].")
@password_stdin
@as_json
@store_options
@click.pass_context
def users_add(ctx: click.Context, email: str, name: str, password_stdin: bool, as_json: bool, state_dir: str | None,
              store_url: str | None) -> None:
    """Make an account for EMAIL (what projects.yaml names the person by)."""
    remember_store(ctx, state_dir, store_url)
    password = _password(password_stdin)
    account = with_store(ctx, lambda store: store.add_account(email, name, password))
    if as_json:
        click.echo(json.dumps(_json(account)))
    else:
        click.echo(f"Made the account of {account.email} ({account.name}). What it may do follows projects.yaml: "
                   "people.operators, people.viewers or a project's members.")


@users_group.command("list")
@as_json
@store_options
@click.pass_context
def users_list(ctx: click.Context, as_json: bool, state_dir: str | None, store_url: str | None) -> None:
    """List the accounts (no password or hash is ever shown)."""
    remember_store(ctx, state_dir, store_url)
    accounts = with_store(ctx, lambda store: store.list_accounts())
    if as_json:
        click.echo(json.dumps([_json(a) for a in accounts]))
        return
    table = Table("email", "name", "state", "created", "password set")
    for account in accounts:
        row = _json(account)
        table.add_row(account.email, account.name, row["state"], row["created_at"], row["password_changed_at"])
    table_console().print(table)


def _switch(name: str, disabled: bool, help_text: str) -> None:
    @users_group.command(name, help=help_text)
    @click.argument("email")
    @as_json
    @store_options
    @click.pass_context
    def command(ctx: click.Context, email: str, as_json: bool, state_dir: str | None, store_url: str | None) -> None:
        remember_store(ctx, state_dir, store_url)
        account = with_store(ctx, lambda store: store.set_account_disabled(email, disabled, time.time()))
        click.echo(json.dumps(_json(account)) if as_json else
                   f"The account of {account.email} is {'disabled' if disabled else 'active'}.")


_switch("disable", True, "Disable EMAIL's account: no more logins, and the tokens that belong to it stop working "
        "(console sessions end within a minute).")
_switch("enable", False, "Enable EMAIL's account again.")


@users_group.command("passwd")
@click.argument("email")
@password_stdin
@store_options
@click.pass_context
def users_passwd(ctx: click.Context, email: str, password_stdin: bool, state_dir: str | None,
                 store_url: str | None) -> None:
    """Set a new password for EMAIL's account."""
    remember_store(ctx, state_dir, store_url)
    password = _password(password_stdin)
    account = with_store(ctx, lambda store: store.set_password(email, password))
    click.echo(f"Set a new password for {account.email}.")


def register(group: click.Group) -> None:
    """Add `users` to the `llmgw` command group."""
    group.add_command(users_group)
