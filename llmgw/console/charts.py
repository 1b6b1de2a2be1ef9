"""SVG charts drawn on the server (pure): one chart per GPU of the last hour's one-minute buckets.

Three lines on a 0-100 % scale: utilisation (class "util"), memory used against the card's memory (class "mem")
and power draw against its limit (class "power"). A minute without readings breaks the line (a gap, never a 0).
The markup holds numbers and fixed words only, so it is safe to embed as is; colours come from the stylesheet.
"""

from __future__ import annotations

from llmgw.console.buckets import GpuSeries

WIDTH, HEIGHT = 600, 120


def _segments(values: list[float | None]) -> list[list[tuple[float, float]]]:
    """Runs of consecutive known values as (x, y) points in the chart's coordinates (values in percent)."""
    step = WIDTH / max(1, len(values) - 1)
    runs: list[list[tuple[float, float]]] = [[]]
    for i, value in enumerate(values):
        if value is None:
            if runs[-1]:
                runs.append([])
            continue
        clamped = max(0.0, min(100.0, value))
        runs[-1].append((round(i * step, 1), round(HEIGHT - clamped * HEIGHT / 100.0, 1)))
    return [run for run in runs if run]


def gpu_chart(series: GpuSeries | None, now_minute: int, memory_total_bytes: int,
              power_limit_watts: float | None, title: str) -> str:
    """An `<svg>` element (a string) of one card's last hour ending at `now_minute` (unix minutes).

    `memory_total_bytes` and `power_limit_watts` scale memory and power to percent (a line is left out when its
    scale is unknown). `title` becomes the chart's accessible name. A None `series` draws empty axes.
    """
    means = series.means(now_minute) if series is not None else [(0, None, None, None)] * 60
    lines = {
        "util": [m[1] for m in means],
        "mem": [None if m[2] is None or not memory_total_bytes else 100.0 * m[2] / memory_total_bytes
                for m in means],
        "power": [None if m[3] is None or not power_limit_watts else 100.0 * m[3] / power_limit_watts
                  for m in means],
    }
    parts = [f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{_attr(title)}" '
             f'preserveAspectRatio="none">',
             f'<title>{_attr(title)}</title>']
    for y in (0, HEIGHT / 2, HEIGHT):
        parts.append(f'<line class="grid" x1="0" y1="{y}" x2="{WIDTH}" y2="{y}"/>')
    for name, values in lines.items():
        for run in _segments(values):
            if len(run) == 1:
                x, y = run[0]
                parts.append(f'<circle class="{name}" cx="{x}" cy="{y}" r="2"/>')
            else:
                points = " ".join(f"{x},{y}" for x, y in run)
                parts.append(f'<polyline class="{name}" points="{points}"/>')
    parts.append("</svg>")
    return "".join(parts)


def day_columns(rows, title: str) -> str:
    """An `<svg>` column chart (a string) of tokens per UTC day: one column per row of usage grouped by day, in
    row order, its height prompt + completion tokens against the largest day. `rows` are shaped like
    `llmgw.store.UsageRow` (`group` "YYYY-MM-DD", `prompt_tokens`, `completion_tokens`); empty rows draw axes only."""
    totals = [(str(r.group), int(r.prompt_tokens) + int(r.completion_tokens)) for r in rows]
    top = max((t for _, t in totals), default=0) or 1
    width = WIDTH / max(1, len(totals))
    parts = [f'<svg class="chart columns" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{_attr(title)}" '
             f'preserveAspectRatio="none">', f'<title>{_attr(title)}</title>',
             f'<line class="grid" x1="0" y1="{HEIGHT}" x2="{WIDTH}" y2="{HEIGHT}"/>']
    for i, (day, total) in enumerate(totals):
        height = round(total * HEIGHT / top, 1)
        parts.append(f'<rect class="tokens" x="{round(i * width + width * 0.1, 1)}" y="{round(HEIGHT - height, 1)}" '
                     f'width="{round(width * 0.8, 1)}" height="{height}"><title>{_attr(day)}: {total} tokens'
                     f'</title></rect>')
    parts.append("</svg>")
    return "".join(parts)


def _attr(text: str) -> str:
    return text.replace("&", "&amp;").replace('"', "&quot;").replace("<", "&lt;").replace(">", "&gt;")
