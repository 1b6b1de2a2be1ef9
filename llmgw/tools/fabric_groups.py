"""Nodes grouped by the fabrics they share: multi-node NVLink domains and InfiniBand fabrics. Pure.

From each node's `NodeHealthReport`:
- an NVLink domain is a ClusterUUID every card of the node joined (`llmgw.tools.nvlink_domain`); a node whose
  cards report a fabric but did not all join one (unjoined cards, disagreeing UUIDs) is listed outside, with the
  reason. A single machine's NVSwitch (all-zero ClusterUUID) and cards without a fabric are no domain and no
  complaint.
- an InfiniBand fabric is named by its lowest subnet manager GUID (`llmgw.tools.fabric_id`), so an operator's name
  never merges two physical fabrics and a master SM failover keeps the name. Only active InfiniBand ports count;
  a port that is down, or active with no known fabric, is listed outside for its node.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from llmgw.tools.node_report import NodeHealthReport

_NO_COMPLAINT = ("no card reports an NVLink fabric", "single-machine NVSwitch")


@dataclass(frozen=True)
class FabricGroup:
    """One fabric: `kind` "nvlink" or "infiniband", `name` its ClusterUUID or lowest SM GUID, `nodes` by id, and
    for InfiniBand the active `ports` on it ("node:mlx5_0/1")."""

    kind: str
    name: str
    nodes: tuple[str, ...]
    ports: tuple[str, ...] = ()


@dataclass(frozen=True)
class FabricView:
    """Every fabric (NVLink domains first, then InfiniBand, each by name) and `outside`: (node, reason) for each
    node part that could be in a fabric but is not (by node, then reason)."""

    groups: tuple[FabricGroup, ...] = ()
    outside: tuple[tuple[str, str], ...] = ()

    def of_kind(self, kind: str) -> tuple[FabricGroup, ...]:
        return tuple(g for g in self.groups if g.kind == kind)

    def to_json(self) -> dict:
        """{"nvlink_domains": {uuid: {"nodes"}}, "infiniband": {guid: {"nodes", "ports"}}, "outside": {node:
        [reason]}}."""
        outside: dict[str, list[str]] = {}
        for node, reason in self.outside:
            outside.setdefault(node, []).append(reason)
        return {
            "nvlink_domains": {g.name: {"nodes": list(g.nodes)} for g in self.of_kind("nvlink")},
            "infiniband": {g.name: {"nodes": list(g.nodes), "ports": list(g.ports)}
                           for g in self.of_kind("infiniband")},
            "outside": outside,
        }


def group_fabrics(reports: Mapping[str, NodeHealthReport]) -> FabricView:
    """Group nodes (`reports` by node id) by shared fabric; see the module docstring. Deterministic: the result
    does not depend on the mapping's order."""
    domains: dict[str, set[str]] = {}
    fabrics: dict[str, tuple[set[str], set[str]]] = {}
    outside: set[tuple[str, str]] = set()
    for node_id, report in reports.items():
        membership = report.domain
        if membership.domain:
            domains.setdefault(membership.domain, set()).add(node_id)
        elif membership.reason and not membership.reason.startswith(_NO_COMPLAINT):
            outside.add((node_id, f"NVLink: {membership.reason}"))
        for port in report.ib_ports:
            if port.link_layer.lower() != "infiniband":
                continue
            where = f"{port.ca}/{port.port}"
            if port.state.lower() != "active":
                outside.add((node_id, f"InfiniBand {where} is {port.state or 'in an unknown state'}"))
                continue
            fabric = report.port_fabric(port.ca, port.port)
            if not fabric:
                outside.add((node_id, f"InfiniBand {where}: fabric unknown (no subnet manager read)"))
                continue
            nodes, ports = fabrics.setdefault(fabric, (set(), set()))
            nodes.add(node_id)
            ports.add(f"{node_id}:{where}")
    groups = [FabricGroup("nvlink", name, tuple(sorted(nodes))) for name, nodes in sorted(domains.items())]
    groups += [FabricGroup("infiniband", name, tuple(sorted(nodes)), tuple(sorted(ports)))
               for name, (nodes, ports) in sorted(fabrics.items())]
    return FabricView(tuple(groups), tuple(sorted(outside)))
