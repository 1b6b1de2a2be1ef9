"""What each live node has left, what one replica needs, and why a node cannot take it.

Private to llmgw.plan. A `Room` is one alive node's free devices, CPU cores and memory after what its shards
hold; a `ClassIndex` buckets nodes by how many free devices of a GPU class they have, so placing a replica
looks only at nodes with enough free devices (best fit first) instead of scanning the fleet.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from llmgw.plan.types import GpuState, NodeState
from llmgw.units import format_size


@dataclass(frozen=True)
class Demand:
    """What one replica of `model` needs. Sizes in bytes; `engine_key` "llama.cpp@b11434" (version may be empty).

    `refusal` is set when no node can ever take it (a MIG class with tensor or pipeline parallel above 1).
    """

    model: str
    fingerprint: str
    engine: str
    engine_key: str
    gpus: int
    gpu_class: str
    gpu_memory: int
    cpu_cores: float
    memory: int
    selector: tuple[tuple[str, str], ...]
    refusal: str | None = None
    installable: bool = True


def _device_order(gpu: GpuState) -> tuple[int, int, str]:
    return (0, int(gpu.device_id), "") if gpu.device_id.isdigit() else (1, 0, gpu.device_id)


def _cores(value: float) -> str:
    return f"{value:g}"


class Room:
    """One alive node's capacity as planning goes on (mutable, private to one `make_plan` call)."""

    __slots__ = ("node_id", "labels", "free", "counts", "held", "foreign", "ignored", "unhealthy", "cpu_free", "mem_free",
                 "models", "installed", "installing", "installable", "has_gpus", "devices", "version", "why_cache")

    def __init__(self, node: NodeState, labels: dict[str, str], ignore: frozenset[str]):
        self.node_id = node.node_id
        self.labels = labels
        self.free: dict[str, list[GpuState]] = {}
        self.counts: dict[str, int] = {}
        self.held: dict[str, int] = {}
        self.foreign: dict[str, int] = {}
        self.ignored: dict[str, int] = {}
        self.unhealthy: dict[str, list[str]] = {}  # class -> "GPU <device>: <reason>", cards health takes out
        self.devices: dict[str, GpuState] = {}
        for gpu in sorted(node.gpus, key=_device_order):
            cls = gpu.gpu_class
            self.counts[cls] = self.counts.get(cls, 0) + 1
            if gpu.device_id in ignore or (gpu.uuid and gpu.uuid in ignore):
                self.ignored[cls] = self.ignored.get(cls, 0) + 1
            elif gpu.unhealthy:
                self.unhealthy.setdefault(cls, []).append(f"GPU {gpu.device_id}: {gpu.unhealthy}")
            elif gpu.foreign_processes:
                self.foreign[cls] = self.foreign.get(cls, 0) + 1
            else:
                self.free.setdefault(cls, []).append(gpu)
                self.devices[gpu.device_id] = gpu
        self.has_gpus = bool(node.gpus)
        self.cpu_free = float(node.cpu_cores)
        self.mem_free = int(node.memory_bytes)
        self.models: dict[str, int] = {}
        self.installed = set(node.engines_installed)
        self.installing = set(node.engines_installing)
        self.installable = node.engines_installable
        self.version = 0
        self.why_cache: dict[tuple, tuple[int, str]] = {}

    def free_count(self, gpu_class: str) -> int:
        return len(self.free.get(gpu_class, ()))

    def hold(self, devices: tuple[str, ...], cpu_cores: float, memory: int, model: str | None) -> list[str]:
        """Take `devices`, cores and memory (a shard runs or will run here); return the classes whose count changed."""
        changed = []
        self.version += 1
        if devices:
            wanted = set(devices)
            for cls, gpus in self.free.items():
                kept = [g for g in gpus if g.device_id not in wanted]
                if len(kept) != len(gpus):
                    self.held[cls] = self.held.get(cls, 0) + len(gpus) - len(kept)
                    self.free[cls] = kept
                    changed.append(cls)
        self.cpu_free -= cpu_cores
        self.mem_free -= memory
        if model is not None:
            self.models[model] = self.models.get(model, 0) + 1
        return changed

    def release(self, devices: tuple[str, ...], cpu_cores: float, memory: int, model: str | None) -> list[str]:
        """Give back what `hold` took for a shard that will stop; return the classes whose count changed."""
        changed = []
        self.version += 1
        for device_id in devices:
            gpu = self.devices.get(device_id)
            if gpu is None or any(g.device_id == device_id for g in self.free.get(gpu.gpu_class, ())):
                continue
            gpus = self.free.setdefault(gpu.gpu_class, [])
            gpus.append(gpu)
            gpus.sort(key=_device_order)
            self.held[gpu.gpu_class] -= 1
            changed.append(gpu.gpu_class)
        self.cpu_free += cpu_cores
        self.mem_free += memory
        if model is not None and self.models.get(model):
            self.models[model] -= 1
        return changed

    def labels_match(self, demand: Demand) -> bool:
        labels = self.labels
        return all(labels.get(key) == value for key, value in demand.selector)

    def fit(self, demand: Demand) -> tuple[str, ...] | None:
        """The devices `demand` would get here (() on CPU) or None when it does not fit (engines not considered)."""
        if demand.selector and not self.labels_match(demand):
            return None
        if demand.gpus == 0:
            if self.cpu_free + 1e-9 >= demand.cpu_cores and self.mem_free >= demand.memory:
                return ()
            return None
        return pick_devices(self.free.get(demand.gpu_class, ()), demand.gpus, demand.gpu_memory)

    def engine_state(self, demand: Demand) -> str:
        """"ready" (installed), "installing", "installable" (in engines.yaml, not here) or "unknown"."""
        key = demand.engine_key
        if key.endswith("@"):
            return "ready" if any(k.startswith(key) for k in self.installed) else "unknown"
        if key in self.installed:
            return "ready"
        if key in self.installing:
            return "installing"
        if self.installable is not None and key.partition("@")[0] not in self.installable:
            return "not installable"
        return "installable" if demand.installable else "unknown"

    def why_not(self, demand: Demand) -> str:
        """A short reason this node cannot take `demand` now ("1 of 2 h100-80g free"); "" when it fits.

        Cached per shape of demand until the room changes (many models share a shape).
        """
        shape = (demand.gpus, demand.gpu_class, demand.gpu_memory, demand.cpu_cores, demand.memory, demand.selector)
        cached = self.why_cache.get(shape)
        if cached is not None and cached[0] == self.version:
            return cached[1]
        why = self._why_not(demand)
        self.why_cache[shape] = (self.version, why)
        return why

    def _why_not(self, demand: Demand) -> str:
        if demand.selector and not self.labels_match(demand):
            wanted = ", ".join(f"{k}={v}" for k, v in demand.selector)
            return f"labels do not match node_selector {wanted}"
        if demand.gpus == 0:
            parts = []
            if self.cpu_free + 1e-9 < demand.cpu_cores:
                parts.append(f"{_cores(max(self.cpu_free, 0.0))} of {_cores(demand.cpu_cores)} CPU cores free")
            if self.mem_free < demand.memory:
                parts.append(f"{format_size(max(self.mem_free, 0))} of {format_size(demand.memory)} memory free")
            return "; ".join(parts)
        cls = demand.gpu_class
        if cls not in self.counts:
            others = ", ".join(f"{n} x {c}" for c, n in sorted(self.counts.items()))
            return f"no {cls} GPUs" + (f" (has {others})" if others else "")
        free = self.free.get(cls, [])
        usable = [g for g in free if g.memory_free_bytes >= demand.gpu_memory]
        if len(usable) >= demand.gpus:
            return ""
        detail = []
        if self.held.get(cls):
            detail.append(f"{self.held[cls]} held by shards")
        if self.foreign.get(cls):
            detail.append(f"{self.foreign[cls]} with foreign processes")
        if self.ignored.get(cls):
            detail.append(f"{self.ignored[cls]} ignored by agent settings")
        if self.unhealthy.get(cls):
            out = self.unhealthy[cls]
            detail.append(f"{len(out)} out of placement for health ({'; '.join(out)})")
        if len(usable) < len(free):
            detail.append(f"{len(free) - len(usable)} with less than {format_size(demand.gpu_memory)} memory free")
        suffix = f" ({', '.join(detail)})" if detail else ""
        return f"{len(usable)} of {demand.gpus} {cls} free{suffix}"


