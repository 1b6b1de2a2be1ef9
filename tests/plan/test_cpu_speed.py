"""The CPU decode estimator against calibration points recorded on this project's development machine (2 shared
cores): llama-server b11434's own `predicted_per_second` (best of a run, one request at a time, 2 threads) beside
the memory read bandwidth the agent's probe measured at that time (best of its runs), docs/capacity.md. Target:
within 30 %."""

from __future__ import annotations

from dataclasses import replace

import pytest

from llmgw.plan import MemoryBandwidth, make_plan
from llmgw.plan.cpu_speed import (
    bandwidth_for_threads, estimate_decode_tokens_per_second, expected_cpu_speeds, weight_bytes_of,
)

from plan_fleets import WEIGHTS, cpu_node, fleet, gpu_node, model, settings

# (model, GGUF bytes, probe's read bandwidth of 2 cores in bytes/s, llama-server's decode tokens/s), 2026-12-04
CALIBRATION = [
    ("gemma-3-270m Q4_K_M", 253_113_024, 31.7e9, 66.5),
    ("smollm2-135m Q4_1", 98_362_432, 31.7e9, 114.9),
]


@pytest.mark.parametrize(("model", "size", "bandwidth", "measured"), CALIBRATION)
def test_the_estimate_is_within_30_percent_of_llama_servers_own_measurement(model, size, bandwidth, measured):
    assert estimate_decode_tokens_per_second(size, bandwidth) == pytest.approx(measured, rel=0.30)


def test_more_bandwidth_or_fewer_bytes_is_faster_and_the_overhead_bounds_it():
    assert estimate_decode_tokens_per_second(10**9, 50e9) > estimate_decode_tokens_per_second(10**9, 25e9)
    assert estimate_decode_tokens_per_second(10**8, 25e9) > estimate_decode_tokens_per_second(10**9, 25e9)
    assert estimate_decode_tokens_per_second(1, 1e12) < 200.0  # 5 ms a token at the least
    with pytest.raises(ValueError, match="must be positive"):
        estimate_decode_tokens_per_second(10**9, 0.0)


def test_threads_get_their_share_of_one_core_up_to_all_cores():
    assert bandwidth_for_threads(10e9, 60e9, 2) == 20e9
    assert bandwidth_for_threads(10e9, 60e9, 16) == 60e9
    assert bandwidth_for_threads(10e9, 60e9, 0) == 10e9


def _probed(node, one: float = 12e9, every: float = 30e9):
    return replace(node, memory_bandwidth=MemoryBandwidth(one, every, 8, 0.5))


def test_every_cpu_replica_placed_on_a_probed_node_gets_its_expected_speed_and_the_others_none():
    gemma = replace(model("gemma", replicas=2, cores=2), weights=(replace(WEIGHTS[0], size_bytes=253_113_024),))
    unsized = model("unsized", cores=1)
    on_gpu = replace(model("big", gpus=1, gpu_class="h100-80g"), weights=(replace(WEIGHTS[0], size_bytes=10**9),))
    s = settings(gemma, unsized, on_gpu)
    f = fleet(_probed(cpu_node("n1", cores=3)), cpu_node("n2", cores=3), _probed(gpu_node("g1")))
    plan = make_plan(s, f)
    placed = {a.replica_id: a.node_id for a in plan.assignments}
    speeds = expected_cpu_speeds(s, f, plan)
    # gemma-0 and gemma-1 land on n1 (probed) and n2 (not probed) in some order; the unsized model and the GPU
    # replica are never estimated
    assert [(x.replica_id, x.node_id) for x in speeds] == [(r, n) for r, n in sorted(placed.items())
                                                         if r.startswith("gemma") and n != "n2"]
    assert len(speeds) == 1
    for speed in speeds:
        # two threads read twice one core's 12 GB/s (below all cores' 30 GB/s)
        assert (speed.threads, speed.weight_bytes, speed.bandwidth_bytes_per_second) == (2, 253_113_024, 24e9)
        assert speed.decode_tokens_per_second == pytest.approx(estimate_decode_tokens_per_second(253_113_024, 24e9))
        assert set(speed.to_json()) == {"replica_id", "model", "node_id", "threads", "weight_bytes",
                                        "bandwidth_bytes_per_second", "decode_tokens_per_second"}
    assert weight_bytes_of(unsized) is None and weight_bytes_of(gemma) == 253_113_024


def test_a_model_of_several_files_counts_every_size_given():
    files = (replace(WEIGHTS[0], size_bytes=3 * 10**9), replace(WEIGHTS[0], size_bytes=10**9), WEIGHTS[0])
    assert weight_bytes_of(replace(model("m"), weights=files)) == 4 * 10**9
