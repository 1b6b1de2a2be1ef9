"""The admin API's inputs, checked: query parameters and JSON body fields, each refused with the field's name.

Pure functions of the parsed query (`{name: last value}`) or JSON body (a dict from `json.loads`, which reads
`NaN` and `Infinity` as floats). A wrong value raises `AdminInputError(field, message)`, which the admin API
answers with 400 `{"error": {"type": "bad_request", "message", "param": field}}`.
"""

from __future__ import annotations

import math
from types import MappingProxyType
from typing import Any

from llmgw.errors import LlmgwError

from llmgw.wire.tls import MAX_JOIN_TOKEN_TTL  # seconds: a join token lives a week at most
from llmgw.plan.rendering import plan_from_json
from llmgw.plan.forecast_check import check_forecast
from llmgw.plan.forecasting import RecordedLoad
from llmgw.plan.reviewed import ReviewedPlan
MAX_HISTORY_LIMIT = 10_000
MAX_LOG_LINES = 100_000
MAX_APPLY_TIMEOUT = 24 * 3600.0  # seconds


class AdminInputError(LlmgwError):
    """A query parameter or body field of an admin API request is wrong; `field` names it."""

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(message)


# The query parameters each route takes; any other is refused (a typo such as `limt=5` is not silently ignored).
QUERY_PARAMETERS: dict[str, frozenset[str]] = {
    "/api/v1/history": frozenset({"limit", "author"}),
    "/api/v1/plan": frozenset({"rev"}),
    "/api/v1/logs": frozenset({"node", "shard", "lines"}),
    "/api/v1/keys": frozenset({"project"}),
    "/api/v1/usage/gpu-hours": frozenset({"since", "project"}),
    "/api/v1/fleet": frozenset({"window"}),
    "/api/v1/upgrade": frozenset({"max_unavailable", "paused", "confirm_seconds", "ready_timeout"}),
}


def check_query_names(path: str, query: dict[str, str], known: dict[str, frozenset[str]] = QUERY_PARAMETERS) -> None:
    """Refuse a query parameter that the route `path` does not take; routes not in `known` are not checked.

    Raises AdminInputError naming the first unknown parameter (sorted) and the ones the route takes.
    """
    if path not in known:
        return
    unknown = sorted(set(query) - known[path])
    if unknown:
        takes = ", ".join(sorted(known[path])) or "none"
        raise AdminInputError(unknown[0][:40], f"{path} takes no query parameter {unknown[0][:40]!r} "
                                               f"(it takes: {takes})")


def query_int(query: dict[str, str], field: str, default: int, low: int, high: int) -> int:
    """The integer query parameter `field` (`default` when absent), between `low` and `high` inclusive.

    Raises AdminInputError naming `field` for anything but decimal digits (an optional sign) in range.
    """
    text = query.get(field)
    if text is None:
        return default
    stripped = text.strip()
    if not stripped.lstrip("+-").isdigit() or not stripped.isascii() or len(stripped) > 12:
        raise AdminInputError(field, f"{field} must be a whole number from {low} to {high}, not {text[:40]!r}")
    value = int(stripped)
    if not low <= value <= high:
        raise AdminInputError(field, f"{field} must be from {low} to {high}, not {value}")
    return value


def body_number(body: dict[str, Any], field: str, default: float, low: float, high: float) -> float:
    """The JSON number `field` of `body` (`default` when absent), finite, with low < value <= high.

    Raises AdminInputError naming `field` for a string, boolean, null, NaN, an infinity or a value out of range.
    """
    if field not in body:
        return default
    value = body[field]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise AdminInputError(field, f"{field} must be a number of seconds, not {type(value).__name__} "
                                     f"{str(value)[:40]!r}")
    if not math.isfinite(value) or not low < value <= high:
        raise AdminInputError(field, f"{field} must be more than {low:g} and at most {high:g} seconds, not {value}")
    return float(value)


def body_bool(body: dict[str, Any], field: str, default: bool) -> bool:
    """The JSON boolean `field` of `body` (`default` when absent). Raises AdminInputError for anything else."""
    value = body.get(field, default)
    if not isinstance(value, bool):
        raise AdminInputError(field, f"{field} must be true or false, not {str(value)[:40]!r}")
    return value


def body_text(body: dict[str, Any], field: str, default: str, max_length: int = 200) -> str:
    """The JSON string `field` of `body` (`default` when absent, null or empty), at most `max_length` characters.

    Raises AdminInputError naming `field` for a non-string or a longer string.
    """
    value = body.get(field)
    if value is None or value == "":
        return default
    if not isinstance(value, str):
        raise AdminInputError(field, f"{field} must be a string, not {type(value).__name__}")
    if len(value) > max_length:
        raise AdminInputError(field, f"{field} must be at most {max_length} characters, not {len(value)}")
    return value


def body_reviewed(body: dict[str, Any]) -> ReviewedPlan | None:
    """The body's `reviewed` object, {"commit": 40 hex, "fleet": "sha256:...", "plan": `llmgw plan --json`'s plan,
    "forecast": the review's `forecast.models` (optional)} (what `llmgw apply --review` sends from a review's JSON),
    as a ReviewedPlan; None when absent or null.

    Raises AdminInputError naming `reviewed` (or the key inside it) for anything else.
    """
    value = body.get("reviewed")
    if value is None:
        return None
    if not isinstance(value, dict):
        raise AdminInputError("reviewed", "reviewed must be an object: {commit, fleet, plan}")
    commit, fleet = value.get("commit"), value.get("fleet", "")
    if not isinstance(commit, str) or len(commit) != 40 or not isinstance(fleet, str) or len(fleet) > 200:
        raise AdminInputError("reviewed", "reviewed.commit must be the reviewed head's commit id (40 hex) and "
                                          "reviewed.fleet the review's fleet revision")
    try:
        plan = plan_from_json(value["plan"])
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise AdminInputError("reviewed", f"reviewed.plan is not a plan as `llmgw review --json` writes it: {exc!r}"[:300]) from None
    forecast = value.get("forecast") or []
    try:
        if not isinstance(forecast, list) or not all(isinstance(doc, dict) for doc in forecast):
            raise TypeError("not a list of objects")
        check_forecast(forecast, RecordedLoad(0.0))  # what the control plane will read of it, read once now
    except (KeyError, TypeError, ValueError) as exc:
        raise AdminInputError("reviewed", "reviewed.forecast is not a forecast as `llmgw review --json` writes it "
                                          f"(its forecast.models): {exc!r}"[:300]) from None
    return ReviewedPlan(commit, fleet, plan, tuple(MappingProxyType(dict(doc)) for doc in forecast))
