"""What one `llmgw bench` run measured, summed up (pure: samples in, figures out).

Each request of a run is a `RequestTiming`: when it was sent, when each streamed chunk carrying text arrived
(seconds on one monotonic clock), the tokens the engine counted (`usage`) and the engine's own `timings` when it
sends them (llama-server does: `prompt_ms`, `predicted_per_second`, ...). `summarize` turns a run into a
`BenchSummary`:

- TTFT: first text chunk minus sent, per request.
- Inter-token latency (ITL): the time between text chunks, over the completion tokens they carried (one token per
  chunk for llama-server and vLLM; a chunk of several tokens counts its gap once per token over the run's mean).
  Per request it is (last chunk - first chunk) / (completion tokens - 1).
- Decode tokens/s per request: 1 / its ITL. Output tokens/s of the run: every completion token over the wall time.
- Percentiles p50, p90, p99 by linear interpolation between closest ranks (numpy's default, "linear").

Failed requests (an error sentence in `error`) are counted and left out of the latencies.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class RequestTiming:
    """One request of a run. Times in seconds on one monotonic clock: `sent`, `chunks` (arrival of each chunk that
    carried text, in order), `done` (the stream ended). `prompt_tokens`, `completion_tokens`: the engine's `usage`
    (0: not reported). `engine`: the engine's own `timings` object (llama-server), empty when it sent none.
    `error`: why the request failed ("" when it did not)."""

    sent: float
    chunks: tuple[float, ...] = ()
    done: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    engine: Mapping[str, Any] = field(default_factory=dict)
    error: str = ""

    @property
    def ttft(self) -> float | None:
        """Seconds from sent to the first text chunk; None when none came."""
        return self.chunks[0] - self.sent if self.chunks and not self.error else None

    @property
    def itl(self) -> float | None:
        """Mean seconds per completion token after the first; None with fewer than two tokens or chunks."""
        tokens = self.completion_tokens or len(self.chunks)
        if self.error or len(self.chunks) < 2 or tokens < 2:
            return None
        return (self.chunks[-1] - self.chunks[0]) / (tokens - 1)


@dataclass(frozen=True)
class Percentiles:
    """p50, p90 and p99 of some values (None when there were none), and how many values there were."""

    p50: float | None
    p90: float | None
    p99: float | None
    count: int

    def to_json(self) -> dict[str, Any]:
        return {"p50": self.p50, "p90": self.p90, "p99": self.p99, "count": self.count}


@dataclass(frozen=True)
class BenchSummary:
    """A run's figures. Latencies in seconds; tokens/s per second of wall time. `engine_decode_per_second` and
    `engine_prompt_ms`: the same percentiles of what the engine itself reported (llama-server's `timings`;
    count 0 for an engine that reports none), to set beside ours."""

    requests: int
    failed: int
    wall_seconds: float
    prompt_tokens: int
    completion_tokens: int
    output_tokens_per_second: float
    ttft: Percentiles
    itl: Percentiles
    decode_tokens_per_second: Percentiles
    engine_decode_per_second: Percentiles
    engine_prompt_ms: Percentiles
    errors: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "requests": self.requests, "failed": self.failed, "wall_seconds": self.wall_seconds,
            "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
            "output_tokens_per_second": self.output_tokens_per_second,
            "ttft_seconds": self.ttft.to_json(), "itl_seconds": self.itl.to_json(),
            "decode_tokens_per_second": self.decode_tokens_per_second.to_json(),
            "engine": {"decode_tokens_per_second": self.engine_decode_per_second.to_json(),
                       "prompt_ms": self.engine_prompt_ms.to_json()},
            "errors": list(self.errors),
        }


def percentile(values: Sequence[float], q: float) -> float | None:
    """The `q`th percentile (0..100) of `values` by linear interpolation between closest ranks; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def percentiles(values: Sequence[float]) -> Percentiles:
    """`Percentiles` of `values` (p50, p90, p99)."""
    p50, p90, p99 = (percentile(values, q) for q in PERCENTILES)
    return Percentiles(p50, p90, p99, len(values))


def summarize(timings: Sequence[RequestTiming], wall_seconds: float) -> BenchSummary:
    """The figures of a run of `timings` that took `wall_seconds` (> 0) from the first request sent to the last
    answer's end. Failed requests count in `failed` (their distinct errors, at most 5, in `errors`), not in the
    latencies nor the tokens."""
    ok = [t for t in timings if not t.error]
    ttfts = [v for v in (t.ttft for t in ok) if v is not None]
    itls = [v for v in (t.itl for t in ok) if v is not None]
    completion = sum(t.completion_tokens or len(t.chunks) for t in ok)
    engine_decode = [float(t.engine["predicted_per_second"]) for t in ok if t.engine.get("predicted_per_second")]
    engine_prompt = [float(t.engine["prompt_ms"]) for t in ok if "prompt_ms" in t.engine]
    errors = tuple(dict.fromkeys(t.error for t in timings if t.error))[:5]
    return BenchSummary(
        requests=len(timings), failed=len(timings) - len(ok), wall_seconds=wall_seconds,
        prompt_tokens=sum(t.prompt_tokens for t in ok), completion_tokens=completion,
        output_tokens_per_second=completion / wall_seconds if wall_seconds > 0 else 0.0,
        ttft=percentiles(ttfts), itl=percentiles(itls),
        decode_tokens_per_second=percentiles([1.0 / v for v in itls if v > 0]),
        engine_decode_per_second=percentiles(engine_decode), engine_prompt_ms=percentiles(engine_prompt),
        errors=errors)


def render(summary: BenchSummary) -> list[str]:
    """The summary as lines for a terminal: one line per figure with p50 / p90 / p99 (ms for latencies)."""
    def row(name: str, p: Percentiles, scale: float, unit: str) -> str:
        cells = ["-" if v is None else f"{v * scale:.1f}" for v in (p.p50, p.p90, p.p99)]
        return f"{name:<24} {cells[0]:>9} {cells[1]:>9} {cells[2]:>9}  {unit}"

    lines = [f"{summary.requests} requests ({summary.failed} failed) in {summary.wall_seconds:.2f} s: "
             f"{summary.prompt_tokens} prompt and {summary.completion_tokens} completion tokens, "
             f"{summary.output_tokens_per_second:.1f} output tokens/s",
             f"{'':<24} {'p50':>9} {'p90':>9} {'p99':>9}",
             row("TTFT", summary.ttft, 1000.0, "ms"),
             row("inter-token latency", summary.itl, 1000.0, "ms"),
             row("decode per request", summary.decode_tokens_per_second, 1.0, "tokens/s")]
    if summary.engine_decode_per_second.count:
        lines.append(row("engine's decode", summary.engine_decode_per_second, 1.0, "tokens/s"))
        lines.append(row("engine's prompt time", summary.engine_prompt_ms, 1.0, "ms"))
    lines.extend(f"error: {error}" for error in summary.errors)
    return lines
