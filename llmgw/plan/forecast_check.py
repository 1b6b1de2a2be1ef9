"""A review's forecast against what was measured once the change ran (`llmgw forecast-check`). Pure.

For each model a review forecast (`llmgw.plan.forecasting`, its JSON in the review's `forecast.models`), the load
recorded since (a `RecordedLoad` over a window after the apply) gives what happened, on the forecast's own terms:

    requests/s      at the busiest clock hour (the window's mean when the window is shorter than an hour, or the
                    hour is not known)
    tokens/s        those requests/s x the mean completion tokens per request (what the replicas made)
    TTFT p90        the p90 of the TTFTs recorded in the window

and the error of each figure is measured / forecast - 1 (None when either is unknown or the forecast is 0). The
traffic's own change (requests/s forecast against measured) is shown beside them: a forecast made for the traffic
of the days before cannot foresee other traffic, and the error then says more about the traffic than the model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from llmgw.plan.forecasting import HOUR, ModelLoad, RecordedLoad


@dataclass(frozen=True)
class ForecastCheck:
    """One model's forecast (`*_forecast`, from the review) and what was measured (`*_measured`), None: unknown.
    `requests` counts the requests recorded in the window."""

    model: str
    requests: int
    rate_forecast: float | None
    rate_measured: float | None
    tokens_forecast: float | None
    tokens_measured: float | None
    ttft_p90_forecast: float | None
    ttft_p90_measured: float | None

    @staticmethod
    def _error(measured: float | None, forecast: float | None) -> float | None:
        return None if measured is None or not forecast else measured / forecast - 1.0

    @property
    def rate_error(self) -> float | None:
        """How far the traffic moved from the traffic the forecast was made for (measured / forecast - 1)."""
        return self._error(self.rate_measured, self.rate_forecast)

    @property
    def tokens_error(self) -> float | None:
        """measured / forecast - 1 of completion tokens per second."""
        return self._error(self.tokens_measured, self.tokens_forecast)

    @property
    def ttft_p90_error(self) -> float | None:
        """measured / forecast - 1 of TTFT p90."""
        return self._error(self.ttft_p90_measured, self.ttft_p90_forecast)

    def to_json(self) -> dict[str, Any]:
        """The check as JSON-ready data: every field, and `rate_error`, `tokens_error`, `ttft_p90_error`."""
        return {"model": self.model, "requests": self.requests, "rate_forecast": self.rate_forecast,
                "rate_measured": self.rate_measured, "rate_error": self.rate_error,
                "tokens_forecast": self.tokens_forecast, "tokens_measured": self.tokens_measured,
                "tokens_error": self.tokens_error, "ttft_p90_forecast": self.ttft_p90_forecast,
                "ttft_p90_measured": self.ttft_p90_measured, "ttft_p90_error": self.ttft_p90_error}


def _number(doc: Mapping[str, Any], key: str) -> float | None:
    value = doc.get(key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise ValueError(f"{key} is {value!r}, not a number")
    return None if value is None else float(value)


def check_forecast(forecasts: list[Mapping[str, Any]], load: RecordedLoad) -> tuple[ForecastCheck, ...]:
    """Each forecast of `forecasts` (a review's `forecast.models`) against `load` (recorded after the change), in
    the review's order. Raises ValueError (or KeyError) when `forecasts` is not a review's forecast."""
    out = []
    for doc in forecasts:
        model = str(doc["model"])
        mine = [t for t in load.traffic if t.model == model]
        requests = sum(t.requests for t in mine)
        busiest = load.models.get(model, ModelLoad(model))
        rate = tokens = None
        if requests and load.window_seconds:
            rate = (busiest.busiest_hour_requests / HOUR if busiest.busiest_hour_requests
                    and load.window_seconds >= HOUR else requests / load.window_seconds)
            tokens = rate * sum(t.completion_tokens for t in mine) / requests
        out.append(ForecastCheck(model, requests, _number(doc, "requests_per_second"), rate,
                                 _number(doc, "expected_tokens_per_second"), tokens,
                                 _number(doc, "ttft_p90_after"), busiest.ttft_p90_seconds))
    return tuple(out)
