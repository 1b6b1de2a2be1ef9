"""Nodes placement keeps replicas off: cordoned, drained, or lent to Slurm. Pure.

- `serving.cordoned` (llmgw.yaml; `llmgw node cordon`): no new replica; replicas already there keep running.
- `serving.drained` (`llmgw node drain`): no new replica, and the node's replicas are placed elsewhere first, then
  stopped there (as a rolling replica: the old shard serves until its replacement is ready). With no room
  elsewhere, a drained node keeps serving its replicas and the reason says why.
- `slurm.yaml` `nodes.<node>.lent: true` (`llmgw slurm lend`): drained the same way, but lending does not wait for
  room elsewhere: a replica with no place to go is stopped.
- `serving.max_inlet_celsius`: a node whose board inlet reads above it (`NodeState.inlet_too_hot`, judged by
  `inlet_verdict` on each heartbeat) gets no new replica while it stays above; replicas there keep running.
`llmgw node uncordon` clears both lists for the node; reclaiming from Slurm clears `lent`, and the node stays closed
while its agent reports Slurm job steps running there (the agent drains it in Slurm first, so no new job starts).
"""

from __future__ import annotations

from collections.abc import Iterable

from llmgw.plan.types import NodeState
from llmgw.settings.model import Settings


def closed_nodes(settings: Settings, nodes: Iterable[NodeState] = ()) -> dict[str, str]:
    """Node id -> why placement puts no new replica there (a phrase for the planner's reasons); {} when none.
    `nodes` (the fleet) tell which reclaimed nodes still run Slurm job steps."""
    closed = {node: "cordoned (serving.cordoned in llmgw.yaml): no new replicas" for node in settings.cluster.cordoned}
    closed.update({node: "drained (serving.drained in llmgw.yaml): replicas move elsewhere"
                   for node in settings.cluster.drained})
    closed.update({node: "lent to Slurm (slurm.yaml): no replicas while lent" for node in settings.slurm.lent})
    for node in nodes:
        if node.inlet_too_hot and node.node_id not in closed:
            closed[node.node_id] = node.inlet_too_hot
        if node.slurm_job_steps and node.node_id in settings.slurm.nodes and node.node_id not in closed:
            closed[node.node_id] = (f"being reclaimed from Slurm: drained there, waiting for its last "
                                    f"{node.slurm_job_steps} job step(s) to end")
    return closed


def inlet_verdict(inlet_celsius: float | None, max_inlet_celsius: float | None) -> str:
    """Why a node whose board inlet reads `inlet_celsius` (degrees C; None: not measured) gets no new replica under
    `serving.max_inlet_celsius` (None: no limit): "" when it may take one (at or below the limit, or not measured:
    an unmeasured inlet is never taken for a hot one). The reason names the limit, not the reading, so it changes
    only when the node crosses the limit (the reading itself is on the node page and in /metrics)."""
    if inlet_celsius is None or max_inlet_celsius is None or inlet_celsius <= max_inlet_celsius:
        return ""
    return (f"board inlet above serving.max_inlet_celsius ({max_inlet_celsius:g} °C): no new replicas until it "
            "cools")


def evicted_nodes(settings: Settings) -> frozenset[str]:
    """Node ids whose replicas are placed elsewhere first, then stopped: drained and lent nodes."""
    return frozenset(settings.cluster.drained) | settings.slurm.lent
