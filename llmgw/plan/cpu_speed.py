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
