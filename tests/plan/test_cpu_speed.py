"""The CPU decode estimator against calibration points recorded on this project's development machine (2 shared
cores): llama-server b11434's own `predicted_per_second` (best of a run, one request at a time, 2 threads) beside
the memory read bandwidth the agent's probe measured at that time (best of its runs), docs/capacity.md. Target:
within 30 %."""

from __future__ import annotations

import pytest

from llmgw.plan.cpu_speed import bandwidth_for_threads, estimate_decode_tokens_per_second

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
