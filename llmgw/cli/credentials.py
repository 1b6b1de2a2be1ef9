"""What `llmgw keys`, `llmgw token`, `llmgw usage` and `llmgw store` share: the store they open (`--store PATH|URL`,
else the store of the control plane whose state directory `--state DIR` names, default `.state`: the one its
`store.json` records (`llmgw.store.StoreRecord`: SQLite or PostgreSQL, the password from the secret it names), else
its `llmgw.sqlite3`; never a new empty store: `resolve_store_url`), moments (parsed from dates or durations,
printed as ISO 8601 UTC) and the output of a credential (`llmgw.store.Credential`: an API key or a token) as JSON
and as a table (rich's `Table`, the tables of every `llmgw` command).

    @click.option(...) @store_options @click.pass_context def command(ctx, ..., state_dir, store_url):
        remember_store(ctx, state_dir, store_url)
        item, plaintext = with_store(ctx, lambda store: store.create_token(scope, expires_at=new_expiry(expires, now)))
        echo_created(item, plaintext, "token", f"of scope {scope}", as_json, now)
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import TypeVar

import click
from rich.console import Console
from rich.table import Table

from pathlib import Path
from urllib.parse import urlsplit

from llmgw.errors import UsageError
from llmgw.store import (
    STORE_FILE_NAME, STORE_RECORD_FILE, Credential, Store, open_store, read_store_record, redacted, with_password,
)
from llmgw.units import parse_duration

T = TypeVar("T")


def parse_moment(text: str, now: float, *, future: bool) -> float:
    """Epoch seconds from an ISO date ("2026-01-31", 00:00 UTC), an ISO date and time (UTC unless it carries
    an offset), or a duration ("30d", "12h") counted forward from `now` (`future`) or back from it.

    Raises UsageError naming the text when it is none of these.
    """
    value = text.strip()
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        try:
            seconds = parse_duration(value)
        except ValueError:
            raise UsageError(f"{text!r} is neither a date (2026-01-31, 2026-01-31T12:00) nor a duration "
                             "(30d, 12h).") from None
        return now + seconds if future else now - seconds
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()


def format_moment(seconds: float | None) -> str | None:
    """Epoch seconds as ISO 8601 in UTC with a Z ("2026-01-31T00:00:00Z"); None stays None."""
    if seconds is None:
        return None
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def store_options(func):
    """The `--state DIR` and `--store PATH|URL` options of a command or group (`remember_store` keeps them)."""
    func = click.option("--store", "store_url", envvar="LLMGW_STORE", default=None,
                        help="Store: a SQLite path, sqlite:///path or postgresql://... (overrides --state).")(func)
    func = click.option("--state", "state_dir", envvar="LLMGW_STATE", default=None,
                        help="State directory of the control plane (`llmgw server --state`, `llmgw up`) whose store "
                        "to use [default: .state].")(func)
    return func


def remember_store(ctx: click.Context, state_dir: str | None, store_url: str | None) -> None:
    """Keep the store options given at this level (group or command) for `with_store` and `state_of`."""
    meta = ctx.find_root().meta.setdefault("llmgw.store_options", {})
    if state_dir:
        meta["state"] = state_dir
    if store_url:
        meta["store"] = store_url


def state_of(ctx: click.Context) -> str:
    """The state directory the command's options name (`--state`, default `.state`)."""
    options = ctx.find_root().meta.get("llmgw.store_options") or {}
    return options.get("state") or ".state"


def _missing_sqlite(url: str) -> Path | None:
    """The SQLite file `url` (a path or sqlite:///path) names when it does not exist; None otherwise."""
    if "://" not in url:
        path = Path(url).expanduser()
    elif urlsplit(url).scheme.lower() == "sqlite":
        path = Path(urlsplit(url).path)
    else:
        return None
    return None if path.exists() else path


