"""The console's cluster page shows the last `llmgw upgrade` rollout: its version, state and reason, and each node's
phase (over quart-trio's in-process test client, from a rollout made by the pure module itself)."""

from __future__ import annotations

import html as html_lib
from dataclasses import replace

from llmgw.console import Console
from llmgw.control.state import ControlState
from llmgw.control.upgrades import NodeSeen, advance, plan_upgrade, sent

from .test_console_logs import BEARER
from .test_console_security import admin_only, no_history


async def _cluster(state: ControlState) -> str:
    console = Console(lambda: state, authorise=admin_only, history=no_history, clock=lambda: 1.0)
    response = await console.app.test_client().get("/console/", headers=BEARER)
    assert response.status_code == 200
    return html_lib.unescape(await response.get_data(as_text=True))


async def test_the_cluster_page_shows_the_rollout_and_each_nodes_phase():
    seen = {"a": NodeSeen(True, "0.1.0", 1.0, True), "b": NodeSeen(True, "0.1.0", 1.0, True)}
    upgrade, _ = advance(plan_upgrade("0.1.1", seen, 0.0), seen, 0.0)
    upgrade = sent(upgrade, "a", "the release tar has sha256 x, y was announced: send it again", 2.0)
    page = await _cluster(replace(ControlState(), upgrade=upgrade))
    assert ('To llmgw 0.1.1: <strong class="state-failed">failed</strong>: node a: the release tar has sha256 x, y '
            "was announced: send it again") in page
    assert '<tr id="upgrade-a"><td>a</td><td class="phase">failed</td><td>0.1.0</td>' in page
    assert '<tr id="upgrade-b"><td>b</td><td class="phase">waiting</td><td>0.1.0</td><td></td></tr>' in page
    assert 'id="upgrade-h"' not in await _cluster(ControlState())
