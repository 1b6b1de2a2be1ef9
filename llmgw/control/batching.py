"""The control plane's part in `/v1/batches`: where the batch runner runs and what it reads of the fleet.

`open_wiring` starts one `llmgw.gateway.BatchRunner` per control plane beside its gateway (`run_batches`); it works
only while this control plane holds the leader lease (`plane.leader`), so one runner at a time claims lines, and the
next leader resumes every active batch from the store. With the gateway in this process, the runner sends its lines
through that gateway (the balancer's load includes the interactive requests in flight). With gateway worker
processes, it sends them through a gateway of its own that serves no port, fed the same routing table, whose
balancer counts the workers' requests in flight as `elsewhere` (`GatewayWorkers.outstanding`).
What an engine says is queued (`requests_waiting` of its shards' fresh readings: llama.cpp requests_deferred, vLLM
num_requests_waiting) comes from the fleet's state (`engine_waiting`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import trio

from llmgw.control.registry import FleetRegistry
from llmgw.gateway import BatchRunner, Gateway

LOAD_INTERVAL = 0.2
"""Seconds between two copies of the gateway workers' load into the runner's own gateway."""


def engine_waiting(fleet: FleetRegistry, now: float) -> Mapping[str, int]:
    """Requests each replica's engine reports queued, by replica id, from the fresh readings of `fleet` at `now`
    (control-plane clock seconds); a replica without such a reading is left out (read as 0). Pure."""
    waiting: dict[str, int] = {}
    for record in fleet.records():
        readings = record.readings
        if readings is None or not readings.fresh(now):
            continue
        shards = {s.shard_id: s for s in record.state.shards}
        for reading in readings.shards:
            shard = shards.get(reading.shard_id)
            if shard is not None and reading.engine is not None and reading.engine.requests_waiting:
                waiting[shard.replica_id] = waiting.get(shard.replica_id, 0) + int(reading.engine.requests_waiting)
    return waiting


async def run_batches(plane: Any, gateway: Gateway | None, workers: Any = None) -> None:
    """Run the batch runner of `plane` until cancelled: through `gateway` (the one serving in this process), or,
    with `workers` (`GatewayWorkers`), through a gateway of its own fed `plane.feed`'s tables and the workers' load."""

    def waiting(replica_id: str) -> int:
        return engine_waiting(plane.loop.state.fleet, trio.current_time()).get(replica_id, 0)

    async with trio.open_nursery() as nursery:
        if gateway is None:
            gateway = Gateway(plane.store, plane.feed.table, spool_dir=plane.state_dir / "usage-spool" / "batches")
            plane.feed.attach(gateway)
            nursery.start_soon(gateway.accounting.run)
            nursery.start_soon(_copy_load, gateway, workers)
        runner = BatchRunner(gateway, plane.holder, leading=lambda: plane.leader, waiting=waiting)
        await runner.run()


async def _copy_load(gateway: Gateway, workers: Any) -> None:
    while True:
        gateway.balancer.set_elsewhere(workers.outstanding())
        await trio.sleep(LOAD_INTERVAL)