def pick_devices(free: list[GpuState] | tuple[GpuState, ...], count: int, min_memory: int) -> tuple[str, ...] | None:
    """Choose `count` of the `free` devices with at least `min_memory` bytes free each, or None.

    Prefers a set whose devices are all NVLink peers of one another, then one NUMA node, then device order;
    without topology information it takes the first `count` devices in device order (deterministic).
    The choice depends only on the usable devices' ids and topology, so it is worked out once per shape (cached:
    the nodes of a fleet mostly share a few shapes, and the search is the costly part of a full plan).
    """
    usable = [g for g in free if g.memory_free_bytes >= min_memory] if min_memory else list(free)
    if len(usable) < count:
        return None
    if count == 1 or not any(g.nvlink_peers or g.numa_node is not None for g in usable):
        return tuple(g.device_id for g in usable[:count])
    return _pick_by_topology(count, tuple((g.device_id, g.numa_node, g.nvlink_peers) for g in usable))


@functools.lru_cache(maxsize=4096)
def _pick_by_topology(count: int, shape: tuple[tuple[str, int | None, tuple[str, ...]], ...]) -> tuple[str, ...]:
    """`pick_devices`'s search over usable devices given as (device id, NUMA node, NVLink peers), in device order."""
    usable = [GpuState(device_id, "", 0, 0, numa_node=numa, nvlink_peers=peers) for device_id, numa, peers in shape]
    best: tuple[tuple[int, int, int], tuple[str, ...]] | None = None
    for start in range(len(usable)):
        chosen = [usable[start]]
        rest = usable[:start] + usable[start + 1:]
        while len(chosen) < count:
            chosen.append(min(rest, key=lambda g, c=chosen: _join_cost(c, g)))
            rest.remove(chosen[-1])
        ids = tuple(sorted((g.device_id for g in chosen), key=lambda d: (0, int(d), "") if d.isdigit() else (1, 0, d)))
        score = (_missing_links(chosen), len({g.numa_node for g in chosen}), start)
        if best is None or score < best[0]:
            best = (score, ids)
    assert best is not None
    return best[1]


