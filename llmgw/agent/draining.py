"""Draining a shard before it stops: its requests in flight finish, up to a drain timeout.

A StopShard (a replica replaced by a settings change, scaled down, moved off a cordoned or drained node) is carried
out in this order (`llmgw.agent.shard_commands`, `Supervisor.stop`):

1. the shard is reported STOPPING at once (`NodeAgent.on_shard_change`): the routing tables leave it out from the
   next rebuild (`llmgw.control.routing.ReadyRoutes` takes READY shards only), on every control plane;
2. the agent reads the engine's own count of requests running and waiting (its /metrics, `llmgw.agent.engine_load`)
   every `POLL` seconds, until it has read idle for `QUIET` seconds without a break, or `timeout` seconds passed;
3. only then is the engine sent SIGTERM (SIGKILL after the shard's stop grace).

`QUIET` covers the time a routing table takes to reach every gateway (the shard's report, a rebuild, the gateway
workers' feed): a request routed there meanwhile shows in the engine's count and restarts the wait. An engine
that gives no count (no /metrics, not Prometheus text, not answering) is stopped after `QUIET` seconds: leaving
the tables first is all that can be done for it; one that gave a count and then fails to (a busy engine slow to
answer) reads as busy. A request that still reaches a stopped engine is refused at
connect, which the gateway retries on another replica (`llmgw.gateway.proxying`).
"""

from __future__ import annotations

import logging
from typing import Literal

import httpx
import trio

from llmgw.agent.engine_load import SCRAPE_TIMEOUT, read_engine_load
from llmgw.agent.shards import ShardSpec
from llmgw.tools.engine_metrics import EngineLoad
from llmgw.http_trust import default_verify

log = logging.getLogger("llmgw.agent")

QUIET = 1.0
"""Seconds the engine must read idle, without a break, before it is stopped."""
POLL = 0.2
"""Seconds between two readings of the engine's count."""

Verdict = Literal["idle", "timeout"]


def busy_requests(load: EngineLoad | None, counted_before: bool) -> int:
    """Requests the engine runs or holds waiting in `load`. No reading (None) is 0 for an engine that never gave
    one during this drain, 1 (busy) for one that did (`counted_before`): a busy engine may answer slowly. Pure."""
    if load is None:
        return 1 if counted_before else 0
    return int((load.requests_running or 0) + (load.requests_waiting or 0))


def drain_verdict(started: float, now: float, idle_since: float | None, timeout: float,
                  quiet: float = QUIET) -> Verdict | None:
    """Whether a draining engine may be stopped at `now` (seconds, any one clock): "idle" when it has read idle
    since `idle_since` for `quiet` seconds, "timeout" when `timeout` seconds passed since the drain `started`;
    None: read again. `idle_since`: the first of the unbroken run of idle readings up to now (None: the last
    reading was busy). Pure."""
    if idle_since is not None and now - idle_since >= quiet:
        return "idle"
    if now - started >= timeout:
        return "timeout"
    return None


async def drain_engine(spec: ShardSpec, timeout: float, *, quiet: float = QUIET, poll: float = POLL,
                       transport: httpx.AsyncBaseTransport | None = None) -> Verdict:
    """Wait until the engine of `spec` has finished its requests (see the module docstring), at most `timeout`
    seconds (plus one reading's `SCRAPE_TIMEOUT`). Returns "idle" or "timeout" (logged, with the requests cut).
    A checkpoint; raises nothing but cancellation. `transport`: for tests (default: real HTTP)."""
    started = trio.current_time()
    idle_since: float | None = None
    busy = 0
    counted = False
    async with httpx.AsyncClient(timeout=SCRAPE_TIMEOUT, transport=transport, verify=default_verify()) as client:
        while True:
            load = await read_engine_load(client, spec)
            busy = busy_requests(load, counted)
            counted = counted or load is not None
            now = trio.current_time()
            idle_since = None if busy else (now if idle_since is None else idle_since)
            verdict = drain_verdict(started, now, idle_since, timeout, quiet)
            if verdict is not None:
                break
            await trio.sleep(poll)
    took = trio.current_time() - started
    if verdict == "timeout":
        log.warning("shard %s: %d request(s) still on the engine after the drain timeout (%.0f s); stopping it",
                    spec.shard_id, busy, timeout)
    else:
        log.info("shard %s drained in %.1f s", spec.shard_id, took)
    return verdict
