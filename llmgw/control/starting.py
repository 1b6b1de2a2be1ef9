"""Shards on their way: a START sent to a node and not yet reported by it counts as a pending shard there.

Without this, a pass that runs between sending a START and the agent's first report of the shard (a heartbeat or a
shard status, tens of milliseconds later, longer under load) sees the replica nowhere and places it again on
another node: the same replica starts on several nodes and all but one are stopped again (measured with
bench/fleet_scale.py: 12 nodes joining one by one started one replica on 8 of them). Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from llmgw.control.state import ActionKey, InFlight
from llmgw.plan.types import ActionKind, Fleet, ObservedShard, ShardState

_STARTS = (ActionKind.START, ActionKind.RESTART)


def with_starts_in_flight(fleet: Fleet, in_flight: Mapping[ActionKey, InFlight]) -> Fleet:
    """`fleet` with each START in flight whose shard its node does not report yet added to that node as a PENDING
    shard holding the assignment's devices, cores and memory; `fleet` itself when there is none. Nodes that are not
    alive get nothing (their commands were lost with them)."""
    pending: dict[str, list[ObservedShard]] = {}
    for (kind, node_id, shard_id), flight in in_flight.items():
        action = flight.action
        assignment = action.assignment
        if kind != "start" or action.kind not in _STARTS or assignment is None:
            continue
        pending.setdefault(node_id, []).append(ObservedShard(
            shard_id=shard_id, replica_id=assignment.replica_id, model=assignment.model, state=ShardState.PENDING,
            fingerprint=assignment.fingerprint, devices=assignment.devices, cpu_cores=assignment.cpu_cores,
            memory_bytes=assignment.memory_bytes, rank=assignment.rank, group=assignment.group))
    if not pending:
        return fleet
    nodes = []
    for node in fleet.nodes:
        extra = pending.get(node.node_id)
        if extra and node.alive:
            known = {s.shard_id for s in node.shards}
            extra = [s for s in extra if s.shard_id not in known]
            if extra:
                node = replace(node, shards=tuple(sorted((*node.shards, *extra), key=lambda s: s.shard_id)))
        nodes.append(node)
    return Fleet(nodes=tuple(nodes))
