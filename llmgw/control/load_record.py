"""What the fleet did lately, as a forecast reads it (`llmgw.plan.forecasting.RecordedLoad`): the store's usage
records of the last `LOAD_WINDOW_SECONDS` and the speeds routing uses, turned into one value (pure)."""

from __future__ import annotations

from collections.abc import Mapping

from llmgw.plan.canary import percentile
from llmgw.plan.forecasting import ModelLoad, RecordedLoad, Traffic
from llmgw.routes import ReplicaSpeed
from llmgw.store import UsageLoad

LOAD_WINDOW_SECONDS = 3 * 86400.0
"""How far back `GET /api/v1/fleet` (and so `llmgw fleet snapshot` and `llmgw review`) reads the traffic unless
told (`?window=SECONDS`): 3 days."""

MAX_LOAD_WINDOW_SECONDS = 30 * 86400
"""The longest `?window=` of `GET /api/v1/fleet`: 30 days."""


def recorded_load(usage: UsageLoad, speeds: Mapping[str, ReplicaSpeed], window_seconds: float,
                  until: str) -> RecordedLoad:
    """The `RecordedLoad` of `usage` (the store's `usage_load` over `window_seconds` up to `until`, ISO 8601 UTC)
    and `speeds` (replica id -> the speed routing uses): each model's TTFT p90 is the nearest-rank p90 of the
    TTFTs the store gave (its latest requests that have one)."""
    traffic = tuple(Traffic(p.model, p.project, p.requests, p.prompt_tokens, p.completion_tokens, p.errors)
                    for p in usage.pairs)
    models = {model: ModelLoad(model, busiest, percentile(usage.ttfts.get(model, ()), 0.9),
                               len(usage.ttfts.get(model, ())))
              for model, busiest in sorted(usage.busiest_hour.items())}
    return RecordedLoad(window_seconds, until, dict(sorted(speeds.items())), traffic, models)
