"""A model's expected decode speed on a CPU node, from the node's memory bandwidth (pure).

llama.cpp on CPUs reads every weight once per generated token, so a token takes the weights' bytes over the rate
the engine's threads read memory, plus a fixed cost per token (sampling, the graph's small operations):

    seconds per token = weight bytes / (EFFICIENCY x bandwidth) + OVERHEAD_SECONDS

EFFICIENCY 0.68 and OVERHEAD_SECONDS 0.005 come from the Go version of this project, which calibrated them against
llama.cpp (14.5 tokens/s measured against 14.7 estimated for a 1.5B model on a 24.9 GB/s node); the points measured
on this project's development machine are in tests/plan/test_cpu_speed.py and docs/capacity.md. The bandwidth is
what the engine's threads can read at once: `threads` cores of the node's probe (`llmgw.agent.bandwidth`), never
more than all its cores together. Sizes in bytes, rates in bytes per second, speeds in tokens per second.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from llmgw.plan.types import Fleet, Plan
from llmgw.settings.model import Model, Settings

EFFICIENCY = 0.68
OVERHEAD_SECONDS = 0.005


def bandwidth_for_threads(one_core_bytes_per_second: float, all_cores_bytes_per_second: float,
                          threads: int) -> float:
    """The read bandwidth `threads` engine threads get: `threads` times one core's, at most all cores'."""
    return min(all_cores_bytes_per_second, one_core_bytes_per_second * max(threads, 1))


def estimate_decode_tokens_per_second(weight_bytes: int, bandwidth_bytes_per_second: float) -> float:
    """Expected decode tokens/s of one request of a dense model whose weights take `weight_bytes` (the GGUF's size)
    on threads reading `bandwidth_bytes_per_second` (> 0). Raises ValueError for a bandwidth of 0 or less."""
    if bandwidth_bytes_per_second <= 0:
        raise ValueError(f"a memory bandwidth must be positive, not {bandwidth_bytes_per_second!r}")
    return 1.0 / (weight_bytes / (EFFICIENCY * bandwidth_bytes_per_second) + OVERHEAD_SECONDS)


@dataclass(frozen=True)
class ExpectedSpeed:
    """A CPU replica's expected decode speed where the plan puts it: `replica_id` of `model` on `node_id`, run with
    `threads` engine threads (its reserved cores rounded up, as the agent starts llama.cpp), reading `weight_bytes`
    per token at `bandwidth_bytes_per_second` (that many of the node's probed cores): `decode_tokens_per_second`
    for one request."""

    replica_id: str
    model: str
    node_id: str
    threads: int
    weight_bytes: int
    bandwidth_bytes_per_second: float
    decode_tokens_per_second: float

    def to_json(self) -> dict[str, Any]:
        return {"replica_id": self.replica_id, "model": self.model, "node_id": self.node_id, "threads": self.threads,
                "weight_bytes": self.weight_bytes, "bandwidth_bytes_per_second": self.bandwidth_bytes_per_second,
                "decode_tokens_per_second": self.decode_tokens_per_second}


def weight_bytes_of(model: Model) -> int | None:
    """The bytes of `model`'s weights: the sum of its files' `size` (catalog `weights[].size`); None when no file
    gives one (the estimate then needs it)."""
    sizes = [w.size_bytes for w in model.weights if w.size_bytes is not None]
    return sum(sizes) if sizes else None


def expected_cpu_speeds(settings: Settings, fleet: Fleet, plan: Plan) -> tuple[ExpectedSpeed, ...]:
    """The expected decode speed of every replica `plan` places on a CPU (a model of no GPUs, on one node), by
    replica id: from its weights' size and the node's memory bandwidth (`NodeState.memory_bandwidth`, its agent's
    probe). A replica whose model gives no weights size, or whose node was not probed, is left out; empty when none
    can be estimated."""
    found = []
    for assignment in plan.assignments:
        model = settings.models.get(assignment.model)
        node = fleet.node(assignment.node_id)
        if model is None or node is None or node.memory_bandwidth is None or model.resources.gpus or assignment.devices:
            continue
        weights = weight_bytes_of(model)
        if weights is None:
            continue
        threads = max(1, math.ceil(assignment.cpu_cores))
        probe = node.memory_bandwidth
        bandwidth = bandwidth_for_threads(probe.one_core_bytes_per_second, probe.all_cores_bytes_per_second, threads)
        if bandwidth <= 0:
            continue
        found.append(ExpectedSpeed(assignment.replica_id, assignment.model, assignment.node_id, threads, weights,
                                   bandwidth, estimate_decode_tokens_per_second(weights, bandwidth)))
    return tuple(sorted(found, key=lambda s: s.replica_id))
