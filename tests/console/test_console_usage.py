"""The console's Usage page: usage summed by day, model and project from a real SQLite store, over quart-trio's
test client, with a column chart of tokens per day, and each project's GPU-hours of the replicas, priced."""

from __future__ import annotations

import re

import trio

from llmgw.console import Console
from llmgw.control.state import ControlState
from llmgw.store import UsageRecord, open_store

from .test_console_security import TOKEN, admin_only, no_history


DAY = 86400.0
NOW = 1_800_000_000.0  # 2027-01-15 08:00 UTC
BEARER = {"Authorization": f"Bearer {TOKEN}", "Accept": "text/html"}


def console_over(store) -> Console:
    async def usage(by: str, since: float | None) -> list:
        return await trio.to_thread.run_sync(store.query_usage, None, since, by)

    return Console(ControlState, authorise=admin_only, history=no_history,
                   usage=usage, wall=lambda: NOW)


def cells(html: str, table: str) -> dict[str, list[str]]:
    body = re.search(rf'<table id="{table}">.*?<tbody>(.*?)</tbody>', html, re.S).group(1)
    return {g: re.findall(r'<td class="num">([^<]*)</td>', row)
            for g, row in re.findall(r'<tr data-group="([^"]+)">(.*?)</tr>', body, re.S)}


async def test_usage_is_summed_by_day_model_and_project_within_the_chosen_days(tmp_path):
    store = open_store(str(tmp_path / "llmgw.sqlite3"))
    for when, project, model, prompt, completion, cost in (
        (NOW - 60, "demo", "gemma", 10, 20, 0.5),
        (NOW - 120, "demo", "gemma", 5, 5, 0.25),
        (NOW - DAY - 60, "research", "big", 100, 200, 2.0),
        (NOW - 10 * DAY, "demo", "gemma", 9999, 9999, 99.0),  # outside the last 7 days
    ):
        store.record_usage(UsageRecord(project=project, model=model, time=when, prompt_tokens=prompt,
                                       completion_tokens=completion, cost=cost, ttft_seconds=0.2))
    console = console_over(store)
    response = await console.app.test_client().get("/console/usage?days=7", headers=BEARER)
    assert response.status_code == 200
    html = await response.get_data(as_text=True)
    assert cells(html, "usage-model") == {"big": ["1", "0", "100", "200", "0", "2.0000", "200ms"],
                                          "gemma": ["2", "0", "15", "25", "0", "0.7500", "200ms"]}
    assert set(cells(html, "usage-project")) == {"demo", "research"}
    assert cells(html, "usage-day") == {"2027-01-14": ["1", "0", "100", "200", "0", "2.0000", "200ms"],
                                        "2027-01-15": ["2", "0", "15", "25", "0", "0.7500", "200ms"]}
    columns = {(day, kind): float(height) for kind, day, height in re.findall(
        r'<rect class="tokens (prompt|completion)" data-day="([0-9-]+)"[^>]*height="([0-9.]+)"', html)}
    # the y axis reaches 500 tokens (the next round number above 300) over the 148-pixel-high plot
    assert columns == {("2027-01-14", "prompt"): 29.6, ("2027-01-14", "completion"): 59.2,
                       ("2027-01-15", "prompt"): 4.4, ("2027-01-15", "completion"): 7.4}
    assert ">500 tokens</text>" in html and ">250 tokens</text>" in html
    assert re.findall(r'class="tick x-tick"[^>]*>([^<]+)<', html) == [
        "01-09", "01-10", "01-11", "01-12", "01-13", "01-14", "01-15"]  # the window's 7 days, 5 without requests
    assert 'href="/console/usage"' in html  # the page is in the navigation
    month = await (await console.app.test_client().get("/console/usage?days=30", headers=BEARER)).get_data(
        as_text=True)
    assert cells(month, "usage-model")["gemma"][0] == "3"
    store.close()


