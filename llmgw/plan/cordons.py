"""Nodes placement keeps replicas off: cordoned, drained, or lent to Slurm. Pure.

- `serving.cordoned` (llmgw.yaml; `llmgw node cordon`): no new replica; replicas already there keep running.
- `serving.drained` (`llmgw node drain`): no new replica, and the node's replicas are placed elsewhere first, then
  stopped there (as a rolling replica: the old shard serves until its replacement is ready). With no room
  elsewhere, a drained node keeps serving its replicas and the reason says why.
- `slurm.yaml` `nodes.<node>.lent: true` (`llmgw slurm lend`): drained the same way, but lending does not wait for
  room elsewhere: a replica with no place to go is stopped.
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
        if node.slurm_job_steps and node.node_id in settings.slurm.nodes and node.node_id not in closed:
            closed[node.node_id] = (f"being reclaimed from Slurm: drained there, waiting for its last "
                                    f"{node.slurm_job_steps} job step(s) to end")
    return closed


def evicted_nodes(settings: Settings) -> frozenset[str]:
    """Node ids whose replicas are placed elsewhere first, then stopped: drained and lent nodes."""
    return frozenset(settings.cluster.drained) | settings.slurm.lent
