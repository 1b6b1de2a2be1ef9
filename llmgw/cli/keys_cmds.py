"""`llmgw keys create|list|revoke` and `llmgw usage`: API keys and usage, read from the store file.

These commands open the store directly (`--state DIR`, default `.state`, store `DIR/llmgw.sqlite3`, the
layout of `llmgw up`; or `--store PATH|URL`, PostgreSQL included). That works on the control plane's machine, also
while it runs (SQLite WAL lets both write; a write waits up to the busy timeout for the other). A later version may
route them through the admin API instead. Times are printed in UTC; `--json` prints machine-readable output. What
they share with `llmgw token` (store options, moments, the credential table and JSON) is `llmgw.cli.credentials`.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import click
from rich.table import Table

from llmgw.cli.credentials import (
    add_list_and_revoke, echo_created, format_moment, new_expiry, parse_moment, remember_store, state_of,
    store_options, table_console, with_store,
)
from llmgw.errors import UsageError
from llmgw.store import UsageRecord, UsageRow

__all__ = ["format_cost", "format_moment", "parse_moment", "register", "request_json"]


@click.group("keys")
@store_options
@click.pass_context
def keys_group(ctx: click.Context, state_dir: str | None, store_url: str | None) -> None:
    """Create, list and revoke API keys (kept as hashes in the store)."""
    remember_store(ctx, state_dir, store_url)


@keys_group.command("create")
@click.option("--project", required=True, help="Project of projects.yaml the key belongs to.")
@click.option("--name", default=None, help="A label to tell keys apart.")
@click.option("--expires", default=None, metavar="DATE",
              help="Expiry: 2026-01-31 (00:00 UTC), 2026-01-31T12:00 or a duration from now (30d).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@store_options
@click.pass_context
def keys_create(ctx: click.Context, project: str, name: str | None, expires: str | None, as_json: bool,
                state_dir: str | None, store_url: str | None) -> None:
    """Create an API key for PROJECT and print it once: only its hash is kept."""
    remember_store(ctx, state_dir, store_url)
    now = time.time()
    expires_at = new_expiry(expires, now)
    key, plaintext = with_store(ctx, lambda store: store.create_api_key(project, name=name, expires_at=expires_at,
                                                                         now=now))
    _warn_unknown_project(ctx, project)
    echo_created(key, plaintext, "key", f"for project {project}", as_json, now)


def _warn_unknown_project(ctx: click.Context, project: str) -> None:
    """Warn (stderr) when the settings in the state directory (`<state>/settings.git`, as `llmgw up` and
    `llmgw server` keep them) have no project `project`: its keys get 403 until projects.yaml names it. Settings
    elsewhere, or none readable, are not checked."""
    from llmgw.errors import SettingsError
    from llmgw.settings import load_commit

    repo = Path(state_of(ctx)) / "settings.git"
    if not repo.is_dir():
        return
    try:
        projects = load_commit(repo).projects
    except SettingsError:
        return
    if project not in projects:
        known = ", ".join(sorted(projects)) or "none"
        click.echo(f"warning: projects.yaml of {repo} has no project {project!r} (it has: {known}); requests with "
                   "this key are refused (403) until the project is added there.", err=True)


add_list_and_revoke(
    keys_group, grouped_by="project", only_help="Only the keys of this project.", choices=None,
    listing=lambda store, project: store.list_api_keys(project),
    list_help="List API keys (ids and prefixes only; keys themselves are never stored).",
    revoking=lambda store, key_id: store.revoke_api_key(key_id), id_metavar="KEY_ID",
    revoke_help="Revoke the API key KEY_ID (see `llmgw keys list`); requests with it get 401 from then on.",
)


def _row_json(row: UsageRow) -> dict:
    return {"group": row.group, "requests": row.requests, "errors": row.errors,
            "prompt_tokens": row.prompt_tokens, "completion_tokens": row.completion_tokens,
            "cached_tokens": row.cached_tokens, "cost": row.cost,
            "mean_ttft_seconds": row.mean_ttft_seconds, "mean_duration_seconds": row.mean_duration_seconds}


@click.command("usage")
@click.option("--project", default=None, help="Only this project.")
@click.option("--since", default=None, metavar="T",
              help="From this time: 2026-01-31, 2026-01-31T12:00 (UTC) or a duration ago (24h, 7d).")
@click.option("--by", type=click.Choice(["model", "project", "day"]), default="model", show_default=True,
              help="Group rows by.")
@click.option("--request", "request_id", default=None, metavar="ID",
              help="Show one request's record instead: the id the gateway answered in `x-request-id` (the "
                   "gateway's req_... id, or the client's own x-request-id it kept).")
@click.option("--gpu-hours", is_flag=True,
              help="The GPU-hours and CPU core-hours each project used of the replicas, per model, shared in "
                   "proportion to use and priced with llmgw.yaml prices.gpu_hour_cost (docs/capacity.md).")
@click.option("--repo", default=None, metavar="PATH",
              help="With --gpu-hours: the settings repository whose branch head gives the replicas' sizes and the "
                   "prices [default: <state>/settings.git].")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@store_options
@click.pass_context
def usage_command(ctx: click.Context, project: str | None, since: str | None, by: str, request_id: str | None,
                  gpu_hours: bool, repo: str | None, as_json: bool, state_dir: str | None,
                  store_url: str | None) -> None:
    """Requests, tokens and cost served, summed by model, project or UTC day; or one request (--request ID); or
    the GPU-hours and core-hours each project used (--gpu-hours)."""
    remember_store(ctx, state_dir, store_url)
    if request_id is not None:
        _show_request(ctx, request_id.strip(), as_json)
        return
    since_at = parse_moment(since, time.time(), future=False) if since else None
    if gpu_hours:
        _show_gpu_hours(ctx, repo, since_at, project, as_json)
        return
    rows = with_store(ctx, lambda store: store.query_usage(project=project, since=since_at, by=by))
    if as_json:
        click.echo(json.dumps({"by": by, "project": project, "since": format_moment(since_at),
                               "rows": [_row_json(row) for row in rows]}))
        return
    table = Table(by, "requests", "errors", "prompt", "completion", "cached", "cost", "mean TTFT", "mean duration")
    for row in rows:
        table.add_row(row.group, str(row.requests), str(row.errors), str(row.prompt_tokens),
                      str(row.completion_tokens), str(row.cached_tokens), format_cost(row.cost),
                      "" if row.mean_ttft_seconds is None else f"{row.mean_ttft_seconds * 1000:.0f} ms",
                      "" if row.mean_duration_seconds is None else f"{row.mean_duration_seconds:.2f} s")
    table_console().print(table)


def _show_gpu_hours(ctx: click.Context, repo: str | None, since: float | None, project: str | None,
                    as_json: bool) -> None:
    from llmgw.control.usage_hours import hours_document
    from llmgw.settings import load_commit

    source = repo or str(Path(state_of(ctx)) / "settings.git")
    if not Path(source).exists():
        raise UsageError(f"--gpu-hours needs the settings (the replicas' sizes, prices.gpu_hour_cost): {source} is "
                         "not a settings repository; give one with --repo PATH")
    settings = load_commit(source)
    document = with_store(ctx, lambda store: hours_document(store, settings, since, project))
    if as_json:
        click.echo(json.dumps(document))
        return
    table = Table("project", "model", "requests", "GPU-hours", "core-hours", f"cost ({document['currency']})")
    for row in document["rows"]:
        table.add_row(row["project"], row["model"], str(row["requests"]), f"{row['gpu_hours']:.4f}",
                      f"{row['core_hours']:.4f}", format_cost(row["cost"]))
    table_console().print(table)
    if document["truncated"]:
        click.echo(f"only the newest {document['records']} requests were read: give a later --since", err=True)


def format_cost(cost: float) -> str:
    """`cost` (the catalog's price unit, e.g. USD) with 4 decimals, or with the first 2 significant digits when it is
    smaller than that: one Gemma request costs about 0.00002, which 4 decimals would show as 0.0000."""
    if cost == 0 or abs(cost) >= 0.001:
        return f"{cost:.4f}"
    return f"{cost:.{2 - math.floor(math.log10(abs(cost))) - 1}f}"


def request_json(request_id: str, record: UsageRecord) -> dict:
    """One request's usage record as `llmgw usage --request ID --json` prints it: `request_id` the gateway's own id,
    `client_request_id` the client's (None: it sent none), `settings_commit` the commit the replica was started
    from, `trace_id` 32 hex digits (None: untraced), `batch_id` the batch of /v1/batches it was a line of (None: an
    interactive request); times in ISO 8601 UTC (`started` is `ended` less the
    duration), durations in seconds, `cost` in the cluster's currency."""
    return {"request_id": request_id, "client_request_id": record.client_request_id, "project": record.project,
            "key_id": record.key_id, "model": record.model, "replica": record.replica, "node": record.node,
            "settings_commit": record.settings_commit, "trace_id": record.trace_id, "batch_id": record.batch_id,
            "status": record.status,
            "prompt_tokens": record.prompt_tokens, "completion_tokens": record.completion_tokens,
            "cached_tokens": record.cached_tokens, "cost": record.cost,
            "started": format_moment(record.time - record.duration_seconds), "ended": format_moment(record.time),
            "ttft_seconds": record.ttft_seconds, "duration_seconds": record.duration_seconds}


def find_request(store, request_id: str) -> list[tuple[str, UsageRecord]]:
    """The requests `request_id` names, newest first, each as (the gateway's id, record): the one whose gateway id it
    is, else those whose client sent it as its own `x-request-id` (a client may reuse one); [] when none."""
    record = store.usage_of_request(request_id)
    if record is not None:
        return [(request_id, record)]
    return store.usage_of_client_request(request_id)


def _show_request(ctx: click.Context, request_id: str, as_json: bool) -> None:
    found = with_store(ctx, lambda store: find_request(store, request_id))
    if not found:
        raise UsageError(f"The store has no usage record of request {request_id!r}. Give the id the gateway "
                         "answered in its x-request-id header (req_ and 32 hex digits, or the client's own id); a "
                         "request that just ended may still be in the gateway's usage spool while the store is "
                         "unreachable.")
    (own_id, record), others = found[0], [rid for rid, _ in found[1:]]
    doc = request_json(own_id, record)
    if others:  # the client sent this id with several requests: the newest is shown
        doc["also_matching"] = others
    if as_json:
        click.echo(json.dumps(doc))
        return
    table = Table("field", "value")
    for name, value in doc.items():
        table.add_row(name, _request_field(name, value))
    table_console().print(table)


def _request_field(name: str, value: object) -> str:
    """One field of `llmgw usage --request` for a person: cost as `format_cost`, seconds as ms or s."""
    if value is None:
        return ""
    if name == "cost":
        return format_cost(float(value))
    if name == "ttft_seconds":
        return f"{float(value) * 1000:.0f} ms"
    if name == "duration_seconds":
        return f"{float(value):.2f} s"
    if name == "also_matching":
        return "older, same id: " + ", ".join(map(str, value)) if isinstance(value, list) else str(value)
    return str(value)


def register(group: click.Group) -> None:
    """Add `keys` and `usage` to the `llmgw` command group."""
    group.add_command(keys_group)
    group.add_command(usage_command)
