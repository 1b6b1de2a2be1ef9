"""The engines' own load, read by the agent on their node: each ready shard's `/metrics` (llama-server started with
`--metrics`, vLLM, SGLang with `--enable-metrics`; the engine module's METRICS_PATH), reduced by
`llmgw.tools.engine_metrics` to requests running and waiting, KV-cache use, token and prefix-cache counters.

Read with every reading (`telemetry_interval`), and carried by the heartbeats in each shard's ProcessGroupSample
(`engine`), so the control plane exports them per replica (`llmgw_engine_*` on /metrics) without reaching into
the nodes. The request carries the replica key (engines guard /metrics with their API key). An engine that does
not answer 200 in `timeout` seconds, or answers something that is not Prometheus text, is left out of that
reading (logged at debug level): its series are absent, never 0.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import httpx
import trio

from llmgw.agent.shards import ShardSpec, ShardView, local_url
from llmgw.engines import get_engine
from llmgw.errors import LlmgwError
from llmgw.identity import ShardState
from llmgw.tools.engine_metrics import EngineLoad, parse_engine_metrics
from llmgw.tools.values import ParseError
from llmgw.http_trust import default_verify

log = logging.getLogger("llmgw.agent")

SCRAPE_TIMEOUT = 2.0
"""Seconds one engine's /metrics may take (a busy engine answers within milliseconds)."""


async def read_engine_loads(views: Iterable[ShardView], *, timeout: float = SCRAPE_TIMEOUT,
                            transport: httpx.AsyncBaseTransport | None = None) -> dict[str, EngineLoad]:
    """{shard id: EngineLoad} of every READY shard in `views` whose engine answered, read concurrently. A
    checkpoint; takes at most about `timeout` seconds. `transport`: for tests (default: real HTTP)."""
    loads: dict[str, EngineLoad] = {}
    ready = [v for v in views if v.state is ShardState.READY and v.spec is not None and v.spec.port]
    if not ready:
        return loads
    async with httpx.AsyncClient(timeout=timeout, transport=transport, verify=default_verify()) as client:
        async with trio.open_nursery() as nursery:
            for view in ready:
                nursery.start_soon(_read_one, client, view, loads)
    return loads


async def _read_one(client: httpx.AsyncClient, view: ShardView, loads: dict[str, EngineLoad]) -> None:
    assert view.spec is not None
    load = await read_engine_load(client, view.spec)
    if load is not None:
        loads[view.spec.shard_id] = load


async def read_engine_load(client: httpx.AsyncClient, spec: ShardSpec) -> EngineLoad | None:
    """One reading of the engine of `spec` (its /metrics through `client`, with the replica key), or None when the
    engine is unknown to this agent, did not answer 200, or answered something that is not Prometheus text (logged
    at debug level). A checkpoint."""
    try:
        module = get_engine(spec.engine.split("@", 1)[0])
    except LlmgwError:
        return None  # an engine this agent does not know: nothing to read
    key = spec.env.get(module.API_KEY_ENV)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    url = local_url(spec, module.METRICS_PATH)
    try:
        response = await client.get(url, headers=headers)
    except httpx.HTTPError as exc:
        log.debug("shard %s: %s: %s", spec.shard_id, url, exc)
        return None
    if response.status_code != 200:
        log.debug("shard %s: %s answered %d", spec.shard_id, url, response.status_code)
        return None
    try:
        return parse_engine_metrics(response.text, module.METRICS.candidates())
    except ParseError as exc:
        log.debug("shard %s: %s", spec.shard_id, exc)
        return None
