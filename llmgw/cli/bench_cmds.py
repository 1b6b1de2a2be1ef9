"""`llmgw bench MODEL|REPLICA`: measure what a replica does under a load of chosen prompt and output lengths and
concurrency, through its replica key (or through the gateway with --via-gateway), and keep the result in the store.

    llmgw bench gemma-3-270m --prompt-tokens 512 --output-tokens 128 --concurrency 4 --requests 32
    llmgw bench gemma-3-270m-0 --json                      # one replica, by id
    llmgw bench gemma-3-270m --via-gateway --key sk-llmgw-...
    llmgw bench my-model --engine-url http://10.0.0.5:8080 --key KEY   # any OpenAI-compatible engine

The target is found through the admin API (`GET /api/v1/nodes`: a replica id, or the first ready replica of a
model), its replica key worked out from the store's "engine-key" secret (`llmgw.control.keys`), so this runs on
the control plane's machine or with --store. Prints TTFT, inter-token latency and decode tokens/s percentiles
(`llmgw.control.bench_stats`); keeps one row per run in the store (`llmgw.store.benches`), which `llmgw nodes`
shows under each replica. Exit status 0, 1 on an error (nothing answered), 2 when some requests failed.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from llmgw.cli.credentials import remember_store, store_options
from llmgw.errors import UsageError


@dataclass(frozen=True)
class Target:
    """Where a bench goes. `base_url`: the engine's or gateway's root; `replica` "" through the gateway (any
    replica); `node_class` "2x H200", "cpu 16 cores", "" unknown."""

    model: str
    replica: str
    node: str
    node_class: str
    base_url: str


def node_class(node: dict[str, Any], devices: list[str]) -> str:
    """The class of the part of `node` (an admin API node document) a replica with `devices` runs on: "<count>x
    <GPU class>" (classes joined by "+" when mixed), or "cpu <cores> cores" without devices. Pure."""
    if not devices:
        return f"cpu {float(node.get('cpu_cores') or 0):g} cores"
    classes = node.get("gpu_classes") or {}
    names = sorted({classes.get(device, "GPU") for device in devices})
    return f"{len(devices)}x {'+'.join(names)}"


def resolve_target(nodes: dict[str, Any], target: str) -> Target:
    """The replica `target` names in `nodes` (GET /api/v1/nodes's "nodes"): the replica with that id, else the
    first ready replica of the model of that name (by node id, then shard id). Reads ready shards with a port only.
    Raises UsageError naming what is there when none fits. Pure."""
    ready = []
    for node_id in sorted(nodes):
        node = nodes[node_id]
        for shard_id in sorted(node.get("shards", {})):
            shard = node["shards"][shard_id]
            if shard.get("state") == "ready" and shard.get("port") and not shard.get("foreign"):
                ready.append((node_id, node, shard))
    for wanted in ("replica", "model"):
        for node_id, node, shard in ready:
            if shard.get(wanted) == target:
                return Target(shard["model"], shard["replica"], node_id,
                              node_class(node, list(shard.get("devices", ()))),
                              f"http://{node['address']}:{shard['port']}")
    known = sorted({f"{shard['replica']} ({shard['model']})" for _, _, shard in ready})
    raise UsageError(f"no ready replica or model is called {target!r}; ready now: {', '.join(known) or 'none'} "
                     "(see `llmgw replicas`)")


def bench_line(record) -> str:
    """One line for `llmgw nodes` under a replica: its latest bench (a `llmgw.store.BenchRecord`). Pure."""
    def ms(seconds: float | None) -> str:
        return "-" if seconds is None else f"{seconds * 1000:.0f} ms"

    when = time.strftime("%Y-%m-%d %H:%M", time.gmtime(record.time))
    return (f"bench {when}Z: {record.prompt_tokens} in/{record.output_tokens} out x{record.concurrency} via "
            f"{record.via}: TTFT p50 {ms(record.ttft_p50_seconds)} p90 {ms(record.ttft_p90_seconds)}, ITL p50 "
            f"{ms(record.itl_p50_seconds)}, {record.output_tokens_per_second:.1f} tokens/s "
            f"({record.node_class or 'class unknown'}, build {record.engine_build or 'unknown'})")


