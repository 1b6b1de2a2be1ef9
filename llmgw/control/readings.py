"""What a node's last heartbeat measured: node, per-GPU and per-shard readings, with the time they arrived.

Pure values. Units follow llmgw/wire/agent.proto: bytes, percent 0-100, watts, degrees Celsius, MHz; a reading the
agent could not take is None, never 0. `at` is the control plane's clock (`trio.current_time()`) when the heartbeat
arrived. A reading older than `READING_MAX_AGE` seconds is absent from every document (`to_json` returns None):
an old value is never shown as if it were current.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from llmgw.tools.devices import GpuSample
from llmgw.tools.engine_metrics import EngineLoad
from llmgw.tools.sensors import NodeSensors

READING_MAX_AGE = 60.0
"""Seconds after which a node's readings are absent, never repeated (issue 9: "older than 60 s is absent")."""


@dataclass(frozen=True)
class ShardReading:
    """One shard's process group: CPU cores used over the last period and resident memory (bytes); `engine` the
    engine's own load from its /metrics (None: not read, see llmgw.agent.engine_load)."""

    shard_id: str
    cpu_cores_used: float | None = None
    resident_memory_bytes: int | None = None
    engine: EngineLoad | None = None


@dataclass(frozen=True)
class NodeReadings:
    """A node's readings from one heartbeat.

    `at`: control-plane clock seconds when it arrived; `agent_time`: unix seconds at the agent when taken.
    `cpu_percent` 0-100 of all cores; `load1` the 1-minute load average; memory and disk in bytes (disk: free
    under the weights directory); `sensors` the machine room's (CPU package temperatures and power, board inlet;
    empty where the node measured none, or its agent is older than issue 42).
    """

    at: float
    agent_time: float = 0.0
    cpu_percent: float | None = None
    load1: float | None = None
    memory_used_bytes: int | None = None
    memory_available_bytes: int | None = None
    disk_free_bytes: int | None = None
    gpus: tuple[GpuSample, ...] = ()
    shards: tuple[ShardReading, ...] = ()
    sensors: NodeSensors = NodeSensors()

    def age(self, now: float) -> float:
        """Seconds since these readings arrived (`now` on the same clock as `at`)."""
        return max(0.0, now - self.at)

    def fresh(self, now: float) -> bool:
        """True while at most `READING_MAX_AGE` seconds old."""
        return self.age(now) <= READING_MAX_AGE

    def to_json(self, now: float) -> dict | None:
        """The readings as a JSON-ready dict with `age_seconds` (rounded to 0.1 s) and `taken_at_unix` (the agent's
        clock), or None when stale."""
        if not self.fresh(now):
            return None
        return {
            "age_seconds": round(self.age(now), 1),
            "taken_at_unix": self.agent_time,
            "cpu_percent": self.cpu_percent,
            "load1": self.load1,
            "memory_used_bytes": self.memory_used_bytes,
            "memory_available_bytes": self.memory_available_bytes,
            "disk_free_bytes": self.disk_free_bytes,
            "gpus": [gpu.to_json() for gpu in self.gpus],
            "sensors": self.sensors.to_json(),
            "shards": {s.shard_id: {"cpu_cores_used": s.cpu_cores_used,
                                    "resident_memory_bytes": s.resident_memory_bytes,
                                    "engine": asdict(s.engine) if s.engine is not None else None}
                       for s in self.shards},
        }