def _join_cost(chosen: list[GpuState], gpu: GpuState) -> tuple[int, int]:
    missing = sum(1 for c in chosen if gpu.device_id not in c.nvlink_peers and c.device_id not in gpu.nvlink_peers)
    other_numa = 0 if gpu.numa_node == chosen[0].numa_node else 1
    return (missing, other_numa)


def _missing_links(chosen: list[GpuState]) -> int:
    missing = 0
    for i, a in enumerate(chosen):
        for b in chosen[i + 1:]:
            if b.device_id not in a.nvlink_peers and a.device_id not in b.nvlink_peers:
                missing += 1
    return missing


class ClassIndex:
    """For each GPU class, the alive nodes bucketed by their count of free devices of that class.

    Buckets are insertion-ordered dicts filled in node-id order, so iteration is deterministic.
    """

    def __init__(self, rooms: list[Room]):
        self.buckets: dict[str, list[dict[str, None]]] = {}
        for room in rooms:
            for cls in room.counts:
                self._put(cls, room.node_id, room.free_count(cls))

    def _put(self, cls: str, node_id: str, count: int) -> None:
        buckets = self.buckets.setdefault(cls, [])
        while len(buckets) <= count:
            buckets.append({})
        buckets[count][node_id] = None

    def moved(self, room: Room, cls: str, old_count: int) -> None:
        """Record that `room` now has `room.free_count(cls)` free devices of `cls` instead of `old_count`."""
        buckets = self.buckets.get(cls)
        if buckets is not None and old_count < len(buckets):
            buckets[old_count].pop(room.node_id, None)
        self._put(cls, room.node_id, room.free_count(cls))

    def candidates(self, cls: str, at_least: int):
        """Node ids with at least `at_least` free devices of `cls`, fewest free first (best fit)."""
        for bucket in self.buckets.get(cls, [])[at_least:]:
            yield from bucket  # not copied: placing moves a node only after it stopped looking (llmgw.plan.placing)