def latest_benches(state_dir: Path | None) -> dict[str, Any]:
    """The latest bench per replica id in the store of `state_dir` (`--state`; $LLMGW_STATE; .state), {} when no
    store is found or it cannot be read now (`llmgw nodes` run away from the control plane shows no benches)."""
    from llmgw.errors import LlmgwError

    try:
        store = _open_store(state_dir, None)
    except LlmgwError:  # no store here, or one that refuses: the nodes are shown all the same
        return {}
    try:
        latest: dict[str, Any] = {}
        for record in store.benches(limit=1000):
            latest.setdefault(record.replica, record)
        return latest
    finally:
        store.close()


def _admin_documents(url: str | None, token: str | None, state_dir: Path | None) -> tuple[dict, dict]:
    """(the nodes document, the status's control_plane section) of the running control plane."""
    from llmgw.control.client import AdminClient, admin_ca_file, resolve_admin

    url, token = resolve_admin(url, token, state_dir)
    with AdminClient(url, token, ca_file=admin_ca_file(state_dir)) as client:
        return client.get("/api/v1/nodes")["nodes"], client.get("/api/v1/status").get("control_plane", {})


def _open_store(state_dir: Path | None, store_url: str | None):
    from llmgw.cli.credentials import resolve_store_url
    from llmgw.store import open_store

    return open_store(resolve_store_url(state_dir or os.environ.get("LLMGW_STATE") or ".state", store_url))


def _replica_key(state_dir: Path | None, store_url: str | None, replica: str) -> str:
    from llmgw.control.keys import REPLICA_KEY_SECRET, replica_key

    store = _open_store(state_dir, store_url)
    try:
        return replica_key(store.get_or_create_secret(REPLICA_KEY_SECRET), replica)
    finally:
        store.close()


