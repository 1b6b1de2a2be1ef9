"""A fleet snapshot: the observed fleet as JSON, so a plan can be computed away from the control plane.

`llmgw fleet snapshot` (or `GET /api/v1/fleet` of the admin API) writes one; `llmgw review --fleet FILE` reads
it. The fleet is the one the control plane's registry holds (`FleetRegistry.fleet()`): nodes as their agents
reported them, before any settings are laid over them (agent labels, reservations and ignored GPUs are applied
by whoever plans, from the settings being planned). Lost nodes appear with `"alive": false` and no shards.

Format (version 1), every size in bytes, CPU cores as a number (may be fractional)::

    {"version": 1,
     "taken_at": "2026-12-01T02:11:46Z",          # UTC, when the control plane answered ("" unknown)
     "settings_commit": "40-hex" | null,          # the settings commit in force on the control plane then
     "revision": "sha256:<64 hex>",               # fleet_revision(nodes); recomputed, never trusted on read
     "nodes": [{"node_id", "address", "alive", "labels": {k: v}, "cpu_cores", "memory_bytes",
                "engines_installed": [str], "engines_installing": [str],
                "gpus": [{"device_id", "gpu_class", "memory_total_bytes", "memory_free_bytes", "uuid",
                          "foreign_processes", "is_mig", "numa_node": int | null, "nvlink_peers": [str],
                          "unhealthy": str (only when a health finding takes the card out)}],
                "shards": [{"shard_id", "replica_id", "model", "state", "fingerprint", "settings_commit",
                            "devices": [str], "cpu_cores", "memory_bytes", "port", "error", "restarts",
                            "adopted_foreign"}],
                "memory_bandwidth": {"one_core_bytes_per_second", "all_cores_bytes_per_second", "threads",
                                     "seconds"}}],      # only when the node's agent measured it (once per boot)
     "load": {...} | absent}                      # what the fleet did lately (below); not in the revision

`load` (optional; `llmgw.plan.forecasting.RecordedLoad`, what `llmgw review` forecasts from)::

    {"window_seconds": 259200.0, "until": "2026-12-01T02:00:00Z",
     "speeds": {"<replica id>": {"prefill_tokens_per_second", "decode_tokens_per_second", "slots",
                                 "measured_at", "source"}},
     "traffic": [{"model", "project", "requests", "prompt_tokens", "completion_tokens", "errors"}],
     "models": {"<model>": {"busiest_hour_requests", "ttft_p90_seconds": float | null, "ttft_requests"}}}

Keys with defaults (everything but node_id; device_id, gpu_class and the memory sizes of a GPU; shard_id,
replica_id, model and state of a shard) may be left out. No secret is in a snapshot.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from llmgw.errors import UsageError
from llmgw.plan.forecasting import ModelLoad, RecordedLoad, Traffic
from llmgw.plan.types import Fleet, GpuState, MemoryBandwidth, NodeState, ObservedShard, ShardState
from llmgw.routes import ReplicaSpeed

SNAPSHOT_VERSION = 1


@dataclass(frozen=True)
class FleetSnapshot:
    """The fleet at one time. `taken_at` ISO 8601 UTC ("" when unknown); `settings_commit` in force then; `load`
    what it did lately (None: not recorded; not part of the revision)."""

    fleet: Fleet
    taken_at: str = ""
    settings_commit: str | None = None
    load: RecordedLoad | None = None

    @property
    def revision(self) -> str:
        """`fleet_revision(self.fleet)`."""
        return fleet_revision(self.fleet)


def _gpu_json(gpu: GpuState) -> dict[str, Any]:
    doc = {"device_id": gpu.device_id, "gpu_class": gpu.gpu_class, "memory_total_bytes": gpu.memory_total_bytes,
           "memory_free_bytes": gpu.memory_free_bytes, "uuid": gpu.uuid,
           "foreign_processes": gpu.foreign_processes, "is_mig": gpu.is_mig, "numa_node": gpu.numa_node,
           "nvlink_peers": list(gpu.nvlink_peers)}
    if gpu.unhealthy:
        doc["unhealthy"] = gpu.unhealthy
    return doc


def _shard_json(shard: ObservedShard) -> dict[str, Any]:
    return {"shard_id": shard.shard_id, "replica_id": shard.replica_id, "model": shard.model,
            "state": shard.state.value, "fingerprint": shard.fingerprint, "settings_commit": shard.settings_commit,
            "devices": list(shard.devices), "cpu_cores": float(shard.cpu_cores), "memory_bytes": int(shard.memory_bytes),
            "port": shard.port, "error": shard.error, "restarts": shard.restarts,
            "adopted_foreign": shard.adopted_foreign}


def _node_json(node: NodeState) -> dict[str, Any]:
    doc = {
        "node_id": node.node_id, "address": node.address, "alive": node.alive, "labels": dict(node.labels),
        "cpu_cores": float(node.cpu_cores), "memory_bytes": int(node.memory_bytes),
        "engines_installed": sorted(node.engines_installed), "engines_installing": sorted(node.engines_installing),
        "gpus": [_gpu_json(g) for g in node.gpus], "shards": [_shard_json(s) for s in node.shards],
    }
    if node.memory_bandwidth is not None:
        doc["memory_bandwidth"] = node.memory_bandwidth.to_json()
    return doc


def fleet_to_json(fleet: Fleet) -> list[dict[str, Any]]:
    """The nodes of `fleet` as JSON-ready dicts, by node id (the "nodes" list of a snapshot); CPU cores always as
    floats, so equal fleets give equal JSON."""
    return [_node_json(node) for node in sorted(fleet.nodes, key=lambda n: n.node_id)]


def fleet_revision(fleet: Fleet) -> str:
    """"sha256:<hex>" of the canonical JSON of `fleet_to_json(fleet)`: equal fleets, equal revisions."""
    text = json.dumps(fleet_to_json(fleet), sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def load_to_json(load: RecordedLoad) -> dict[str, Any]:
    """`load` as the "load" object of a snapshot (this module's docstring), keys sorted."""
    return {
        "window_seconds": float(load.window_seconds), "until": load.until,
        "speeds": {rid: {"prefill_tokens_per_second": s.prefill_tokens_per_second,
                         "decode_tokens_per_second": s.decode_tokens_per_second, "slots": s.slots,
                         "measured_at": s.measured_at, "source": s.source} for rid, s in sorted(load.speeds.items())},
        "traffic": [{"model": t.model, "project": t.project, "requests": t.requests, "prompt_tokens": t.prompt_tokens,
                     "completion_tokens": t.completion_tokens, "errors": t.errors}
                    for t in sorted(load.traffic, key=lambda t: (t.model, t.project))],
        "models": {name: {"busiest_hour_requests": m.busiest_hour_requests, "ttft_p90_seconds": m.ttft_p90_seconds,
                          "ttft_requests": m.ttft_requests} for name, m in sorted(load.models.items())},
    }


def snapshot_to_json(snapshot: FleetSnapshot) -> dict[str, Any]:
    """`snapshot` in the version 1 format of this module's docstring ("load" only when it has one)."""
    doc = {"version": SNAPSHOT_VERSION, "taken_at": snapshot.taken_at, "settings_commit": snapshot.settings_commit,
           "revision": snapshot.revision, "nodes": fleet_to_json(snapshot.fleet)}
    if snapshot.load is not None:
        doc["load"] = load_to_json(snapshot.load)
    return doc


class _Reader:
    """Reads one snapshot, naming the place of the first bad value ("nodes[1].gpus[0].memory_total_bytes")."""

    def __init__(self, source: str):
        self.source = source

    def fail(self, where: str, why: str) -> UsageError:
        return UsageError(f"{self.source} is not a fleet snapshot: {where or 'the top level'}: {why}; make one with "
                          f"`llmgw fleet snapshot` (format: docs/review.md)")

    def get(self, data: Any, key: str, where: str, kind: type | tuple[type, ...], default: Any = ...) -> Any:
        if not isinstance(data, dict):
            raise self.fail(where, "expected an object")
        if key not in data:
            if default is ...:
                raise self.fail(f"{where}.{key}" if where else key, "missing")
            return default
        value = data[key]
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if not isinstance(value, kind) or (isinstance(value, bool) and kind in (int, float)):
            raise self.fail(f"{where}.{key}" if where else key, f"expected {getattr(kind, '__name__', kind)}, "
                                                                f"got {json.dumps(value)[:60]}")
        return value

    def strings(self, data: dict, key: str, where: str) -> tuple[str, ...]:
        values = self.get(data, key, where, list, [])
        if not all(isinstance(v, str) for v in values):
            raise self.fail(f"{where}.{key}", "expected a list of strings")
        return tuple(values)

    def gpu(self, data: Any, where: str) -> GpuState:
        numa = self.get(data, "numa_node", where, (int, type(None)), None)
        return GpuState(
            device_id=self.get(data, "device_id", where, str), gpu_class=self.get(data, "gpu_class", where, str),
            memory_total_bytes=self.get(data, "memory_total_bytes", where, int),
            memory_free_bytes=self.get(data, "memory_free_bytes", where, int),
            uuid=self.get(data, "uuid", where, str, ""),
            foreign_processes=self.get(data, "foreign_processes", where, bool, False),
            is_mig=self.get(data, "is_mig", where, bool, False), numa_node=numa,
            nvlink_peers=self.strings(data, "nvlink_peers", where),
            unhealthy=self.get(data, "unhealthy", where, str, ""),
        )

    def shard(self, data: Any, where: str) -> ObservedShard:
        state = self.get(data, "state", where, str)
        try:
            shard_state = ShardState(state)
        except ValueError:
            raise self.fail(f"{where}.state", f"unknown state {state!r} (one of "
                            f"{', '.join(s.value for s in ShardState)})") from None
        return ObservedShard(
            shard_id=self.get(data, "shard_id", where, str), replica_id=self.get(data, "replica_id", where, str),
            model=self.get(data, "model", where, str), state=shard_state,
            fingerprint=self.get(data, "fingerprint", where, str, ""),
            settings_commit=self.get(data, "settings_commit", where, str, ""),
            devices=self.strings(data, "devices", where), cpu_cores=self.get(data, "cpu_cores", where, float, 0.0),
            memory_bytes=self.get(data, "memory_bytes", where, int, 0), port=self.get(data, "port", where, int, 0),
            error=self.get(data, "error", where, str, ""), restarts=self.get(data, "restarts", where, int, 0),
            adopted_foreign=self.get(data, "adopted_foreign", where, bool, False),
        )

    def node(self, data: Any, where: str) -> NodeState:
        labels = self.get(data, "labels", where, dict, {})
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
            raise self.fail(f"{where}.labels", "expected an object of strings")
        gpus = self.get(data, "gpus", where, list, [])
        shards = self.get(data, "shards", where, list, [])
        return NodeState(
            node_id=self.get(data, "node_id", where, str), address=self.get(data, "address", where, str, ""),
            alive=self.get(data, "alive", where, bool, True), labels=tuple(sorted(labels.items())),
            cpu_cores=self.get(data, "cpu_cores", where, float, 0.0),
            memory_bytes=self.get(data, "memory_bytes", where, int, 0),
            gpus=tuple(self.gpu(g, f"{where}.gpus[{i}]") for i, g in enumerate(gpus)),
            engines_installed=frozenset(self.strings(data, "engines_installed", where)),
            engines_installing=frozenset(self.strings(data, "engines_installing", where)),
            shards=tuple(self.shard(s, f"{where}.shards[{i}]") for i, s in enumerate(shards)),
            memory_bandwidth=self.bandwidth(data, where),
        )

    def bandwidth(self, data: Any, where: str) -> MemoryBandwidth | None:
        probe = self.get(data, "memory_bandwidth", where, (dict, type(None)), None)
        if probe is None:
            return None
        where = f"{where}.memory_bandwidth"
        return MemoryBandwidth(self.get(probe, "one_core_bytes_per_second", where, float),
                               self.get(probe, "all_cores_bytes_per_second", where, float),
                               self.get(probe, "threads", where, int, 1), self.get(probe, "seconds", where, float, 0.0))

    def count(self, data: Any, key: str, where: str) -> int:
        value = self.get(data, key, where, int, 0)
        if value < 0:
            raise self.fail(f"{where}.{key}", f"expected a count (0 or more), got {value}")
        return value

    def rate(self, data: Any, key: str, where: str) -> float:
        value = self.get(data, key, where, float)
        if value <= 0:
            raise self.fail(f"{where}.{key}", f"expected tokens per second above 0, got {value:g}")
        return value

    def load(self, data: Any) -> RecordedLoad:
        window = self.get(data, "window_seconds", "load", float)
        if window <= 0:
            raise self.fail("load.window_seconds", f"expected seconds above 0, got {window:g}")
        speeds = {}
        for rid, s in self.get(data, "speeds", "load", dict, {}).items():
            where = f"load.speeds.{rid}"
            speeds[rid] = ReplicaSpeed(self.rate(s, "prefill_tokens_per_second", where),
                                       self.rate(s, "decode_tokens_per_second", where), self.count(s, "slots", where),
                                       self.get(s, "measured_at", where, float, 0.0), self.get(s, "source", where, str, ""))
        traffic = []
        for i, t in enumerate(self.get(data, "traffic", "load", list, [])):
            where = f"load.traffic[{i}]"
            traffic.append(Traffic(self.get(t, "model", where, str), self.get(t, "project", where, str),
                                   self.count(t, "requests", where), self.count(t, "prompt_tokens", where),
                                   self.count(t, "completion_tokens", where), self.count(t, "errors", where)))
        models = {}
        for name, m in self.get(data, "models", "load", dict, {}).items():
            where = f"load.models.{name}"
            p90 = self.get(m, "ttft_p90_seconds", where, (float, type(None)), None)
            models[name] = ModelLoad(name, self.count(m, "busiest_hour_requests", where), p90,
                                     self.count(m, "ttft_requests", where))
        return RecordedLoad(window, self.get(data, "until", "load", str, ""), speeds, tuple(traffic), models)


def snapshot_from_json(data: Any, source: str = "the snapshot") -> FleetSnapshot:
    """The `FleetSnapshot` written by `snapshot_to_json` (or by hand in that format).

    `source` names the input in messages (a file path). The stored "revision" is ignored (recomputed).
    Raises: UsageError naming `source` and the first bad key ("nodes[1].gpus[0].memory_total_bytes: missing"),
    for another version, or for two nodes with one id.
    """
    reader = _Reader(source)
    version = reader.get(data, "version", "", int)
    if version != SNAPSHOT_VERSION:
        raise reader.fail("version", f"version {version} is not known (this llmgw reads {SNAPSHOT_VERSION})")
    nodes = tuple(reader.node(n, f"nodes[{i}]") for i, n in enumerate(reader.get(data, "nodes", "", list)))
    seen: set[str] = set()
    for node in nodes:
        if node.node_id in seen:
            raise reader.fail("nodes", f"node {node.node_id} appears twice")
        seen.add(node.node_id)
    commit = reader.get(data, "settings_commit", "", (str, type(None)), None)
    load = reader.get(data, "load", "", dict, None)
    return FleetSnapshot(Fleet(tuple(sorted(nodes, key=lambda n: n.node_id))),
                         reader.get(data, "taken_at", "", str, ""), commit,
                         None if load is None else reader.load(load))
