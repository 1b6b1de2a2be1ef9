"""The node page lists each card's health findings with their evidence: the real H200 capture with a fault (an
Xid 79 line, a link trained at x8, a pending row remap) shows the XID line, the link against its maximum and the
remap counts, and that the card is out of placement; a healthy card says ok, an XID of no card is listed apart."""

from __future__ import annotations

import html as html_lib
from dataclasses import replace

from control.test_health_series import h200_with_a_fault
from llmgw.console import Console
from llmgw.tools import NodeHealthReport
from llmgw.tools.health import Finding, Level, NodeHealth

from .test_console_logs import BEARER
from .test_console_security import admin_only, no_history, state_with_one_gpu_node


async def node_page(report: NodeHealthReport) -> str:
    state = state_with_one_gpu_node()
    node = state.fleet.records()[0].state
    registry, _ = state.fleet.register(node, 0.0, health=report)
    state = replace(state, fleet=registry)
    console = Console(lambda: state, authorise=admin_only, history=no_history, clock=lambda: 1.0)
    response = await console.app.test_client().get("/console/nodes/gpu1", headers=BEARER)
    assert response.status_code == 200
    return html_lib.unescape(await response.get_data(as_text=True))


async def test_each_finding_of_the_faulty_h200_is_listed_with_its_evidence():
    page = await node_page(h200_with_a_fault())
    card = page.split('id="health-0"')[1].split("</div>")[0]
    assert "Health: " in card and ">fail</span>" in card and "out of placement until this clears" in card
    xid, pcie, remap = (card.split(f'data-code="{code}"')[1].split("</li>")[0]
                        for code in ("xid", "pcie-width", "remap-pending"))
    assert "Xid 79, GPU has fallen off the bus" in xid
    assert "NVRM: Xid (PCI:0000:00:06): 79, pid=2231, name=python3, GPU has fallen off the bus." in xid
    assert "the link trained at x8 of x16" in pcie and "pci/pci_gpu_link_info" in pcie
    assert "rows remapped: 0 for correctable errors, 0 for uncorrectable errors" in remap
    assert "remapped_rows/remapped_row_pending" in remap


async def test_a_healthy_card_says_ok_and_an_xid_of_no_card_is_listed_apart():
    orphan = Finding(Level.FAIL, "xid", "0000:00:07.0: Xid 79, GPU has fallen off the bus",
                     "kernel log: NVRM: Xid (PCI:0000:00:07): 79, pid='<unknown>', name=<unknown>, GPU has fallen off "
                     "the bus.", blocks_placement=True)
    healthy = h200_with_a_fault().health.cards[0]
    healthy = type(healthy)(healthy.index, healthy.pci_bus_id, healthy.uuid, ())
    page = await node_page(NodeHealthReport(health=NodeHealth((healthy,), (orphan,)), source="nvml"))
    card = page.split('id="health-0"')[1].split("</div>")[0]
    assert ">ok</span>" in card and "out of placement" not in card and 'class="finding' not in card
    apart = page.split('id="unattributed"')[1].split("</ul>")[0]
    assert "0000:00:07.0: Xid 79" in apart and "NVRM: Xid (PCI:0000:00:07): 79" in apart


async def test_a_node_without_a_health_report_shows_no_verdict():
    state_page = await node_page(None)
    assert 'id="health-0"' not in state_page and 'id="unattributed"' not in state_page


async def test_the_gpu_map_marks_a_held_out_card_and_says_why():
    state = state_with_one_gpu_node()
    node = state.fleet.records()[0].state
    registry, _ = state.fleet.register(node, 0.0, health=h200_with_a_fault())
    console = Console(lambda: replace(state, fleet=registry), authorise=admin_only, history=no_history,
                      clock=lambda: 1.0)
    response = await console.app.test_client().get("/console/gpus", headers=BEARER)
    page = html_lib.unescape(await response.get_data(as_text=True))
    tile = page.split('id="tile-gpu1-0"')[0].rsplit("<a ", 1)[1] + page.split('id="tile-gpu1-0"')[1].split("</a>")[0]
    assert "held-out" in tile and "held out: Xid 79, GPU has fallen off the bus" in tile
    assert "out of placement: Xid 79, GPU has fallen off the bus: the machine needs a reboot" in tile   # the title
    healthy = await node_page(NodeHealthReport())
    assert "held-out" not in healthy
