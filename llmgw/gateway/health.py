"""Health checks of the routing table's replicas: probe each one, eject it from routing when it fails, readmit it
when it answers again.

`HealthProbes` does the I/O; when to probe is decided by the pure `probing.probe_schedule` (each replica at its own
phase of the interval). A probe is GET /health of an engine (external endpoints: GET /v1/models with their key)
within max(1 s, interval); a 200 readmits the replica (`Balancer.readmit`), anything else (another status, no answer,
a failed connection) ejects it for the balancer's cooldown (`Balancer.eject`). The gateway owns one
(`Gateway.check_health`, `Gateway.watch_health`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import trio

from llmgw.gateway.probing import probe_schedule
from llmgw.gateway.routing import Balancer
from llmgw.gateway.upstream import UpstreamFailure, UpstreamPool
from llmgw.routes import ReplicaRoute


class HealthProbes:
    """Probes of replicas through `pool`, their verdicts applied to `balancer`; `interval` seconds between two
    probes of one replica (`watch`), at most `concurrency` probes at once."""

    def __init__(self, pool: UpstreamPool, balancer: Balancer, interval: float, concurrency: int):
        self.pool = pool
        self.balancer = balancer
        self.interval = interval
        self._slots = trio.CapacityLimiter(concurrency)
        self._probing: set[str] = set()  # replica ids whose probe runs now

    async def check(self, replicas: Mapping[str, ReplicaRoute]) -> None:
        """Probe every replica of `replicas` (id -> replica) once, now, and return when all are done."""
        async with trio.open_nursery() as nursery:
            for replica in replicas.values():
                nursery.start_soon(self._probe_in_slot, replica)

    async def watch(self, replicas: Callable[[], Mapping[str, ReplicaRoute]]) -> None:
        """Probe each replica of `replicas()` (id -> replica, read again at each probe's time) once every
        `interval` seconds until cancelled, the first time one interval after the start: each replica at its own
        phase of the interval (`probing.probe_phase`, from its id). A replica whose previous probe has not finished
        is not probed again; one that joined the table during an interval is first probed in the next one. When
        probes fall behind (every slot taken by replicas that do not answer), the next interval starts when the
        last probe of this one has started, not earlier."""
        interval = self.interval
        start = trio.current_time() + interval
        async with trio.open_nursery() as nursery:
            while True:
                await trio.sleep_until(start)
                for offset, replica_id in probe_schedule(replicas(), interval):
                    await trio.sleep_until(start + offset)
                    replica = replicas().get(replica_id)  # still in the table now?
                    if replica is None or replica_id in self._probing:
                        continue
                    slot = object()
                    await self._slots.acquire_on_behalf_of(slot)
                    self._probing.add(replica_id)
                    nursery.start_soon(self._probe_holding, replica, slot)
                start = max(start + interval, trio.current_time())

    async def _probe_in_slot(self, replica: ReplicaRoute) -> None:
        slot = object()
        await self._slots.acquire_on_behalf_of(slot)
        await self._probe_holding(replica, slot)

    async def _probe_holding(self, replica: ReplicaRoute, slot: object) -> None:
        try:
            await self.probe(replica)
        finally:
            self._probing.discard(replica.replica_id)
            self._slots.release_on_behalf_of(slot)

    async def probe(self, replica: ReplicaRoute) -> None:
        """Probe `replica` once (see the module docstring) and readmit or eject it. Never raises a probe's
        failure; a checkpoint."""
        path = "/v1/models" if replica.external else "/health"
        headers = [(b"authorization", b"Bearer " + replica.replica_key.encode())] if replica.replica_key else []
        healthy = False
        with trio.move_on_after(max(1.0, self.interval)):
            try:
                response = await self.pool.request("GET", replica.base_url.rstrip("/") + path, headers, b"")
                try:
                    await response.read()
                    healthy = response.status == 200
                finally:
                    await response.aclose()
            except UpstreamFailure:
                healthy = False
        if healthy:
            self.balancer.readmit(replica.replica_id)
        else:
            self.balancer.eject(replica.replica_id, trio.current_time())
