"""Headroom: what the fleet has left, per GPU class and for CPU, now and once a plan is carried out. Pure.

"Before" counts what the shards observed on alive nodes hold now (pending, fetching, starting, ready and
stopping shards, engines llmgw did not start included). "After" counts what the plan's assignments hold once it
converged, plus what engines llmgw did not start keep holding (the planner never stops them); old generations of
rolling replicas are gone by then. Nodes not alive count for nothing. A GPU with foreign processes is not
placeable, so it is neither total nor free. Pass the fleet as the plan saw it (`fleet_for(fleet, settings)`, so
GPUs the agent settings ignore and reserved cores and memory are already left out).
"""

from __future__ import annotations

from dataclasses import dataclass

from llmgw.plan.planning import _HOLDING  # the shard states that hold devices, cores and memory
from llmgw.plan.types import Fleet, NodeState, Plan


@dataclass(frozen=True)
class GpuHeadroom:
    """Devices of one GPU class on alive nodes: placeable `devices`, free before and after the plan.

    `largest_before` / `largest_after`: the most free devices of the class on any one node (what the biggest
    tensor-parallel replica on one node can still get).
    """

    gpu_class: str
    devices: int
    free_before: int
    free_after: int
    largest_before: int
    largest_after: int


@dataclass(frozen=True)
class CpuHeadroom:
    """CPU cores and memory (bytes) of alive nodes, less agent reservations: total, free before and after."""

    cores: float
    cores_free_before: float
    cores_free_after: float
    memory_bytes: int
    memory_free_before: int
    memory_free_after: int


@dataclass(frozen=True)
class Headroom:
    """GPU headroom by class (sorted by class name) and CPU headroom of the whole fleet."""

    gpus: tuple[GpuHeadroom, ...]
    cpu: CpuHeadroom


@dataclass
class _Use:
    devices: set[str]
    cores: float = 0.0
    memory: int = 0


def _observed_use(node: NodeState) -> _Use:
    use = _Use(set())
    for shard in node.shards:
        if shard.state in _HOLDING:
            use.devices.update(shard.devices)
            use.cores += shard.cpu_cores
            use.memory += shard.memory_bytes
    return use


def _planned_use(node: NodeState, plan: Plan) -> _Use:
    use = _Use(set())
    for shard in node.shards:
        if shard.adopted_foreign and shard.state in _HOLDING:
            use.devices.update(shard.devices)
            use.cores += shard.cpu_cores
            use.memory += shard.memory_bytes
    for assignment in plan.assignments:
        if assignment.node_id == node.node_id:
            use.devices.update(assignment.devices)
            use.cores += assignment.cpu_cores
            use.memory += assignment.memory_bytes
    return use


def _free_by_class(node: NodeState, use: _Use) -> dict[str, int]:
    free: dict[str, int] = {}
    for gpu in node.gpus:
        if gpu.foreign_processes or gpu.unhealthy:
            continue
        free.setdefault(gpu.gpu_class, 0)
        if gpu.device_id not in use.devices:
            free[gpu.gpu_class] += 1
    return free


def headroom(fleet: Fleet, plan: Plan) -> Headroom:
    """The headroom of `fleet` now and after `plan` (made from `fleet`). Cores may be fractional; free values
    can be negative when the observed shards hold more than a node has (an over-committed node)."""
    alive = [n for n in fleet.nodes if n.alive]
    totals: dict[str, list[int]] = {}  # class -> [devices, free before, free after, largest before, largest after]
    cores = cores_before = cores_after = 0.0
    memory = memory_before = memory_after = 0
    for node in alive:
        before, after = _observed_use(node), _planned_use(node, plan)
        free_before, free_after = _free_by_class(node, before), _free_by_class(node, after)
        for gpu in node.gpus:
            if not gpu.foreign_processes and not gpu.unhealthy:
                totals.setdefault(gpu.gpu_class, [0, 0, 0, 0, 0])[0] += 1
        for cls, count in free_before.items():
            row = totals[cls]
            row[1] += count
            row[3] = max(row[3], count)
        for cls, count in free_after.items():
            row = totals[cls]
            row[2] += count
            row[4] = max(row[4], count)
        cores += node.cpu_cores
        cores_before += node.cpu_cores - before.cores
        cores_after += node.cpu_cores - after.cores
        memory += node.memory_bytes
        memory_before += node.memory_bytes - before.memory
        memory_after += node.memory_bytes - after.memory
    gpus = tuple(GpuHeadroom(cls, *totals[cls]) for cls in sorted(totals))
    return Headroom(gpus, CpuHeadroom(round(cores, 6), round(cores_before, 6), round(cores_after, 6), memory,
                                      memory_before, memory_after))

