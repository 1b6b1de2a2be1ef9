"""GPU health and fabrics as `llmgw_gpu_health_*` and `llmgw_fabric_*` series: the real H200 capture with a fault
(an Xid 79 line, a link trained at x8, a pending row remap) read as the agent reads it, sent as it sends it, and
scraped; these are the very series the promtool unit tests of deploy/prometheus/alerts.test.yaml fire on."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from llmgw.agent.health import report_message
from llmgw.control.health import health_from_message
from llmgw.control.metrics_fleet import fleet_families
from llmgw.control.registry import FleetRegistry
from llmgw.plan.types import GpuState, NodeState
from llmgw.tools import IbPort, NodeHealthReport, node_health, parse_smi_health, parse_xids
from llmgw.tools.health import DomainMembership, Finding, Level, NodeHealth, card_verdict

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
RULE_TESTS = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "alerts.test.yaml"
HEALTH_FAMILIES = ("llmgw_gpu_health_", "llmgw_fabric_")


def h200_with_a_fault() -> NodeHealthReport:
    """The H200's `nvidia-smi -q -x` with the link at x8 and a remap pending (the edits of tests/fixtures/hand-made/
    doctor-pcie-x8 and doctor-remapped-pending) and the Xid 79 line of doctor-xid-79/dmesg-xid.txt."""
    xml = (FIXTURES / "nvidia-h200" / "nvidia-smi-q-x.xml").read_text()
    for healthy, faulty in (("<current_link_width>16x<", "<current_link_width>8x<"),
                            ("<remapped_row_pending>No<", "<remapped_row_pending>Yes<")):
        assert xml.count(healthy) == 1
        xml = xml.replace(healthy, faulty)
    dmesg = (FIXTURES / "hand-made" / "doctor-xid-79" / "dmesg-xid.txt").read_text()
    health = node_health(parse_smi_health(xml), parse_xids(dmesg))
    report = NodeHealthReport(health=health, source="nvidia-smi", read_at=1_764_000_000.0)
    return health_from_message(report_message(report))   # as it crosses the wire


def scrape(reports: dict[str, NodeHealthReport]) -> dict[tuple[str, frozenset], float]:
    registry = FleetRegistry(lost_after=30.0)
    for node_id, report in reports.items():
        node = NodeState(node_id, gpus=(GpuState("0", "h200-141g", 141 << 30, 141 << 30),), cpu_cores=16.0)
        registry, _ = registry.register(node, 0.0, health=report)
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in fleet_families(registry, None, 0.0) for s in family.samples
            if s.name.startswith(HEALTH_FAMILIES)}


def rule_test_series(test_name: str) -> dict[tuple[str, frozenset], float]:
    """{(name, labels): first value} of a promtool unit test's input series."""
    (test,) = [t for t in yaml.safe_load(RULE_TESTS.read_text())["tests"] if t["name"] == test_name]
    out = {}
    for series in test["input_series"]:
        name, labels = re.fullmatch(r"([a-z_]+)\{(.*)\}", series["series"]).groups()
        pairs = frozenset(re.findall(r'([a-z_]+)="([^"]*)"', labels))
        first = series["values"].split()[0].split("x")[0]
        if first != "_":
            out[(name, pairs)] = float(first)
    return out


def test_the_fault_is_three_findings_and_the_card_leaves_placement():
    found = scrape({"g1": h200_with_a_fault()})
    card = frozenset({("node", "g1"), ("gpu", "0")})
    assert found[("llmgw_gpu_health_level", card)] == 2.0
    assert found[("llmgw_gpu_health_placeable", card)] == 0.0
    for code, level in (("xid", "fail"), ("pcie-width", "warn"), ("remap-pending", "warn")):
        assert found[("llmgw_gpu_health_findings", card | {("code", code), ("level", level)})] == 1.0


def test_the_alert_rule_tests_fire_on_exactly_the_series_scraped_from_the_capture():
    found = scrape({"g1": h200_with_a_fault()})
    found = {k: v for k, v in found.items() if k[0] != "llmgw_gpu_health_read_timestamp_seconds"}
    listed = rule_test_series("H200 capture with a fault (Xid 79, an x8 link, a pending remap)")
    assert {k: v for k, v in listed.items() if ("node", "g1") in k[1]} == found


def test_the_healthy_capture_has_a_placeable_card_and_no_finding():
    xml = (FIXTURES / "nvidia-h200" / "nvidia-smi-q-x.xml").read_text()
    found = scrape({"g2": NodeHealthReport(health=node_health(parse_smi_health(xml)), source="nvidia-smi")})
    card = frozenset({("node", "g2"), ("gpu", "0")})
    assert found[("llmgw_gpu_health_placeable", card)] == 1.0 and found[("llmgw_gpu_health_level", card)] == 0.0
    assert not any(name.endswith("_findings") for name, _ in found)
    assert not any(name.startswith("llmgw_fabric_") for name, _ in found)   # no NVLink domain, IMEX or IB here


def test_fabric_findings_domain_imex_and_ports_are_fabric_series():
    (card,) = parse_smi_health((FIXTURES / "nvidia-h200" / "nvidia-smi-q-x.xml").read_text())
    unjoined = Finding(Level.WARN, "fabric-unjoined", "the card has not joined its NVLink fabric", "nvml: fabric")
    verdict = card_verdict(card)
    verdict = type(verdict)(verdict.index, verdict.pci_bus_id, verdict.uuid, (unjoined,))
    ports = (IbPort("mlx5_0", 1, "Active", 400.0, "InfiniBand", physical_state="LinkUp"),
             IbPort("mlx5_1", 1, "Down", None, "InfiniBand", physical_state="Disabled"))
    report = NodeHealthReport(health=NodeHealth((verdict,)), domain=DomainMembership("cluster-a"), imex=False,
                              ib_ports=ports, port_fabrics=(("mlx5_0", 1, "0xabc"),), source="nvml")
    found = scrape({"nvl1": health_from_message(report_message(report))})
    assert found[("llmgw_fabric_nvlink_findings", frozenset({("node", "nvl1"), ("gpu", "0"),
                                                             ("code", "fabric-unjoined"), ("level", "warn")}))] == 1.0
    assert not any(name == "llmgw_gpu_health_findings" for name, _ in found)
    assert found[("llmgw_fabric_nvlink_domain_member", frozenset({("node", "nvl1"), ("domain", "cluster-a")}))] == 1
    assert found[("llmgw_fabric_imex_up", frozenset({("node", "nvl1")}))] == 0.0
    port = {("node", "nvl1"), ("port", "1"), ("link_layer", "InfiniBand")}
    assert found[("llmgw_fabric_ib_port_active", frozenset(port | {("adapter", "mlx5_0"), ("fabric", "0xabc")}))] == 1
    assert found[("llmgw_fabric_ib_port_active", frozenset(port | {("adapter", "mlx5_1"), ("fabric", "")}))] == 0
    assert found[("llmgw_fabric_ib_port_rate_bytes_per_second",
                  frozenset({("node", "nvl1"), ("adapter", "mlx5_0"), ("port", "1")}))] == 50e9