async def test_without_a_usage_store_the_page_is_404_and_out_of_the_navigation():
    console = Console(ControlState, authorise=admin_only, history=no_history)
    client = console.app.test_client()
    assert (await client.get("/console/usage", headers=BEARER)).status_code == 404
    assert 'href="/console/usage"' not in await (await client.get("/console/", headers=BEARER)).get_data(as_text=True)


async def test_the_usage_page_shows_each_projects_gpu_hours_priced_and_a_member_only_their_projects(tmp_path):
    from llmgw.control.usage_hours import hours_document
    from llmgw.settings.model import ClusterSettings, Model, Resources, Settings, frozen_map

    big = Model(name="big", engine="llama.cpp", weights=(), resources=Resources(gpus=2, gpu_class="h200-141g"))
    settings = Settings(cluster=ClusterSettings(name="t", currency="EUR", gpu_hour_cost=frozen_map({"h200-141g": 4.0})),
                        models=frozen_map({"big": big}))
    store = open_store(str(tmp_path / "llmgw.sqlite3"))
    for project, start, seconds in (("demo", NOW - 7200, 3600), ("research", NOW - 1800, 900),
                                    ("demo", NOW - 1800, 900)):  # the last two share the replica for 15 min
        store.record_usage(UsageRecord(project=project, model="big", time=start + seconds, replica="big-0",
                                       duration_seconds=seconds))

    async def gpu_hours(since: float) -> list:
        return (await trio.to_thread.run_sync(hours_document, store, settings, since))["rows"]

    async def member(token: str):
        from llmgw.console import Login

        return Login("Ann", "tok1", "ann@example.com", "member", ("research",)) if token == "member" else None

    def rows(html: str) -> dict[tuple[str, str], list[str]]:
        body = re.search(r'<table id="usage-gpu-hours">.*?<tbody>(.*?)</tbody>', html, re.S).group(1)
        return {(p, m): re.findall(r'<td class="num">([^<]*)</td>', row)
                for p, m, row in re.findall(r'<tr data-project="([^"]+)" data-model="([^"]+)">(.*?)</tr>', body, re.S)}

    async def usage(by: str, since: float | None, projects=None, model=None) -> list:
        return await trio.to_thread.run_sync(store.query_usage, projects, since, by, model)

    state = ControlState()
    console = Console(lambda: state, authorise=admin_only, history=no_history, usage=usage, gpu_hours=gpu_hours,
                      wall=lambda: NOW)
    html = await (await console.app.test_client().get("/console/usage?days=1", headers=BEARER)).get_data(as_text=True)
    # demo: 1 h alone (2 GPU-hours) and 15 min beside research (0.25 GPU-hours); research 0.25 GPU-hours; 4.0 EUR each
    assert rows(html) == {("demo", "big"): ["2", "2.2500", "0.0000", "9.0000"],
                          ("research", "big"): ["1", "0.2500", "0.0000", "1.0000"]}
    assert '<h2 id="usage-gpu-hours-h">GPU-hours</h2>' in html
    console = Console(lambda: state, authorise=member, history=no_history, usage=usage, gpu_hours=gpu_hours,
                      wall=lambda: NOW)
    html = await (await console.app.test_client().get("/console/usage?days=1", headers={
        "Authorization": "Bearer member", "Accept": "text/html"})).get_data(as_text=True)
    assert set(rows(html)) == {("research", "big")}
    chosen = await (await console.app.test_client().get("/console/usage?days=1&model=small", headers={
        "Authorization": "Bearer member", "Accept": "text/html"})).get_data(as_text=True)
    assert rows(chosen) == {}  # the model chosen has no GPU-hours
    big = await (await console.app.test_client().get("/console/usage?days=1&model=big&project=research", headers={
        "Authorization": "Bearer member", "Accept": "text/html"})).get_data(as_text=True)
    assert set(rows(big)) == {("research", "big")}
