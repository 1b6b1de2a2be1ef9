"""`llmgw token create|list|revoke`: tokens of the admin listener, one kind with a scope each.

Scopes (`llmgw.store.TOKEN_SCOPES`): `admin` (everything on the admin listener), `metrics` (GET /metrics for a
Prometheus scraper), `review` (read-only GET /api/v1/plan, /api/v1/fleet, /api/v1/status for `llmgw review` in
CI), `console` (the web console's views). An admin token passes every scope's check. Like `llmgw keys`, these
commands open the store directly (`--state DIR`, default `.state`, or `--store PATH|URL`); only the SHA-256 of a
token is kept, so `create` prints the token once and `list` shows ids and prefixes only.
"""

from __future__ import annotations

import time

import click

from llmgw.cli.credentials import (
    add_list_and_revoke, echo_created, new_expiry, remember_store, store_options, with_store,
)
from llmgw.store import TOKEN_SCOPES


@click.group("token")
@store_options
@click.pass_context
def token_group(ctx: click.Context, state_dir: str | None, store_url: str | None) -> None:
    """Create, list and revoke tokens of the admin listener (scopes: admin, metrics, review, console)."""
    remember_store(ctx, state_dir, store_url)


@token_group.command("create")
@click.option("--scope", required=True, type=click.Choice(TOKEN_SCOPES),
              help="What the token may do: admin (everything), metrics (/metrics), review (read-only plan, "
                   "fleet and status), console (the web console).")
@click.option("--name", default=None, help="A label to tell tokens apart (who or what uses it).")
@click.option("--expires", default=None, metavar="DATE",
              help="Expiry: 2026-01-31 (00:00 UTC), 2026-01-31T12:00 or a duration from now (30d).")
@click.option("--owner", default=None, metavar="EMAIL",
              help="The person the token belongs to (an account of `llmgw users add`): the admin API lets it do what "
                   "that person's role allows, and authors its settings commits as that person.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@store_options
@click.pass_context
def token_create(ctx: click.Context, scope: str, name: str | None, expires: str | None, owner: str | None,
                 as_json: bool, state_dir: str | None, store_url: str | None) -> None:
    """Create a token of SCOPE and print it once: only its hash is kept."""
    remember_store(ctx, state_dir, store_url)
    now = time.time()
    expires_at = new_expiry(expires, now)
    token, plaintext = with_store(ctx, lambda store: store.create_token(scope, name=name, expires_at=expires_at,
                                                                        now=now, owner=owner))
    echo_created(token, plaintext, "token", f"of scope {scope}" + (f" belonging to {token.owner}" if owner else ""),
                 as_json, now)


add_list_and_revoke(
    token_group, grouped_by="scope", only_help="Only the tokens of this scope.", choices=TOKEN_SCOPES,
    listing=lambda store, scope: store.list_tokens(scope),
    list_help="List tokens (ids, scopes and prefixes only; tokens themselves are never stored).",
    revoking=lambda store, token_id: store.revoke_token(token_id), id_metavar="TOKEN_ID",
    revoke_help="Revoke the token TOKEN_ID (see `llmgw token list`); the admin listener answers it 401 from then on.",
)


def register(group: click.Group) -> None:
    """Add `token` to the `llmgw` command group."""
    group.add_command(token_group)
