"""The console's Fabrics page (issue 42 item 1) over quart-trio's in-process test client, from real captures and the
hand-made fabric fixtures read by the agent's own parsers and sent across the wire as the agent sends them: NVLink
domains and IMEX state, InfiniBand fabrics by subnet manager with each node's rails and ports, RoCE apart, and the
last fabric test of a pair graded from perftest output."""

from __future__ import annotations

import html as html_lib
import re
import time
from dataclasses import replace
from pathlib import Path

from control.test_health_series import h200_with_a_fault
from llmgw.agent.health import report_message
from llmgw.console import Console
from llmgw.control.fabric_test import grades_document
from llmgw.control.health import health_from_message
from llmgw.control.registry import FleetRegistry
from llmgw.control.state import ControlState
from llmgw.plan import grade_rail, pair_rails
from llmgw.plan.types import NodeState
from llmgw.tools import NodeHealthReport, nvlink_domain, parse_smi_health
from llmgw.tools.ibstat import parse_ibstat
from llmgw.tools.imex import imex_ready, parse_imex_status
from llmgw.tools.sminfo import fabric_id, parse_sminfo
from llmgw.tools.values import command_body

from .test_console_logs import BEARER
from .test_console_security import admin_only, no_history

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
HAND = FIXTURES / "hand-made"
AT = 1_800_000_000.0  # 2027-01-15 08:00 UTC


def domain_of_joined_cards():
    """doctor-nvlink-unjoined's card with its registration completed: a member of its ClusterUUID's domain."""
    xml = (HAND / "doctor-nvlink-unjoined" / "nvidia-smi-q-x.xml").read_text()
    joined = xml.replace("<state>In Progress</state>\n\t\t\t<status>N/A</status>",
                         "<state>Completed</state>\n\t\t\t<status>Success</status>")
    assert joined != xml
    return nvlink_domain(parse_smi_health(joined))


def ibstat(path: Path):
    return parse_ibstat(command_body(path.read_text()))  # a capture's "# $ ibstat" frame left out


def sminfo(path: Path):
    return parse_sminfo(command_body(path.read_text()))


def wired(report: NodeHealthReport) -> NodeHealthReport:
    return health_from_message(report_message(report))  # as the agent sends it and the control plane reads it


def reports() -> dict[str, NodeHealthReport | None]:
    domain = domain_of_joined_cards()
    two = ibstat(HAND / "doctor-two-fabrics" / "ibstat.txt")
    fabrics = tuple((p.ca, p.port, fabric_id([sminfo(HAND / "doctor-two-fabrics" / f"sminfo-{p.ca}-{p.port}.txt")]))
                    for p in two)
    eight = ibstat(HAND / "ibstat-8-rails-one-down.txt")
    master = fabric_id([sminfo(HAND / "sminfo-master.txt")])
    down, why = imex_ready(parse_imex_status((HAND / "imex-ctl-N-j-peer-down.json").read_text()), ["node-b"])
    up, _ = imex_ready(parse_imex_status((HAND / "imex-ctl-N-j-up.json").read_text()), ["node-a"])
    assert up and not down
    return {
        # the H200 capture: no NVLink fabric, no IMEX, no InfiniBand
        "h200": wired(replace(h200_with_a_fault(), domain=nvlink_domain(parse_smi_health(
            (FIXTURES / "nvidia-h200" / "nvidia-smi-q-x.xml").read_text())))),
        "ib-a": wired(NodeHealthReport(domain=domain, imex=up, ib_ports=two, port_fabrics=fabrics, source="nvml")),
        "ib-b": wired(NodeHealthReport(domain=domain, imex=down, notes=(why,), ib_ports=eight, source="nvml",
                                       port_fabrics=tuple((p.ca, p.port, master) for p in eight if p.active))),
        "roce": wired(NodeHealthReport(ib_ports=ibstat(HAND / "ibstat-roce.txt"))),
        "quiet": None,
    }


def last_test(found: dict[str, NodeHealthReport | None]) -> dict:
    """ib-a -> ib-b (two rails: ib-a has two active ports), rail 0 graded from a client that could not connect,
    rail 1 from a table of half the link's rate."""
    rails = pair_rails(found["ib-a"].ib_ports, found["ib-b"].ib_ports)[:2]
    outputs = [(HAND / name).read_text() for name in ("perftest-failed.txt", "perftest-write-bw-mib-degraded.txt")]
    grades = [grade_rail(rail, output) for rail, output in zip(rails, outputs)]
    return {**grades_document("ib-a", "ib-b", grades), "at": AT}


