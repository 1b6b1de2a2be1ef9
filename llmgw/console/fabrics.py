"""What the console's Fabrics page shows, as plain data from the fleet's health reports (pure: no trio, no I/O).

Each live node's last `NodeHealthReport` (`NodeRecord.health`) says which multi-node NVLink domain its cards have
joined (the ClusterUUID, or why none), whether NVIDIA IMEX is up, and its InfiniBand / RoCE ports with the fabric
each active InfiniBand port is on (the lowest GUID of the subnet managers `sminfo` / `saquery` read through it) and
the leaf switch it is cabled to. A node's rails are its active ports in (adapter, port) order (`llmgw.plan
.active_rails`: what `llmgw fabric-test` pairs rail by rail). The last fabric test per pair comes from the control
plane (`ControlView.last_fabric_tests`). A node without a health report is listed as such, never as healthy.

    view = fabrics_view(state.fleet.records(), tests)
    view.domains        # {ClusterUUID: [DomainNode]}; view.outside: nodes in no domain, with why
    view.fabrics        # [Fabric]: by subnet manager, then RoCE, then InfiniBand ports whose SM was not read
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from llmgw.control.view import NodeRecord
from llmgw.plan.fabric_rails import active_rails

ROCE = "RoCE (Ethernet: no subnet manager)"
UNREAD = "subnet manager not read"


@dataclass(frozen=True)
class DomainNode:
    """A node's NVLink domain and IMEX: `domain` its ClusterUUID (None: none, `reason` why), `cliques` its cards'
    CliqueIds, `unjoined` its cards that have not joined their fabric, `imex` "up", "down" or "not configured",
    `imex_why` the agent's note about IMEX ("" when none)."""

    node_id: str
    domain: str | None
    reason: str
    cliques: tuple[str, ...]
    unjoined: tuple[int, ...]
    imex: str
    imex_why: str


@dataclass(frozen=True)
class PortRow:
    """One InfiniBand / RoCE port of a node: `rail` its index among the node's active ports (None: not active),
    `rate_gbps` its signalling rate (None: unknown), `leaf` the leaf switch GUID ("" unknown)."""

    node_id: str
    ca: str
    port: int
    state: str
    physical_state: str
    rate_gbps: float | None
    link_layer: str
    rail: int | None
    leaf: str


@dataclass(frozen=True)
class Fabric:
    """The ports on one fabric: `name` the subnet manager GUID that names it (or `ROCE` / `UNREAD`), `kind`
    "infiniband", "roce" or "unread", its `ports` by node and adapter, and its `nodes`."""

    name: str
    kind: str
    ports: tuple[PortRow, ...]

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(sorted({p.node_id for p in self.ports}))


@dataclass(frozen=True)
class FabricsView:
    """The Fabrics page: `domains` {ClusterUUID: nodes}, `outside` nodes in no NVLink domain, `fabrics`,
    `unreported` nodes without a health report, `tests` the last fabric test of each pair (each with `summary`
    {grade: rails})."""

    domains: dict[str, list[DomainNode]]
    outside: list[DomainNode]
    fabrics: list[Fabric]
    unreported: list[str]
    tests: list[dict[str, Any]]


def imex_state(report: Any) -> tuple[str, str]:
    """("up" | "down" | "not configured", the agent's note about IMEX or ""): up when the agent read it up; down
    when a note says why (configured, not up) or the node is in an NVLink domain (which needs it)."""
    note = next((n for n in report.notes if "imex" in n.lower()), "")
    if report.imex:
        return "up", note
    if note or report.domain.domain:
        return "down", note
    return "not configured", ""


def fabrics_view(records: Iterable[NodeRecord], tests: Iterable[dict[str, Any]] = ()) -> FabricsView:
    domains: dict[str, list[DomainNode]] = {}
    outside: list[DomainNode] = []
    by_fabric: dict[tuple[str, str], list[PortRow]] = {}
    unreported: list[str] = []
    for record in sorted(records, key=lambda r: r.node_id):
        report = record.health
        if record.lost or report is None:
            unreported.append(record.node_id)
            continue
        imex, why = imex_state(report)
        member = report.domain
        row = DomainNode(record.node_id, member.domain, member.reason, member.clique_ids, member.unjoined, imex, why)
        (domains.setdefault(member.domain, []) if member.domain else outside).append(row)
        rails = {(p.ca, p.port): i for i, p in enumerate(active_rails(report.ib_ports))}
        for port in sorted(report.ib_ports, key=lambda p: (p.ca, p.port)):
            if port.link_layer.lower() == "ethernet":
                key = ("roce", ROCE)
            else:
                fabric = report.port_fabric(port.ca, port.port)
                key = ("infiniband", fabric) if fabric else ("unread", UNREAD)
            by_fabric.setdefault(key, []).append(PortRow(
                record.node_id, port.ca, port.port, port.state, port.physical_state, port.rate_gbps, port.link_layer,
                rails.get((port.ca, port.port)), report.port_leaf(port.ca, port.port)))
    order = {"infiniband": 0, "roce": 1, "unread": 2}
    fabrics = [Fabric(name, kind, tuple(ports)) for (kind, name), ports in
               sorted(by_fabric.items(), key=lambda item: (order[item[0][0]], item[0][1]))]
    summarised = []
    for test in tests:
        summary: dict[str, int] = {}
        for rail in test.get("rails", ()):
            summary[rail.get("grade", "unknown")] = summary.get(rail.get("grade", "unknown"), 0) + 1
        summarised.append({**test, "summary": dict(sorted(summary.items()))})
    return FabricsView(dict(sorted(domains.items())), outside, fabrics, unreported, summarised)
