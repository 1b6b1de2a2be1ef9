"""`llmgw store init`, `llmgw store migrate` and `llmgw store copy SRC DST`: making a store, its schema, and moving
it to another backend. `migrate` (like `keys`, `token` and `usage`) works on an existing store only, found from
`--store` or the control plane's `--state` (llmgw.cli.credentials.resolve_store_url); only `init` (and `copy`'s
destination) makes a new one.
`llmgw purge --project P | --expired`: deleting the requests' content the gateway stored (docs/gateway.md).

A store is named by a path (SQLite), `sqlite:///PATH` or `postgresql://user:password@host:port/database`; the
password is never printed (`postgresql://user:***@host/db`). See docs/store.md.
"""

from __future__ import annotations

import json

import click

from pathlib import Path

from llmgw.cli.credentials import resolve_store_url
from llmgw.errors import UsageError
from llmgw.store import (
    STORE_RECORD_FILE, open_store, read_store_record, redacted, store_record, store_url_for_state,
    write_store_record,
)
from llmgw.store.copying import copy_store, migrate_store


@click.group("store")
def store_group() -> None:
    """The runtime store: bring its schema up to date, copy it to another backend."""


@store_group.command("init")
@click.option("--store", "store_url", envvar="LLMGW_STORE", default=None, metavar="URL",
              help="The store to create (a SQLite path or a postgresql:// URL) [default: <state>/llmgw.sqlite3].")
@click.option("--state", "state_dir", envvar="LLMGW_STATE", default=".state", show_default=True,
              help="State directory to create the store in (and record it in, for the other commands).")
def init_command(store_url: str | None, state_dir: str) -> None:
    """Create an empty store (its schema migrated) and record it in the state directory's store.json. A store
    already there is kept; a state directory that already records another store is refused."""
    state = Path(state_dir)
    url = store_url or store_url_for_state(state)
    record = store_record(None, state, override_url=url)
    existing = read_store_record(state)
    if existing is not None and existing.url != record.url:
        raise UsageError(f"{state}/{STORE_RECORD_FILE} records the store {redacted(existing.url)} already; a "
                         "control plane uses it. Give another --state for a new store.")
    state.mkdir(parents=True, exist_ok=True)
    before, after = migrate_store(url)
    write_store_record(state, record)
    verb = "Created" if before == 0 else "Kept"
    click.echo(f"{verb} the store {redacted(url)} (schema version {after}), recorded in {state}/{STORE_RECORD_FILE}.")


@store_group.command("migrate")
@click.option("--store", "store_url", envvar="LLMGW_STORE", default=None, metavar="URL",
              help="The store (a SQLite path or a postgresql:// URL); default: the state directory's.")
@click.option("--state", "state_dir", envvar="LLMGW_STATE", default=".state", show_default=True,
              help="State directory of the control plane whose store to migrate when --store is not given.")
def migrate_command(store_url: str | None, state_dir: str) -> None:
    """Apply the store's missing schema migrations (an existing store only: `llmgw store init` makes one)."""
    url = resolve_store_url(state_dir, store_url)
    before, after = migrate_store(url)
    if before == after:
        click.echo(f"The store {redacted(url)} is at schema version {after}; nothing to do.")
    else:
        click.echo(f"The store {redacted(url)} went from schema version {before} to {after}.")


@store_group.command("copy")
@click.argument("source")
@click.argument("destination")
@click.option("--json", "as_json", is_flag=True, help="Print the rows copied per table as JSON.")
def copy_command(source: str, destination: str, as_json: bool) -> None:
    """Copy every table of the store SOURCE into the empty store DESTINATION (e.g. SQLite -> PostgreSQL).

    Stop the control planes that write SOURCE first. DESTINATION is created (its schema migrated) if needed.
    """
    src = open_store(source)
    try:
        dst = open_store(destination)
        try:
            counts = copy_store(src, dst)
        finally:
            dst.close()
    finally:
        src.close()
    if as_json:
        click.echo(json.dumps({"source": src.url, "destination": dst.url, "rows": counts}))
        return
    click.echo(f"Copied {src.url} into {dst.url}:")
    for table, count in counts.items():
        click.echo(f"  {table:<20} {count:>8} rows")


@click.command("purge")
@click.option("--project", default=None, metavar="PROJECT", help="Delete everything stored of this project's requests.")
@click.option("--expired", is_flag=True, help="Delete what is past its retention, of every project.")
@click.option("--store", "store_url", envvar="LLMGW_STORE", default=None, metavar="URL",
              help="The store (a SQLite path or a postgresql:// URL); default: the state directory's.")
@click.option("--state", "state_dir", envvar="LLMGW_STATE", default=".state", show_default=True,
              help="State directory whose llmgw.sqlite3 is the store when --store is not given.")
def purge_command(project: str | None, expired: bool, store_url: str | None, state_dir: str) -> None:
    """Delete the requests' content the gateway stored: the responses kept for /v1/responses (input and output
    items), the files of /v1/files and the batches of /v1/batches (their lines and results). --project P deletes all
    of P's at once; --expired those past store.responses_retention and store.files_retention (the gateway also does
    that every hour). Counts are printed, never the content."""
    if (project is None) == (not expired):
        raise click.UsageError("Give --project PROJECT or --expired.")
    store = open_store(store_url or store_url_for_state(state_dir))
    try:
        if project is not None:
            purged = (store.purge_responses(project=project), store.purge_files(project=project),
                      store.purge_batches(project=project))
        else:
            purged = (store.purge_responses(), store.purge_files(), store.purge_batches())
    finally:
        store.close()
    whose = f"of project '{project}'" if project is not None else "past their retention"
    click.echo(f"Purged {purged[0]} stored responses, {purged[1]} files and {purged[2]} batches {whose} "
               f"from {store.url}.")


def register(group: click.Group) -> None:
    group.add_command(store_group)
    group.add_command(purge_command)