def resolve_store_url(state_dir: str | Path, store_url: str | None, environ: dict[str, str] | None = None) -> str:
    """The URL of the store to open: `store_url` (`--store`), else the one the control plane recorded in
    `<state_dir>/store.json` (with its password from the secret it names: `<secrets_dir>/<name>`, else
    `$LLMGW_SECRET_<NAME>`), else `<state_dir>/llmgw.sqlite3` when that file exists.

    Raises UsageError naming what to pass when none of these is there, when a SQLite store named does not exist
    (no command but `llmgw store init` creates one), or when the password's secret cannot be found.
    """
    from llmgw.control.keys import SecretResolver

    state = Path(state_dir)
    url = store_url
    if not url:
        record = read_store_record(state)
        if record is None:
            legacy = state / STORE_FILE_NAME
            if legacy.is_file():
                return str(legacy)
            raise UsageError(
                f"{state} holds no store: no {STORE_RECORD_FILE} (a control plane writes it there when it starts) and "
                f"no {STORE_FILE_NAME}. Pass --state with the control plane's state directory (its `llmgw server "
                f"--state`), or --store URL; `llmgw store init --state {state}` creates an empty store there.")
        url = record.url
        if record.password_secret:
            secrets = SecretResolver(Path(record.secrets_dir) if record.secrets_dir else state / "secrets", environ)
            password = secrets.get(record.password_secret)
            if password is None:
                where = Path(record.secrets_dir) if record.secrets_dir else state / "secrets"
                env = "LLMGW_SECRET_" + record.password_secret.upper().replace("-", "_").replace(".", "_")
                raise UsageError(f"the store of {state} ({redacted(url)}) takes its password from the secret "
                                 f"{record.password_secret!r}: make it readable in {where}/{record.password_secret} "
                                 f"or set {env}, or pass --store URL.")
            url = with_password(url, password)
    missing = _missing_sqlite(url)
    if missing is not None:
        raise UsageError(f"there is no store at {missing}: pass --state with the control plane's state directory or "
                         f"--store with its store; `llmgw store init --store {missing}` creates an empty one.")
    return url


def with_store(ctx: click.Context, call: Callable[[Store], T]) -> T:
    """`call(store)` on the store the command's options name (`resolve_store_url`), closed afterwards."""
    options = ctx.find_root().meta.get("llmgw.store_options") or {}
    store = open_store(resolve_store_url(state_of(ctx), options.get("store")))
    try:
        return call(store)
    finally:
        store.close()


def table_console() -> Console:
    """A console for tables: the terminal's width, or wide enough not to cut columns when piped."""
    console = Console()
    return console if console.is_terminal else Console(width=200)


def new_expiry(expires: str | None, now: float) -> float | None:
    """The epoch seconds `--expires` names (`parse_moment`, forward from `now`), None without one.

    Raises UsageError when it is not a moment or not after `now`."""
    if not expires:
        return None
    expires_at = parse_moment(expires, now, future=True)
    if expires_at <= now:
        raise UsageError(f"--expires {expires} is in the past; give a later date or a duration such as 30d.")
    return expires_at


def credential_json(item: Credential, now: float) -> dict:
    """A credential as JSON: its id, its project or scope (keyed by `item.GROUP`), name, prefix, state at `now`
    (unix s), its times as ISO 8601 UTC (None when unset), for a token its `owner` (an e-mail or None) and for an
    API key who made and revoked it (`created_by`, `revoked_by`: an e-mail or None)."""
    return {"id": item.credential_id, item.GROUP: item.group, "name": item.name, "prefix": item.prefix,
            "state": item.state(now), "created_at": format_moment(item.created_at),
            "expires_at": format_moment(item.expires_at), "revoked_at": format_moment(item.revoked_at),
            **{name: getattr(item, name) for name in ("owner", *_PEOPLE) if hasattr(item, name)}}


_PEOPLE = ("created_by", "revoked_by")
"""The fields of an API key naming who made and who revoked it (through the admin API)."""


