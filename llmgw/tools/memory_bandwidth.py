"""A node's memory read bandwidth as the agent's probe reports it (`llmgw.agent.bandwidth`, which measures it; the
control plane keeps it in the node's state, `llmgw.plan.cpu_speed` estimates a CPU replica's speed from it). Pure."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MemoryBandwidth:
    """A node's memory read bandwidth as its agent's probe measured it once per boot (`llmgw.agent.bandwidth`):
    bytes per second read by one core alone and by `threads` cores at once, and how long the probe took (seconds,
    wall clock). What a CPU replica's decode speed is estimated from (`llmgw.plan.cpu_speed`)."""

    one_core_bytes_per_second: float
    all_cores_bytes_per_second: float
    threads: int
    seconds: float

    def to_json(self) -> dict[str, float | int]:
        return {"one_core_bytes_per_second": self.one_core_bytes_per_second,
                "all_cores_bytes_per_second": self.all_cores_bytes_per_second, "threads": self.threads,
                "seconds": self.seconds}
