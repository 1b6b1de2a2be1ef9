"""SVG charts drawn on the server (pure), each with axes, tick labels carrying their units, axis titles and a legend.

`gpu_chart`: one card's last hour of one-minute buckets, three lines on a 0-100 % scale: utilisation (class
"util"), memory used against the card's memory (class "mem") and power draw against its limit (class "power"). The
x axis is the clock (UTC, "HH:MM") from 60 minutes ago to now; a minute without readings breaks the line (a gap,
never a 0).

`day_columns`: tokens per UTC day, one slot per day of the window (a day without requests is an empty slot, so one
day of data is one column among the window's days, never a block across the chart), each column stacked prompt
(class "prompt") under completion (class "completion") tokens, on a y axis of "nice" token counts ("1.5k tokens").

The markup holds numbers, fixed words and the (escaped) texts given, so it is safe to embed as is; colours come
from the stylesheet. Plot coordinates: the plot area is `LEFT`..`WIDTH - RIGHT` by `TOP`..`HEIGHT - BOTTOM`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable

from llmgw.console.buckets import MINUTES, GpuSeries
from llmgw.units import format_size

WIDTH, HEIGHT = 640, 220
LEFT, RIGHT, TOP, BOTTOM = 100, 28, 28, 44
PLOT_W, PLOT_H = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM


def _x(fraction: float) -> float:
    return round(LEFT + fraction * PLOT_W, 1)


def _y(fraction: float) -> float:
    """The y of a value at `fraction` (0..1) of the y axis's top."""
    return round(TOP + PLOT_H - max(0.0, min(1.0, fraction)) * PLOT_H, 1)


def _open(kind: str, title: str) -> list[str]:
    return [f'<svg class="chart {kind}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{_attr(title)}">',
            f'<title>{_attr(title)}</title>']


def _y_axis(ticks: Iterable[tuple[float, str]], title: str) -> list[str]:
    """The y axis line, a grid line and a label ("50 %") per tick (fraction of the axis, text), and its title."""
    parts = [f'<line class="axis" x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{TOP + PLOT_H}"/>']
    for fraction, text in ticks:
        y = _y(fraction)
        parts.append(f'<line class="grid" x1="{LEFT}" y1="{y}" x2="{LEFT + PLOT_W}" y2="{y}"/>')
        parts.append(f'<text class="tick y-tick" x="{LEFT - 6}" y="{y}" text-anchor="end" '
                     f'dominant-baseline="middle">{_attr(text)}</text>')
    middle = TOP + PLOT_H / 2
    parts.append(f'<text class="axis-title y-title" x="12" y="{middle}" text-anchor="middle" '
                 f'transform="rotate(-90 12 {middle})">{_attr(title)}</text>')
    return parts


def _x_axis(ticks: Iterable[tuple[float, str]], title: str) -> list[str]:
    """The x axis line, a tick mark and a label per tick (fraction of the axis, text), and its title."""
    bottom = TOP + PLOT_H
    parts = [f'<line class="axis" x1="{LEFT}" y1="{bottom}" x2="{LEFT + PLOT_W}" y2="{bottom}"/>']
    for fraction, text in ticks:
        x = _x(fraction)
        parts.append(f'<line class="axis" x1="{x}" y1="{bottom}" x2="{x}" y2="{bottom + 4}"/>')
        parts.append(f'<text class="tick x-tick" x="{x}" y="{bottom + 16}" text-anchor="middle">{_attr(text)}</text>')
    parts.append(f'<text class="axis-title x-title" x="{LEFT + PLOT_W / 2}" y="{HEIGHT - 6}" '
                 f'text-anchor="middle">{_attr(title)}</text>')
    return parts


def _legend(entries: Iterable[tuple[str, str]]) -> list[str]:
    """A row of (class, text) swatches above the plot, left to right."""
    parts = ['<g class="legend">']
    x = LEFT
    for name, text in entries:
        parts.append(f'<rect class="key {name}" x="{x}" y="8" width="12" height="12"/>'
                     f'<text class="key-text" x="{x + 16}" y="18">{_attr(text)}</text>')
        x += 24 + 7 * len(text)
    parts.append("</g>")
    return parts


def _segments(values: list[float | None]) -> list[list[tuple[float, float]]]:
    """Runs of consecutive known values as (x, y) points in the chart's coordinates (values in percent)."""
    step = 1.0 / max(1, len(values) - 1)
    runs: list[list[tuple[float, float]]] = [[]]
    for i, value in enumerate(values):
        if value is None:
            if runs[-1]:
                runs.append([])
            continue
        runs[-1].append((_x(i * step), _y(value / 100.0)))
    return [run for run in runs if run]


def _clock(minute: int) -> str:
    return time.strftime("%H:%M", time.gmtime(minute * 60))


