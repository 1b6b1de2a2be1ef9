"""Nodes grouped by shared fabric: NVLink domains by ClusterUUID, InfiniBand fabrics by lowest SM GUID, and what is
outside them with the reason."""

from __future__ import annotations

from llmgw.tools import DomainMembership, IbPort, NodeHealthReport, group_fabrics

UUID = "4c4f8b2e-1234-5678-9abc-def012345678"
FABRIC_A = "0010e0406d5aa0a0"
FABRIC_B = "0010e0406d5aa0ff"


def ib(ca: str, state: str = "Active", layer: str = "InfiniBand") -> IbPort:
    return IbPort(ca, 1, state, 400.0, layer)


def node(domain: DomainMembership = DomainMembership(None, reason="no card reports an NVLink fabric"),
         ports=(), fabrics=()) -> NodeHealthReport:
    return NodeHealthReport(domain=domain, ib_ports=tuple(ports), port_fabrics=tuple(fabrics))


def test_nodes_of_one_cluster_uuid_form_one_domain_and_an_unjoined_node_is_outside_with_its_reason():
    view = group_fabrics({
        "n2": node(DomainMembership(UUID, ("1",))), "n1": node(DomainMembership(UUID, ("1",))),
        "n3": node(DomainMembership(None, ("1",), (3,), "GPU 3 not joined to the NVLink fabric")),
        "n4": node(DomainMembership(None, reason="single-machine NVSwitch (ClusterUUID all zeros): no domain")),
    })
    (domain,) = view.of_kind("nvlink")
    assert domain.name == UUID and domain.nodes == ("n1", "n2")
    assert view.outside == (("n3", "NVLink: GPU 3 not joined to the NVLink fabric"),)


def test_ports_group_by_fabric_id_never_by_name_and_down_or_unknown_ports_are_outside():
    view = group_fabrics({
        "n1": node(ports=[ib("mlx5_0"), ib("mlx5_1")], fabrics=[("mlx5_0", 1, FABRIC_A), ("mlx5_1", 1, FABRIC_B)]),
        "n2": node(ports=[ib("mlx5_0"), ib("mlx5_1", "Down")], fabrics=[("mlx5_0", 1, FABRIC_A)]),
        "n3": node(ports=[ib("mlx5_0"), ib("roce0", layer="Ethernet")]),
    })
    doc = view.to_json()
    assert doc["infiniband"] == {FABRIC_A: {"nodes": ["n1", "n2"], "ports": ["n1:mlx5_0/1", "n2:mlx5_0/1"]},
                                 FABRIC_B: {"nodes": ["n1"], "ports": ["n1:mlx5_1/1"]}}
    assert doc["outside"] == {"n2": ["InfiniBand mlx5_1/1 is Down"],
                              "n3": ["InfiniBand mlx5_0/1: fabric unknown (no subnet manager read)"]}


def test_grouping_does_not_depend_on_the_order_of_nodes():
    reports = {f"n{i}": node(DomainMembership(UUID), [ib("mlx5_0")], [("mlx5_0", 1, FABRIC_A)]) for i in range(5)}
    assert group_fabrics(reports) == group_fabrics(dict(reversed(list(reports.items()))))
