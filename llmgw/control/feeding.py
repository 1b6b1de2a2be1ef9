"""`GatewayFeed`: the handler of `PublishRoutingTable` and of the agents' prefix-cache blocks: what the gateway (in
this process, or its worker processes) routes by.

    feed = GatewayFeed(replica_key, secret)
    feed.publish_now(state)                  # the table of a state, before the gateway serves
    await feed.publish(PublishRoutingTable(state, at_once=False))   # paced (llmgw.control.pacing)

Each replica's measured speed (`set_speeds`, from `llmgw bench`'s results and the engines' counters:
`llmgw.control.speeds`) goes into the table with its replica. A rebuild reads only the nodes whose shards changed (`llmgw.control.routing.ReadyRoutes`); rebuilds are paced by
what one costs, a paced one builds from the latest state it was handed. The gateways are attached once they serve
(`attach`); a table equal to the one they have is not handed again.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import trio

from llmgw.control.canaries import route_canaries
from llmgw.control.effects import PublishRoutingTable
from llmgw.control.pacing import Pacer
from llmgw.control.routing import ReadyRoutes, build_route_table
from llmgw.control.speeds import routing_changed
from llmgw.control.state import ControlState
from llmgw.routes import BlockSnapshot, ReplicaSpeed, RouteTable


class GatewayFeed:
    """The routing table (`table`, how many builds: `rebuilds`) and the gateways it goes to (`gateways`: objects
    with `set_table(table)` and `set_blocks(snapshot)`). `nursery` (set by the control plane once running) holds
    the paced rebuilds."""

    def __init__(self, replica_key: Callable[[str], str], secret: Callable[[str], str | None]):
        self.table = RouteTable()
        self.rebuilds = 0
        self.gateways: list[Any] = []
        self.nursery: trio.Nursery | None = None
        self._replica_key = replica_key
        self._secret = secret
        self._ready = ReadyRoutes(replica_key)  # the ready replicas by model, kept per node
        self._pacer = Pacer()
        self._latest: ControlState | None = None  # the state a paced rebuild builds from
        self._wanted: trio.Event | None = None  # a paced rebuild is waiting (this event names it)
        self.speeds: Mapping[str, ReplicaSpeed] = {}  # measured speed by replica id (llmgw.control.speeds)

    def attach(self, gateway: Any) -> None:
        """Hand `gateway` the table now and every later one."""
        self.gateways.append(gateway)
        gateway.set_table(self.table)

    async def publish(self, effect: PublishRoutingTable) -> None:
        """Rebuild now (`at_once`, or while rebuilds are cheap), or once the pacer allows, from the latest state."""
        self._latest = effect.state
        if effect.at_once or self._pacer.now_ok(trio.current_time()) or self.nursery is None:
            self._wanted = None
            self.publish_now(effect.state)
        elif self._wanted is None:
            self._wanted = trio.Event()
            self.nursery.start_soon(self._paced, self._wanted)

    async def _paced(self, wanted: trio.Event) -> None:
        await trio.sleep_until(self._pacer.next_at())
        if self._wanted is wanted and self._latest is not None:
            self._wanted = None
            self.publish_now(self._latest)

    def publish_now(self, state: ControlState) -> None:
        """Build the table of `state` and hand it to the gateways when it changed. Not a checkpoint."""
        began = time.perf_counter()
        self._ready.sync(state.fleet)  # only the nodes whose shards changed are looked at again
        table = build_route_table(state.settings, self._ready, self._replica_key, self._secret, self.speeds,
                                  route_canaries(state.canaries) if state.canaries else {})
        self.rebuilds += 1
        if table != self.table:
            self.table = table
            for gateway in self.gateways:
                gateway.set_table(table)
        self._pacer.ran(time.perf_counter() - began, trio.current_time())

    def set_speeds(self, speeds: Mapping[str, ReplicaSpeed], state: ControlState) -> None:
        """Route by `speeds` (replica id -> measured speed) from now on: the table of `state` is built again with
        them when routing by them differs (`llmgw.control.speeds.routing_changed`: a figure moved by more than
        10 %, a replica gained or lost one); else the next table built carries them. Not a checkpoint."""
        if speeds != self.speeds:
            changed = routing_changed(self.speeds, speeds)
            self.speeds = dict(speeds)
            if changed:
                self.publish_now(state)

    def blocks_changed(self, snapshot: BlockSnapshot) -> None:
        """The agents' vLLM shards' held blocks changed: the gateways route by them from the next request on."""
        for gateway in self.gateways:
            gateway.set_blocks(snapshot)
