"""The forecast part of a review's Markdown (`llmgw.plan.forecasting`): one row per changed model, then each
project's quota headroom. Pure."""

from __future__ import annotations

from llmgw.plan.forecasting import ModelForecast, QuotaHeadroom
from llmgw.plan.reviewing import Review


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ") or " "


def figure(value: float) -> str:
    """A rate or count for a reader: whole with thousands separators from 100, else 3 significant digits."""
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def seconds_text(value: float | None, overloaded: bool = False) -> str:
    """A TTFT for a reader ("310 ms", "2.90 s"); None is "overloaded" when `overloaded`, else "?"."""
    if value is None:
        return "overloaded" if overloaded else "?"
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def window(seconds: float) -> str:
    """A load window in words ("3 days", "6 hours", "90 seconds")."""
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size and seconds % size == 0:
            count = int(seconds // size)
            return f"{count} {unit}{'' if count == 1 else 's'}"
    return f"{seconds:g} seconds"


def _tokens(f: ModelForecast) -> str:
    if f.capacity_after is None or f.expected_tokens_per_second is None:
        return f"{figure(f.demand_tokens_per_second)} asked, capacity ?" if f.demand_tokens_per_second else "?"
    text = f"{figure(f.expected_tokens_per_second)} of {figure(f.capacity_after)}"
    if f.capacity_before is not None and f.capacity_before != f.capacity_after:
        text += f" (capacity now {figure(f.capacity_before)})"
    return text


def _gpu_hours(f: ModelForecast, currency: str) -> str:
    text = f"{figure(f.gpu_hours_per_day_before)} → {figure(f.gpu_hours_per_day_after)}"
    if f.cost_per_day_after is not None or f.cost_per_day_before is not None:
        text += f" ({figure(f.cost_per_day_after or 0.0)} {currency}/day)"
    return text


def _use(used: float, limit: int | None) -> str:
    if limit is None:
        return f"{figure(used)} (no limit)"
    share = f"{used / limit:.0%}" if limit else "∞"
    return f"{figure(used)} of {figure(limit)} ({share})"


def _quota_rows(review: Review) -> list[str]:
    seen: dict[str, tuple[QuotaHeadroom, list[str]]] = {}
    for f in review.forecasts:
        for q in f.quotas:
            seen.setdefault(q.project, (q, []))[1].append(f.model)
    if not seen:
        return []
    lines = ["", "Quota headroom of the projects that may use them (their own quota in head; every model they use "
             "counts):", "", "| project | may use | requests/min at the busiest hour | tokens/min at the busiest hour "
             "| tokens/day |", "| --- | --- | --- | --- | --- |"]
    for name, (q, models) in sorted(seen.items()):
        over = " **over**" if any(share > 1 for share in q.shares().values()) else ""
        lines.append(f"| `{_cell(name)}`{over} | {', '.join(f'`{m}`' for m in models)} | "
                     f"{_use(q.requests_per_minute, q.requests_per_minute_limit)} | "
                     f"{_use(q.tokens_per_minute, q.tokens_per_minute_limit)} | "
                     f"{_use(q.tokens_per_day, q.tokens_per_day_limit)} |")
    return lines


def forecast_markdown(review: Review) -> list[str]:
    """The "Forecast" section's lines (none when no model changed): per changed model, replicas, completion
    tokens/s expected at the busiest hour of capacity, TTFT p90 now and after, GPU-hours per day (and their cost);
    what could not be forecast and why; then each project's quota headroom."""
    if not review.forecasts:
        return []
    if review.load_window_seconds:
        source = (f"From the fleet's measured speeds and its traffic over the last {window(review.load_window_seconds)}"
                  + (f" up to {review.load_until}" if review.load_until else "") + ", at its busiest hour.")
    else:
        source = "The fleet snapshot recorded no load (`llmgw fleet snapshot` adds it): GPU-hours only."
    lines = ["", "### Forecast", "", source + " How: docs/review.md, \"The forecast\".", "",
             "| model | replicas now → after | completion tokens/s: expected of capacity | TTFT p90 now → after "
             "| GPU-hours/day now → after |", "| --- | --- | --- | --- | --- |"]
    notes = []
    for f in review.forecasts:
        lines.append(f"| `{_cell(f.model)}` | {f.replicas_before} → {f.replicas_after} | {_tokens(f)} | "
                     f"{seconds_text(f.ttft_p90_before)} → {seconds_text(f.ttft_p90_after, f.overloaded)} | "
                     f"{_gpu_hours(f, review.currency)} |")
        if f.overloaded:
            notes.append(f"- **`{f.model}` is overloaded after the change**: its busiest hour asks "
                         f"{figure(f.demand_tokens_per_second)} completion tokens/s, its {f.replicas_after} "
                         f"replica{'' if f.replicas_after == 1 else 's'} make at most "
                         f"{figure(f.capacity_after or 0.0)}.")
        if f.unknown:
            notes.append(f"- `{f.model}`: not forecast: {'; '.join(f.unknown)}.")
    if notes:
        lines += [""] + notes
    return lines + _quota_rows(review)
