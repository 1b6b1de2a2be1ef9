"""GPU health in the fleet state: verdicts from heartbeats (and Register) laid onto the cards the planner sees, a
verdict that takes a card out or gives it back is placement-relevant, and the status document shows them."""

from __future__ import annotations

from llmgw.control.audit import status_document
from llmgw.control.health import health_from_message
from llmgw.control.registry import FleetRegistry
from llmgw.control.state import WatchState
from llmgw.agent.health import report_message
from llmgw.plan.types import GpuState, NodeState
from llmgw.tools import CardVerdict, Finding, IbPort, Level, NodeHealth
from llmgw.tools.node_report import NodeHealthReport

UUIDS = ("GPU-aaaa", "GPU-bbbb")
XID_79 = Finding(Level.FAIL, "xid", "Xid 79, GPU has fallen off the bus: the machine needs a reboot",
                 "kernel log: NVRM: Xid (PCI:0000:00:07): 79", blocks_placement=True)
SLOW = Finding(Level.WARN, "clock-slowdown", "clocks slowed by hw_slowdown: check cooling and power",
               "nvidia-smi -q -x: clocks_event_reasons")


def gpu_node(node_id: str = "n1", mig_parent: str = "") -> NodeState:
    gpus = tuple(GpuState(str(i), "h200-141g", 141 << 30, 141 << 30, uuid=u) for i, u in enumerate(UUIDS))
    if mig_parent:
        gpus += (GpuState("MIG-1", "h200-141g-mig-3g.71gb", 71 << 30, 71 << 30, uuid="MIG-1", is_mig=True,
                          parent_uuid=mig_parent),)
    return NodeState(node_id, cpu_cores=32, memory_bytes=512 << 30, gpus=gpus)


def report(*findings_of_card_1: Finding) -> NodeHealthReport:
    cards = (CardVerdict(0, "00000000:00:06.0", UUIDS[0]),
             CardVerdict(1, "00000000:00:07.0", UUIDS[1], tuple(findings_of_card_1)))
    return NodeHealthReport(health=NodeHealth(cards), source="nvidia-smi",
                            ib_ports=(IbPort("mlx5_0", 1, "Active", 400.0, "InfiniBand", physical_state="LinkUp"),))


def unhealthy(registry: FleetRegistry, node_id: str = "n1") -> dict[str, str]:
    return {g.device_id: g.unhealthy for g in registry.fleet().node(node_id).gpus}


def test_a_failing_verdict_takes_its_card_out_and_only_a_change_wakes_the_planner():
    registry, _ = FleetRegistry(lost_after=30).register(gpu_node(), now=0.0)
    registry, changed = registry.heartbeat("n1", 1.0, health=report(XID_79))
    assert changed is True
    assert unhealthy(registry)["0"] == "" and "Xid 79" in unhealthy(registry)["1"]
    registry, changed = registry.heartbeat("n1", 2.0, health=report(XID_79))
    assert changed is False
    registry, changed = registry.heartbeat("n1", 3.0, health=report())
    assert changed is True and unhealthy(registry) == {"0": "", "1": ""}


def test_a_warning_is_kept_for_the_node_but_is_not_placement_relevant():
    registry, _ = FleetRegistry(lost_after=30).register(gpu_node(), now=0.0)
    registry, changed = registry.heartbeat("n1", 1.0, health=report(SLOW))
    assert changed is False and unhealthy(registry) == {"0": "", "1": ""}
    assert registry.get("n1").health.health.cards[1].level is Level.WARN


def test_register_lays_its_health_on_at_once_and_a_register_without_one_keeps_the_last():
    registry, _ = FleetRegistry(lost_after=30).register(gpu_node(), now=0.0, health=report(XID_79))
    assert "Xid 79" in unhealthy(registry)["1"]
    registry, _ = registry.register(gpu_node(), now=5.0)  # an agent reconnecting before its next reading
    assert "Xid 79" in unhealthy(registry)["1"]


def test_mig_instances_of_a_failing_card_are_out_with_it():
    registry, _ = FleetRegistry(lost_after=30).register(gpu_node(mig_parent=UUIDS[1]), now=0.0)
    registry, _ = registry.heartbeat("n1", 1.0, health=report(XID_79))
    assert "Xid 79" in unhealthy(registry)["MIG-1"]


