"""`llmgw bench`'s pure parts: percentiles as numpy computes them, a run summed up from its requests' timings
(failures counted apart), the target found in the admin API's nodes document, and a node's class."""

from __future__ import annotations

import random

import numpy
import pytest

from llmgw.cli.bench_cmds import Target, bench_line, node_class, resolve_target
from llmgw.control.bench_stats import RequestTiming, percentile, render, summarize
from llmgw.errors import UsageError
from llmgw.store import BenchRecord


@pytest.mark.parametrize("seed", range(20))
def test_percentiles_are_numpys_linear_ones(seed):
    rng = random.Random(seed)
    values = [rng.expovariate(1.0) for _ in range(rng.randint(1, 50))]
    for q in (0, 50, 90, 99, 100):
        assert percentile(values, q) == pytest.approx(float(numpy.percentile(values, q)))
    assert percentile([], 50) is None


def test_a_run_is_summed_up_from_its_requests_and_failures_are_counted_apart():
    # two requests: 0.2 s and 0.4 s to the first token, then 10 tokens 20 ms / 50 ms apart; one refused
    fast = RequestTiming(0.0, tuple(0.2 + 0.02 * i for i in range(10)), 0.4, 100, 10,
                         {"predicted_per_second": 50.0, "prompt_ms": 190.0})
    slow = RequestTiming(0.0, tuple(0.4 + 0.05 * i for i in range(10)), 0.9, 100, 10,
                         {"predicted_per_second": 20.0, "prompt_ms": 380.0})
    refused = RequestTiming(0.0, (), 0.01, error="HTTP 503: no replica")
    summary = summarize([fast, slow, refused], wall_seconds=1.0)
    assert (summary.requests, summary.failed, summary.errors) == (3, 1, ("HTTP 503: no replica",))
    assert summary.completion_tokens == 20 and summary.prompt_tokens == 200
    assert summary.output_tokens_per_second == pytest.approx(20.0)
    assert summary.ttft.p50 == pytest.approx(0.3) and summary.ttft.count == 2
    assert summary.itl.p50 == pytest.approx(0.035)
    assert summary.decode_tokens_per_second.p50 == pytest.approx((50.0 + 20.0) / 2)
    assert summary.engine_decode_per_second.p50 == pytest.approx(35.0)
    lines = render(summary)
    assert lines[0].startswith("3 requests (1 failed) in 1.00 s") and "20.0 output tokens/s" in lines[0]
    assert any(line.startswith("TTFT") and "300.0" in line for line in lines)
    assert lines[-1] == "error: HTTP 503: no replica"
    assert summary.to_json()["ttft_seconds"]["count"] == 2


def test_a_request_with_one_token_has_a_ttft_but_no_inter_token_latency():
    one = RequestTiming(1.0, (1.5,), 1.6, 10, 1)
    assert one.ttft == pytest.approx(0.5) and one.itl is None
    summary = summarize([one], 0.6)
    assert summary.itl.p50 is None and summary.itl.count == 0 and summary.ttft.p99 == pytest.approx(0.5)


NODES = {
    "gpu-1": {"address": "10.0.0.5", "cpu_cores": 64, "gpu_classes": {"0": "H200", "1": "H200"}, "shards": {
        "gemma-1/0": {"replica": "gemma-1", "model": "gemma", "state": "ready", "port": 41001, "devices": ["0", "1"]},
        "qwen-0/0": {"replica": "qwen-0", "model": "qwen", "state": "starting", "port": 41002},
    }},
    "cpu-1": {"address": "10.0.0.6", "cpu_cores": 16, "gpu_classes": {}, "shards": {
        "gemma-0/0": {"replica": "gemma-0", "model": "gemma", "state": "ready", "port": 41000},
    }},
}


def test_a_target_is_a_replica_id_or_the_first_ready_replica_of_a_model():
    assert resolve_target(NODES, "gemma-1") == Target("gemma", "gemma-1", "gpu-1", "2x H200", "http://10.0.0.5:41001")
    assert resolve_target(NODES, "gemma") == Target("gemma", "gemma-0", "cpu-1", "cpu 16 cores",
                                                    "http://10.0.0.6:41000")
    with pytest.raises(UsageError, match=r"no ready replica or model is called 'qwen'; ready now: gemma-0 \(gemma\), "
                                         r"gemma-1 \(gemma\)"):
        resolve_target(NODES, "qwen")


def test_a_node_class_names_the_replicas_devices_or_the_cpu():
    assert node_class({"gpu_classes": {"0": "H200", "1": "L40S"}}, ["0", "1"]) == "2x H200+L40S"
    assert node_class({"cpu_cores": 7.5}, []) == "cpu 7.5 cores"


def test_a_bench_line_says_the_shape_figures_class_and_build():
    record = BenchRecord(1796400000.0, "gemma-0", "gemma", "cpu-1", "cpu 16 cores", "b11434", "engine", 128, 64, 2,
                         8, 0.0504, 0.0702, None, 210.54)
    assert bench_line(record) == ("bench 2026-12-04 16:00Z: 128 in/64 out x2 via engine: TTFT p50 50 ms p90 70 ms, "
                                  "ITL p50 -, 210.5 tokens/s (cpu 16 cores, build b11434)")