def _run(load, as_json: bool):
    """Run `load` with a progress bar on stderr (none with --json or when stderr is not a terminal)."""
    import trio
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from llmgw.control.benching import run_load

    console = Console(stderr=True)
    with Progress(TextColumn("bench"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console,
                  transient=True, disable=as_json or not console.is_terminal) as progress:
        task = progress.add_task("bench", total=load.requests)
        return trio.run(run_load, load, lambda timing: progress.advance(task))


def register(group: click.Group) -> None:
    """Add `bench` to `group`."""

    @group.command("bench")
    @click.argument("target")
    @click.option("--prompt-tokens", type=click.IntRange(1), default=128, show_default=True,
                  help="Prompt length of each request, in tokens (settled by a warm-up request).")
    @click.option("--output-tokens", type=click.IntRange(1), default=64, show_default=True,
                  help="Completion tokens of each request (`ignore_eos`: every answer runs to this length).")
    @click.option("--concurrency", type=click.IntRange(1), default=1, show_default=True,
                  help="Requests in flight at once.")
    @click.option("--requests", "request_count", type=click.IntRange(1), default=8, show_default=True,
                  help="Requests in all (after one warm-up request).")
    @click.option("--via-gateway", is_flag=True,
                  help="Go through the gateway (with an API key: --key or $LLMGW_API_KEY) instead of the engine.")
    @click.option("--gateway-url", envvar="LLMGW_GATEWAY_URL", default=None,
                  help="The gateway's root URL [default: the control plane's, from its status].")
    @click.option("--engine-url", default=None,
                  help="Bench this engine's root URL directly (TARGET is then the model name it serves).")
    @click.option("--key", envvar="LLMGW_API_KEY", default=None,
                  help="Bearer key: an API key with --via-gateway, the engine's key with --engine-url.")
    @click.option("--timeout", type=float, default=300.0, show_default=True, help="Seconds one request may take.")
    @click.option("--no-save", is_flag=True, help="Do not keep the result in the store.")
    @click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON object.")
    @click.option("--url", envvar="LLMGW_ADMIN_URL", default=None, help="Admin API URL [default: <state>/admin-url].")
    @click.option("--token", envvar="LLMGW_ADMIN_TOKEN", default=None,
                  help="Admin token [default: $LLMGW_ADMIN_TOKEN, then <state>/admin-token].")
    @store_options
    @click.pass_context
    def bench_command(ctx: click.Context, target: str, prompt_tokens: int, output_tokens: int, concurrency: int,
                      request_count: int, via_gateway: bool, gateway_url: str | None, engine_url: str | None,
                      key: str | None, timeout: float, no_save: bool, as_json: bool, url: str | None,
                      token: str | None, state_dir: str | None, store_url: str | None) -> None:
        """Measure TARGET (a replica id or a model name) under a load: TTFT, inter-token latency, tokens/s."""
        from llmgw.control.bench_stats import render, summarize
        from llmgw.control.benching import BenchLoad
        from llmgw.store import BenchRecord

        remember_store(ctx, state_dir, store_url)
        state = Path(state_dir) if state_dir else None
        if engine_url:
            where = Target(target, target, "", "", engine_url.rstrip("/"))
            via = "engine"
        elif via_gateway:
            if not key:
                raise UsageError("--via-gateway needs an API key of a project that may use the model: --key or "
                                 "$LLMGW_API_KEY (`llmgw keys create --project PROJECT`)")
            if not gateway_url:
                gateway_url = _admin_documents(url, token, state)[1].get("gateway_url") or ""
                if not gateway_url:
                    raise UsageError("the control plane runs no gateway: give the gateway's URL with --gateway-url")
            where = Target(target, "", "", "", gateway_url.rstrip("/"))
            via = "gateway"
        else:
            where = resolve_target(_admin_documents(url, token, state)[0], target)
            key = _replica_key(state, store_url, where.replica)
            via = "engine"
        load = BenchLoad(where.base_url, key, where.model, prompt_tokens, output_tokens, concurrency,
                         request_count, timeout)
        run = _run(load, as_json)
        summary = summarize(run.timings, run.wall_seconds)
        record = BenchRecord(
            time=time.time(), replica=where.replica or f"gateway/{where.model}", model=where.model, node=where.node,
            node_class=where.node_class, engine_build=run.engine_build, via=via, prompt_tokens=prompt_tokens,
            output_tokens=output_tokens, concurrency=concurrency, requests=request_count,
            ttft_p50_seconds=summary.ttft.p50, ttft_p90_seconds=summary.ttft.p90, itl_p50_seconds=summary.itl.p50,
            output_tokens_per_second=summary.output_tokens_per_second,
            summary={**summary.to_json(), "engine_slots": run.slots})
        kept = "" if no_save else _keep(record, state, store_url, explicit=bool(store_url or state_dir))
        if as_json:
            click.echo(json.dumps({"target": where.__dict__, "via": via, "engine_build": run.engine_build,
                                   "engine_slots": run.slots,
                                   "prompt_tokens": prompt_tokens, "output_tokens": output_tokens,
                                   "concurrency": concurrency, "kept": kept, "summary": summary.to_json()}, indent=2))
        else:
            on = f" on {where.node} ({where.node_class})" if where.node else ""
            click.echo(f"{record.replica} ({where.model}){on}, engine build {run.engine_build or 'unknown'}, via "
                       f"{via}: {prompt_tokens} prompt and {output_tokens} output tokens per request, "
                       f"concurrency {concurrency}")
            for line in render(summary):
                click.echo(line)
            if kept:
                click.echo(kept)
        if summary.failed:
            raise click.exceptions.Exit(2)


def _keep(record, state: Path | None, store_url: str | None, *, explicit: bool) -> str:
    """Write `record` to the store; a line saying where (or, when no store was named and none is found, why not)."""
    try:
        store = _open_store(state, store_url)
    except UsageError as exc:
        if explicit:
            raise
        return f"not kept: {exc}"
    try:
        bench_id = store.record_bench(record)
        return f"kept as bench {bench_id} in {store.url}"
    finally:
        store.close()