def print_credentials(items: Sequence[Credential], group: str, now: float) -> None:
    """A table of credentials of one kind: id, their `group` ("project" or "scope"), name, prefix, state at `now`,
    created and expires (UTC); for API keys also who made them, when and by whom they were revoked ("" when nobody
    recorded: `llmgw keys` or nobody's token)."""
    people = bool(items) and all(hasattr(item, name) for item in items for name in _PEOPLE)
    table = Table("id", group, "name", "prefix", "state", "created", "expires",
                  *(("created by", "revoked", "revoked by") if people else ()))
    for item in items:
        table.add_row(item.credential_id, item.group, item.name or "", item.prefix + "…", item.state(now),
                      format_moment(item.created_at), format_moment(item.expires_at) or "never",
                      *((getattr(item, "created_by") or "", format_moment(item.revoked_at) or "",
                         getattr(item, "revoked_by") or "") if people else ()))
    table_console().print(table)


def echo_created(item: Credential, plaintext: str, noun: str, belongs: str, as_json: bool, now: float) -> None:
    """Print a credential just made: its JSON with the plaintext under `noun` ("key", "token"), or the plaintext
    alone on stdout and on stderr what was made, `belongs` saying to what ("for project chat"). The plaintext is
    shown this once: the store keeps its hash."""
    if as_json:
        click.echo(json.dumps({**credential_json(item, now), noun: plaintext}))
        return
    click.echo(plaintext)
    click.echo(f"Created {item.credential_id} {belongs}"
               + (f", expires {format_moment(item.expires_at)}" if item.expires_at is not None else "")
               + f". This is the only time the {noun} is shown: store it now.", err=True)


def echo_listed(items: Sequence[Credential], group: str, as_json: bool, now: float) -> None:
    """Print credentials of one kind: a JSON list, or a table (`print_credentials`)."""
    if as_json:
        click.echo(json.dumps([credential_json(item, now) for item in items]))
    else:
        print_credentials(items, group, now)


def echo_revoked(item: Credential, as_json: bool, now: float) -> None:
    """Print a credential just revoked: its JSON, or a sentence with its id, project or scope and the time."""
    if as_json:
        click.echo(json.dumps(credential_json(item, now)))
    else:
        click.echo(f"Revoked {item.credential_id} of {item.GROUP} {item.group} at {format_moment(item.revoked_at)}.")


def add_list_and_revoke(group: click.Group, *, grouped_by: str, only_help: str, choices: Sequence[str] | None,
                        listing: Callable[[Store, str | None], list], list_help: str,
                        revoking: Callable[[Store, str], Credential], id_metavar: str, revoke_help: str) -> None:
    """Add to `group` its `list [--<grouped_by> X] [--json]` and `revoke ID [--json]` commands.

    `listing(store, X or None)` reads the credentials of one kind, `revoking(store, id)` revokes one (raising
    StoreError for an unknown id); `grouped_by` is what they belong to ("project", "scope": the option, the table's
    column), `choices` its allowed values (None: any); the help texts are the commands' and the option's.
    """

    @group.command("list", help=list_help)
    @click.option(f"--{grouped_by}", "only", default=None, type=click.Choice(choices) if choices else None,
                  help=only_help)
    @click.option("--json", "as_json", is_flag=True, help="Print JSON.")
    @store_options
    @click.pass_context
    def list_command(ctx: click.Context, only: str | None, as_json: bool, state_dir: str | None,
                     store_url: str | None) -> None:
        remember_store(ctx, state_dir, store_url)
        echo_listed(with_store(ctx, lambda store: listing(store, only)), grouped_by, as_json, time.time())

    @group.command("revoke", help=revoke_help)
    @click.argument("credential_id", metavar=id_metavar)
    @click.option("--json", "as_json", is_flag=True, help="Print JSON.")
    @store_options
    @click.pass_context
    def revoke_command(ctx: click.Context, credential_id: str, as_json: bool, state_dir: str | None,
                       store_url: str | None) -> None:
        remember_store(ctx, state_dir, store_url)
        echo_revoked(with_store(ctx, lambda store: revoking(store, credential_id)), as_json, time.time())