def test_cards_without_uuids_are_matched_by_index():
    node = NodeState("n1", gpus=(GpuState("0", "c", 1, 1), GpuState("1", "c", 1, 1)))
    cards = (CardVerdict(0, "b0", ""), CardVerdict(1, "b1", "", (XID_79,)))
    registry, _ = FleetRegistry(lost_after=30).register(node, now=0.0)
    registry, _ = registry.heartbeat("n1", 1.0, health=NodeHealthReport(health=NodeHealth(cards),
                                                                         source="nvidia-smi"))
    assert unhealthy(registry) == {"0": "", "1": XID_79.message}


def test_a_card_nvidia_smi_no_longer_lists_is_out_with_its_unattributed_xid():
    registry, _ = FleetRegistry(lost_after=30).register(gpu_node(), now=0.0)
    gone = NodeHealthReport(health=NodeHealth((CardVerdict(0, "00000000:00:06.0", UUIDS[0]),),
                                              (XID_79,)), source="nvidia-smi")
    registry, changed = registry.heartbeat("n1", 1.0, health=gone)
    assert changed and unhealthy(registry) == {"0": "", "1": f"not listed by nvidia-smi -q -x: {XID_79.message}"}


def test_when_nvidia_smi_fails_every_card_keeps_what_it_had():
    registry, _ = FleetRegistry(lost_after=30).register(gpu_node(), now=0.0)
    registry, _ = registry.heartbeat("n1", 1.0, health=report(XID_79))
    failed = NodeHealthReport(health=NodeHealth((), (XID_79,)), notes=("nvidia-smi -q -x exited 15",))
    registry, changed = registry.heartbeat("n1", 2.0, health=failed)
    assert changed is False and "Xid 79" in unhealthy(registry)["1"] and unhealthy(registry)["0"] == ""


def test_the_wire_report_reads_back_with_levels_and_placeability():
    back = health_from_message(report_message(report(XID_79, SLOW)))
    assert back.health == report(XID_79, SLOW).health
    assert back.unplaceable() == {1: XID_79.message} and back.ib_ports[0].rate_gbps == 400.0


def test_the_status_document_shows_each_cards_verdict_and_the_nodes_fabrics():
    registry, _ = FleetRegistry(lost_after=30).register(gpu_node(), now=0.0)
    registry, _ = registry.heartbeat("n1", 1.0, health=report(XID_79, SLOW))
    doc = status_document(WatchState(), registry.records(), None, None)["nodes"]["n1"]["health"]
    assert doc["level"] == "fail" and doc["source"] == "nvidia-smi"
    assert [(c["index"], c["level"], c["placeable"]) for c in doc["cards"]] == [(0, "ok", True), (1, "fail", False)]
    assert [f["code"] for f in doc["cards"][1]["findings"]] == ["xid", "clock-slowdown"]
    assert doc["infiniband"][0]["state"] == "Active" and doc["nvlink_domain"] is None


def test_the_status_document_groups_nodes_by_fabric():
    from llmgw.tools import DomainMembership

    registry = FleetRegistry(lost_after=30)
    for node_id in ("n1", "n2"):
        registry, _ = registry.register(gpu_node(node_id), now=0.0)
        health = NodeHealthReport(domain=DomainMembership("cluster-1"), ib_ports=report().ib_ports,
                                  port_fabrics=(("mlx5_0", 1, "0010e0406d5aa0a0"),))
        registry, _ = registry.heartbeat(node_id, 1.0, health=health)
    fabrics = status_document(WatchState(), registry.records(), None, None)["fabrics"]
    assert fabrics["nvlink_domains"] == {"cluster-1": {"nodes": ["n1", "n2"]}}
    assert fabrics["infiniband"]["0010e0406d5aa0a0"]["nodes"] == ["n1", "n2"]
    registry, _ = registry.expire(100.0)  # lost nodes are in no fabric
    assert "fabrics" not in status_document(WatchState(), registry.records(), None, None)
