"""Charts people can read (issue 42 item 4), over quart-trio's in-process test client: the usage chart with one day
of data has axes, tick labels with their units and a legend, and one column among the window's days (not a block
across the chart); usage per day of a chosen project and model from a real SQLite store; the node page's GPU charts
span the last hour's minute buckets on a clock axis and a percent axis, with a legend naming each line's scale."""

from __future__ import annotations

import html as html_lib
import re
from dataclasses import replace

import trio

from llmgw.console import Console, Login
from llmgw.control.state import ControlState
from llmgw.control.view import GpuSample, NodeReadings
from llmgw.store import UsageRecord, open_store

from .test_console_security import admin_only, no_history, state_with_one_gpu_node
from .test_console_usage import BEARER, NOW, console_over

DAY = 86400.0


def svg_of(html: str, marker: str) -> str:
    """The first `<svg ...>...</svg>` after `marker`."""
    rest = html.split(marker, 1)[1]
    return rest[rest.index("<svg"):rest.index("</svg>") + 6]


def texts(svg: str, cls: str) -> list[str]:
    return [html_lib.unescape(t) for t in re.findall(rf'<text class="{cls}"[^>]*>([^<]*)</text>', svg)]


async def test_one_day_of_usage_is_one_labelled_column_on_axes_with_units_and_a_legend(tmp_path):
    store = open_store(str(tmp_path / "llmgw.sqlite3"))
    store.record_usage(UsageRecord(project="demo", model="gemma", time=NOW - 60, prompt_tokens=1200,
                                   completion_tokens=300))
    html = await (await console_over(store).app.test_client().get("/console/usage?days=1", headers=BEARER)
                  ).get_data(as_text=True)
    svg = svg_of(html, 'id="usage-chart"')
    assert svg.count('class="axis"') >= 2                                   # both axes are drawn
    assert texts(svg, "tick y-tick") == ["0 tokens", "500 tokens", "1k tokens", "1.5k tokens", "2k tokens"]
    assert texts(svg, "tick x-tick") == ["2027-01-15"]                       # the one day, named in full
    assert texts(svg, "axis-title y-title") == ["tokens"] and texts(svg, "axis-title x-title") == ["day (UTC)"]
    assert texts(svg, "key-text") == ["prompt tokens", "completion tokens"]  # the legend
    widths = [float(w) for w in re.findall(r'<rect class="tokens [a-z]+"[^>]*width="([0-9.]+)"', svg)]
    assert widths == [48.0, 48.0]           # prompt and completion stacked in one narrow column, not a block
    assert 'aria-label="tokens per day, last 1 day"' in svg
    store.close()


async def test_usage_per_day_of_a_chosen_project_and_model(tmp_path):
    store = open_store(str(tmp_path / "llmgw.sqlite3"))
    for when, project, model, tokens in ((NOW - 60, "demo", "gemma", 10), (NOW - 60, "demo", "qwen", 20),
                                         (NOW - DAY, "demo", "gemma", 40), (NOW - DAY, "research", "gemma", 80)):
        store.record_usage(UsageRecord(project=project, model=model, time=when, prompt_tokens=tokens))

    async def usage(by: str, since: float | None, projects=None, model=None) -> list:
        return await trio.to_thread.run_sync(store.query_usage, projects, since, by, model)

    console = Console(ControlState, authorise=admin_only, history=no_history, usage=usage, wall=lambda: NOW)
    client = console.app.test_client()
    html = await (await client.get("/console/usage?days=7&project=demo&model=gemma", headers=BEARER)
                  ).get_data(as_text=True)
    svg = svg_of(html, 'id="usage-chart"')
    prompts = re.findall(r'<rect class="tokens prompt" data-day="([0-9-]+)"[^>]*><title>[^:]+: (\d+) prompt', svg)
    assert prompts == [("2027-01-14", "40"), ("2027-01-15", "10")]          # research's 80 and qwen's 20 left out
    assert 'aria-label="tokens per day, last 7 days, project demo · model gemma"' in svg
    day_rows = re.findall(r'<table id="usage-day">.*?</table>', html, re.S)[0]
    assert re.findall(r'data-group="([^"]+)"', day_rows) == ["2027-01-14", "2027-01-15"]
    # every project and model of the window stays on offer, the chosen ones selected
    assert re.findall(r'<option value="([^"]+)"( selected)?>', html.split('id="project"')[1].split("</select>")[0]) \
        == [("demo", " selected"), ("research", "")]
    assert re.findall(r'<option value="([^"]+)"( selected)?>', html.split('id="model"')[1].split("</select>")[0]) \
        == [("gemma", " selected"), ("qwen", "")]
    qwen = await (await client.get("/console/usage?days=7&model=qwen", headers=BEARER)).get_data(as_text=True)
    assert re.findall(r'data-day="([0-9-]+)"[^>]*><title>[^:]+: (\d+) prompt', svg_of(qwen, 'id="usage-chart"')) \
        == [("2027-01-15", "20")]

    async def member(token: str) -> Login | None:
        return Login("Ann", "tok1", "ann@example.com", "member", ("research",)) if token == "member" else None

    console = Console(ControlState, authorise=member, history=no_history, usage=usage, wall=lambda: NOW)
    refused = await console.app.test_client().get("/console/usage?project=demo", headers={
        "Authorization": "Bearer member", "Accept": "text/html"})
    assert refused.status_code == 400
    assert "'demo', not one of your projects (research)" in await refused.get_data(as_text=True)
    store.close()


async def test_the_node_page_charts_the_last_hours_minute_buckets_on_labelled_axes():
    base = state_with_one_gpu_node()
    minute = {"now": int(NOW // 60) - 30}
    state = {"now": base}
    console = Console(lambda: state["now"], authorise=admin_only, history=no_history, clock=lambda: 1.0,
                      wall=lambda: minute["now"] * 60.0 + 5)
    for step, utilisation in enumerate((20.0, 40.0, 60.0)):  # three minutes of readings, one each
        minute["now"] += 1
        readings = NodeReadings(at=float(step), gpus=(GpuSample(0, utilization_percent=utilisation,
                                                                memory_used_bytes=70 << 30, power_draw_watts=350.0,
                                                                power_limit_watts=700.0),))
        registry, _ = base.fleet.heartbeat("gpu1", float(step), readings=readings)
        state["now"] = replace(base, fleet=registry)
        await console.sample()
    html = await (await console.app.test_client().get("/console/nodes/gpu1", headers=BEARER)).get_data(as_text=True)
    svg = svg_of(html, 'id="gpu-0"')
    assert texts(svg, "tick y-tick") == ["0 %", "25 %", "50 %", "75 %", "100 %"]
    # 60 minutes ending now (07:33 UTC: NOW is 08:00, 30 minutes back, 3 minutes on), labelled every quarter hour
    assert texts(svg, "tick x-tick") == ["06:34", "06:49", "07:04", "07:19", "07:33"]
    assert texts(svg, "axis-title x-title") == ["time (UTC), one-minute means over the last hour"]
    assert texts(svg, "key-text") == ["utilisation %", "memory % of 141GiB", "power % of 700 W limit"]
    util = re.search(r'<polyline class="util" points="([^"]+)"', svg).group(1).split()
    assert len(util) == 3 and [p.split(",")[0] for p in util] == ["594.6", "603.3", "612.0"]  # the last 3 minutes, the right end
    assert [float(p.split(",")[1]) for p in util] == [146.4, 116.8, 87.2]   # 20, 40 and 60 % of the 148-pixel plot
