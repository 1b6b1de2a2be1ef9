"""Cards out of placement for their health (`GpuState.unhealthy`, set by the control plane from the agents'
verdicts, see `llmgw.tools.health`): the planner's one question about them. Pure.

A card out for health is not free (`llmgw.plan.capacity.Room` leaves it out and says why in the unplaced reasons),
and a shard running on one is judged like a shard of an old generation: kept while it still serves, until its
replica is ready elsewhere, then stopped; stopped at once when it no longer runs.
"""

from __future__ import annotations

from collections.abc import Iterable

from llmgw.plan.types import NodeState


def unhealthy_devices(node: NodeState, devices: Iterable[str]) -> tuple[str, ...]:
    """The device ids among `devices` that `node` has and a health finding takes out of placement, in the order
    given (() when none: also for devices the node does not list)."""
    if not devices:
        return ()
    out = {gpu.device_id for gpu in node.gpus if gpu.unhealthy}
    return tuple(d for d in devices if d in out) if out else ()
