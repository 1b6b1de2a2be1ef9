"""What each replica can do, in the console, over HTTP with quart-trio's test client: the replicas page shows a
replica's speed measured from its engine's counters (an in-process fleet whose engine is the llama-server stand-in,
counting prompt seconds at 1000 tokens/s and generation at 250, after one chat through the gateway), and a node's
page its memory bandwidth as its agent probed it at boot."""

from __future__ import annotations

import re

import httpx

from control.observed_fleet import chat_once, observed_fleet
from control.test_in_process_fleet import wait_for
from llmgw.console import Console
from llmgw.tools.memory_bandwidth import MemoryBandwidth

from .test_console_security import HTML, Wall, admin_only, log_in, no_history, state_with_one_gpu_node


def _console(snapshot) -> Console:
    return Console(snapshot, authorise=admin_only, history=no_history, clock=lambda: 1.0, wall=Wall(),
                   session_ttl=3600.0)


async def test_the_replicas_page_shows_each_replicas_measured_speed_and_a_dash_before_any(
        tmp_path, weights_mirror, fake_engine):
    async with observed_fleet(tmp_path, weights_mirror, fake_engine) as plane:
        console = _console(plane.snapshot)
        client = console.app.test_client()
        await log_in(client)
        before = await (await client.get("/console/replicas", headers=HTML)).get_data(as_text=True)
        assert re.search(r'<tr id="replica-tiny-0" class="state-ready">.*?<td class="speed">–</td>', before, re.S)
        # a speed is the difference of two readings of the engine's counters: the first one must precede the request
        await wait_for(lambda: any(r.speeds for r in plane.snapshot().fleet.records()), 10,
                       "a first reading of tiny-0's engine counters")
        async with httpx.AsyncClient(timeout=10) as http:
            await chat_once(plane, http)
        await wait_for(lambda: plane.status()["replicas"]["tiny-0"].get("speed"), 10, "tiny-0's measured speed")
        after = await (await client.get("/console/replicas", headers=HTML)).get_data(as_text=True)
    cell = re.search(r'<tr id="replica-tiny-0" class="state-ready">.*?<td class="speed">(.*?)</td>', after, re.S)
    assert cell, after
    assert cell.group(1).startswith("prefill 1000.0 tokens/s, decode 250.0 tokens/s <span class=\"age\">(metrics, ")
    assert "<th>Measured speed</th>" in after


async def test_a_nodes_page_shows_its_probed_memory_bandwidth_or_that_it_was_not_probed():
    state = state_with_one_gpu_node()
    client = _console(lambda: state).app.test_client()
    await log_in(client)
    html = await (await client.get("/console/nodes/gpu1", headers=HTML)).get_data(as_text=True)
    assert '<dd id="memory-bandwidth">not probed</dd>' in html
    fleet, _ = state.fleet.heartbeat("gpu1", 0.0, memory_bandwidth=MemoryBandwidth(11.54e9, 31.7e9, 16, 0.5))
    client = _console(lambda: state.with_fleet(fleet)).app.test_client()
    await log_in(client)
    html = await (await client.get("/console/nodes/gpu1", headers=HTML)).get_data(as_text=True)
    assert ('<dd id="memory-bandwidth">one core 11.5 GB/s, 16 cores 31.7 GB/s (read, probed at boot)</dd>'
            in html), html