async def fabrics_page(found, tests) -> str:
    registry = FleetRegistry(lost_after=30.0)
    for node_id, report in found.items():
        registry, _ = registry.register(NodeState(node_id, cpu_cores=16.0), 0.0, health=report)
    state = ControlState(fleet=registry)
    console = Console(lambda: state, authorise=admin_only, history=no_history, clock=lambda: 1.0,
                      fabric_tests=lambda: tests)
    response = await console.app.test_client().get("/console/fabrics", headers=BEARER)
    assert response.status_code == 200
    return html_lib.unescape(await response.get_data(as_text=True))


def row(html: str, marker: str) -> str:
    return re.sub(r"<[^>]+>", " ", html.split(marker, 1)[1].split("</tr>")[0])


async def test_nvlink_domains_and_imex_state_per_node():
    found = reports()
    html = await fabrics_page(found, [])
    uuid = "a1b2c3d4-0000-4000-8000-00000000beef"
    assert f'data-node="ib-a" data-domain="{uuid}"' in html and f'data-node="ib-b" data-domain="{uuid}"' in html
    assert f"{uuid}  · 2 nodes" in row(html, 'data-node="ib-a"')
    assert " up " in row(html, 'data-node="ib-a"')
    b = row(html, 'data-node="ib-b"')
    assert "down" in b and "IMEX domain is DOWN (nvidia-imex-ctl -N)" in b
    h200 = row(html, 'data-node="h200" data-domain=""')
    assert "no domain: no card reports an NVLink fabric" in h200 and "not configured" in h200
    assert 'id="nav-fabrics"' in html and 'aria-current="page"' in html.split('id="nav-fabrics"')[0][-80:] + \
        html.split('id="nav-fabrics"')[1][:40]
    assert "No health report (so no fabric known) from: quiet." in html


async def test_infiniband_fabrics_by_subnet_manager_with_rails_and_ports_and_roce_apart():
    found = reports()
    html = await fabrics_page(found, [])
    fabrics = re.findall(r'<section class="fabric fabric-([a-z]+)" id="fabric-\d+" data-fabric="([^"]+)"', html)
    # two subnet managers (mlx5_1 of ib-a sees another SM than everything else), then RoCE
    assert fabrics == [("infiniband", "0010e0406d5aa0a0"), ("infiniband", "7cfe900300a1b2c0"),
                       ("roce", "RoCE (Ethernet: no subnet manager)"), ("unread", "subnet manager not read")]
    first = html.split('data-fabric="0010e0406d5aa0a0"')[1].split("</section>")[0]
    assert "2 nodes, 8 ports" in first   # ib-a's mlx5_0 and ib-b's seven active ports
    assert "ib-a rail 0 mlx5_0 port 1 Active / LinkUp 400 Gb/s InfiniBand" in " ".join(
        row(first, 'data-node="ib-a" data-port="mlx5_0/1"').split())
    second = html.split('data-fabric="7cfe900300a1b2c0"')[1].split("</section>")[0]
    assert "1 node, 1 port" in second and "rail 1" in row(second, 'data-node="ib-a" data-port="mlx5_1/1"')
    # ib-b's port that is down is on no rail and, its SM unread, on no named fabric
    eight = ibstat(HAND / "ibstat-8-rails-one-down.txt")
    (dead,) = [p for p in eight if not p.active]
    unread = html.split('data-fabric="subnet manager not read"')[1].split("</section>")[0]
    assert "– " in row(unread, f'data-node="ib-b" data-port="{dead.ca}/{dead.port}"').split(dead.ca)[0]
    assert all(f'data-node="ib-b" data-port="{p.ca}/{p.port}"' in first for p in eight if p.active)
    roce = html.split('data-fabric="RoCE (Ethernet: no subnet manager)"')[1].split("</section>")[0]
    assert "Ethernet" in roce and 'data-node="roce"' in roce


async def test_the_last_fabric_test_of_a_pair_shows_each_rails_grade():
    found = reports()
    html = await fabrics_page(found, [last_test(found)])
    table = html.split('id="fabric-tests"')[1].split("</table>")[0]
    rail0 = " ".join(row(table, 'data-rail="0"').split())
    rail1 = " ".join(row(table, 'data-rail="1"').split())
    assert "ib-a → ib-b" in rail0 and time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(AT)) in rail0
    assert "1 degraded, 1 failed" in rail0
    assert "rail 0 mlx5_0 → mlx5_0 – – of 400 Gb/s failed ib_write_bw printed no result" in rail0
    assert re.search(r"rail 1 mlx5_1 → mlx5_1 \d+\.\d Gb/s \d+ % of 400 Gb/s degraded below 90 % of the 400 Gb/s",
                     rail1), rail1
    empty = await fabrics_page(found, [])
    assert "No fabric test since this control plane started" in empty