def gpu_chart(series: GpuSeries | None, now_minute: int, memory_total_bytes: int,
              power_limit_watts: float | None, title: str) -> str:
    """An `<svg>` element (a string) of one card's last hour ending at `now_minute` (unix minutes).

    `memory_total_bytes` and `power_limit_watts` scale memory and power to percent (a line, and its legend entry,
    is left out when its scale is unknown). `title` becomes the chart's accessible name. A None `series` draws the
    axes and legend without lines.
    """
    means = series.means(now_minute) if series is not None else [(0, None, None, None)] * MINUTES
    lines = {
        "util": [m[1] for m in means],
        "mem": [None if m[2] is None or not memory_total_bytes else 100.0 * m[2] / memory_total_bytes
                for m in means],
        "power": [None if m[3] is None or not power_limit_watts else 100.0 * m[3] / power_limit_watts
                  for m in means],
    }
    legend = [("util", "utilisation %")]
    if memory_total_bytes:
        legend.append(("mem", f"memory % of {format_size(memory_total_bytes)}B"))
    if power_limit_watts:
        legend.append(("power", f"power % of {power_limit_watts:.0f} W limit"))
    first = now_minute - MINUTES + 1
    x_ticks = [(offset / (MINUTES - 1), _clock(first + offset)) for offset in (0, 15, 30, 45, MINUTES - 1)]
    parts = _open("minutes", title)
    parts += _legend(legend)
    parts += _y_axis([(p / 100, f"{p} %") for p in (0, 25, 50, 75, 100)], "percent")
    parts += _x_axis(x_ticks, "time (UTC), one-minute means over the last hour")
    for name, values in lines.items():
        for run in _segments(values):
            if len(run) == 1:
                x, y = run[0]
                parts.append(f'<circle class="{name}" cx="{x}" cy="{y}" r="2.5"/>')
            else:
                points = " ".join(f"{x},{y}" for x, y in run)
                parts.append(f'<polyline class="{name}" points="{points}"/>')
    parts.append("</svg>")
    return "".join(parts)


def nice_top(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 x 10^n that is at least `value` (1 for 0 or less): the y axis's top."""
    if value <= 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(value))
    for step in (1.0, 2.0, 2.5, 5.0, 10.0):
        if step * power >= value:
            return step * power
    return 10.0 * power


def count_text(value: float, unit: str) -> str:
    """`value` short, with SI prefixes for thousands and millions, and its unit: "0 tokens", "750 tokens",
    "1.5k tokens", "2M tokens"."""
    for limit, prefix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= limit:
            return f"{value / limit:.3g}{prefix} {unit}"
    return f"{value:.3g} {unit}" if value else f"0 {unit}"


def window_days(now: float, days: int) -> list[str]:
    """The UTC days ("YYYY-MM-DD") of the last `days` days ending with the day of `now` (unix seconds), oldest
    first."""
    return [time.strftime("%Y-%m-%d", time.gmtime(now - back * 86400)) for back in range(days - 1, -1, -1)]


def day_columns(rows, title: str, days: list[str] | None = None) -> str:
    """An `<svg>` column chart (a string) of tokens per UTC day, stacked prompt (below) and completion tokens.

    `rows` are shaped like `llmgw.store.UsageRow` (`group` "YYYY-MM-DD", `prompt_tokens`, `completion_tokens`);
    `days` the window's days in order (`window_days`): one slot each, a day without a row left empty (default:
    the rows' days). No row draws the axes, the legend and "no request in this period".
    """
    by_day = {str(r.group): (int(r.prompt_tokens), int(r.completion_tokens)) for r in rows}
    slots = list(days) if days is not None else list(by_day)
    slots += sorted(d for d in by_day if d not in slots)
    top = nice_top(max((p + c for p, c in by_day.values()), default=0))
    parts = _open("columns", title)
    parts += _legend([("prompt", "prompt tokens"), ("completion", "completion tokens")])
    parts += _y_axis([(f, count_text(top * f, "tokens")) for f in (0.0, 0.25, 0.5, 0.75, 1.0)], "tokens")
    slot = 1.0 / max(1, len(slots))
    label_every = max(1, math.ceil(len(slots) / 10))  # at most about ten date labels
    ticks = [((i + 0.5) * slot, day[5:] if len(slots) > 1 else day) for i, day in enumerate(slots)
             if i % label_every == 0 or i == len(slots) - 1]
    parts += _x_axis(ticks, "day (UTC)" + (f", {slots[0][:4]}" if len(slots) > 1 else ""))
    width = min(slot * PLOT_W * 0.7, 48.0)  # a lone day is one column, not a block across the chart
    for i, day in enumerate(slots):
        if day not in by_day:
            continue
        prompt, completion = by_day[day]
        centre = LEFT + (i + 0.5) * slot * PLOT_W
        x = round(centre - width / 2, 1)
        base = 0.0
        for name, count in (("prompt", prompt), ("completion", completion)):
            y0, y1 = _y(base / top), _y((base + count) / top)
            parts.append(f'<rect class="tokens {name}" data-day="{_attr(day)}" x="{x}" y="{y1}" '
                         f'width="{round(width, 1)}" height="{round(y0 - y1, 1)}"><title>{_attr(day)}: {count} '
                         f'{name} tokens</title></rect>')
            base += count
    if not by_day:
        parts.append(f'<text class="empty" x="{LEFT + PLOT_W / 2}" y="{TOP + PLOT_H / 2}" text-anchor="middle">'
                     f'no request in this period</text>')
    parts.append("</svg>")
    return "".join(parts)


def _attr(text: str) -> str:
    return text.replace("&", "&amp;").replace('"', "&quot;").replace("<", "&lt;").replace(">", "&gt;")
