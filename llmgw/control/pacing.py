"""When to rebuild the routing table: at once while a rebuild is cheap, at most a share of the loop's time when not.

Each batch of placement-relevant events asks for a new routing table (`PublishRoutingTable`, handled by
`llmgw.control.feeding.GatewayFeed`). A rebuild walked the whole fleet (`FleetRegistry.fleet`, `fleet_for`,
`build_route_table`): about a millisecond for tens of nodes, but for 2,000 nodes joining at once it ran on every batch, seconds of the trio loop's time per second
(docs/scale.md, issue 18, the stall recorder's samples). It now looks again only at the nodes whose shards changed
(`llmgw.control.routing.ReadyRoutes`), and the table itself is built per model; pacing stays for what is left. `Pacer` decides: a rebuild that last cost less than
`free` seconds runs at once (small fleets see no change); a costlier one runs at once when the previous one ended at
least `gap()` ago, else once that much time has passed, one rebuild for every request meanwhile. The gap makes
rebuilds take at most `share` of the loop's time, and never more than `longest` seconds (how stale the gateway's
table may get while a burst lasts).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class Pacer:
    """Rebuild pacing (see the module docstring). Times on the caller's clock (trio's), costs in wall seconds."""

    free: float = 0.02
    share: float = 0.1
    longest: float = 3.0
    cost: float = 0.0
    """Wall seconds the last rebuild took."""
    ended: float = field(default=-math.inf)
    """When the last rebuild ended (caller's clock)."""

    def gap(self) -> float:
        """Seconds from the end of a rebuild to the next: 0 while cheap; cost × (1/share − 1), at most `longest`."""
        if self.cost < self.free:
            return 0.0
        return min(self.longest, self.cost * (1 / self.share - 1))

    def next_at(self) -> float:
        """The earliest time the next rebuild may run."""
        return self.ended + self.gap()

    def now_ok(self, now: float) -> bool:
        """Whether a rebuild asked for at `now` runs at once (else at `next_at()`)."""
        return now >= self.next_at()

    def ran(self, cost: float, ended: float) -> None:
        """A rebuild took `cost` wall seconds and ended at `ended`."""
        self.cost, self.ended = cost, ended
