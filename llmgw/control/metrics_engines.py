"""The engines' own metrics per replica, as Prometheus metric families (pure).

The agents read each ready shard's engine `/metrics` (llmgw.agent.engine_load: llama-server `--metrics`, vLLM,
SGLang) with their readings and carry the load in the heartbeats; this turns the fresh readings of one fleet
snapshot into `llmgw_engine_*` families with the shard's labels (`node`, `model`, `replica`, `shard`), whatever
the engine's own series names were. A value the engine does not publish (llama-server b11434 has no KV-cache
series, nor prefix-cache counters) is absent, never 0; so is every value of a reading older than 60 s.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from llmgw.control.readings import NodeReadings
from llmgw.control.registry import NodeRecord

SHARD = ["node", "model", "replica", "shard"]

# (EngineLoad field, family name (a counter's without its _total), counter?, help)
_FAMILIES = (
    ("requests_running", "llmgw_engine_requests_running", False,
     "Requests the engine is processing now (llama.cpp requests_processing, vLLM num_requests_running, SGLang "
     "num_running_reqs)."),
    ("requests_waiting", "llmgw_engine_requests_waiting", False,
     "Requests queued in the engine (llama.cpp requests_deferred, vLLM num_requests_waiting, SGLang num_queue_reqs)."),
    ("kv_cache_usage", "llmgw_engine_kv_cache_usage_ratio", False, "KV-cache in use, 0-1."),
    ("prompt_tokens_total", "llmgw_engine_prompt_tokens", True, "Prompt tokens the engine processed since it started."),
    ("generation_tokens_total", "llmgw_engine_generation_tokens", True,
     "Tokens the engine generated since it started."),
    ("prefix_cache_queries_total", "llmgw_engine_prefix_cache_queries", True,
     "Prompt tokens looked up in the engine's prefix cache since it started."),
    ("prefix_cache_hits_total", "llmgw_engine_prefix_cache_hits", True,
     "Prompt tokens found in the engine's prefix cache since it started."),
    ("prefill_seconds_total", "llmgw_engine_prefill_seconds", True,
     "Seconds the engine spent on prompts since it started (vLLM: summed over requests)."),
    ("prefill_tokens_total", "llmgw_engine_prefill_tokens", True,
     "Prompt tokens the engine computed in those seconds (prefix-cache hits left out)."),
    ("decode_seconds_total", "llmgw_engine_decode_seconds", True,
     "Seconds the engine's requests spent generating after their first token, summed over requests."),
    ("decode_tokens_total", "llmgw_engine_decode_tokens", True, "Tokens generated in those requests."),
    ("decode_requests_total", "llmgw_engine_decode_requests", True,
     "Requests counted in llmgw_engine_decode_tokens (vLLM only)."),
)


def engine_families(fresh: list[tuple[NodeRecord, NodeReadings]]) -> Iterator[Metric]:
    """One family per engine value of `_FAMILIES` (returned even when empty), with a sample per shard whose
    engine published it in its node's fresh readings. Shards no longer in the node's state are left out."""
    families = [(field, CounterMetricFamily(name, text, labels=SHARD) if counter
                 else GaugeMetricFamily(name, text, labels=SHARD)) for field, name, counter, text in _FAMILIES]
    for record, readings in fresh:
        shards = {s.shard_id: s for s in record.state.shards}
        for reading in readings.shards:
            shard = shards.get(reading.shard_id)
            if shard is None or reading.engine is None:
                continue
            labels = [record.node_id, shard.model, shard.replica_id, shard.shard_id]
            for field, family in families:
                value = getattr(reading.engine, field)
                if value is not None:
                    family.add_metric(labels, float(value))
    for _field, family in families:
        yield family
