"""Nodes' GPU health in the fleet state: the wire's `HealthReport` read back, and the verdicts laid onto the cards
the planner sees.

Pure. A card whose verdict is not placeable gets `GpuState.unhealthy` = the reason (the findings' messages), and its
MIG instances with it (matched by the parent card's UUID); the planner leaves such cards out and says why
(`llmgw.plan.capacity`). A card's verdict turning placeable or not, or the reason it is out changing, is
placement-relevant (it wakes the planner); a finding that does not block placement (a warning) changes only the
node's document.
"""

from __future__ import annotations

from dataclasses import replace

from llmgw.plan.multinode import interconnect_of
from llmgw.plan.types import GpuState, NodeState
from llmgw.tools import CardVerdict, DomainMembership, Finding, IbPort, NodeHealth
from llmgw.tools.node_report import NodeHealthReport, level_named


def _finding(message) -> Finding:
    return Finding(level_named(message.level), message.code, message.message, message.source,
                   bool(message.blocks_placement))


def health_from_message(message) -> NodeHealthReport:
    """A `NodeHealthReport` from a pb `HealthReport` (read by field name). An unknown level word reads as warn."""
    cards = tuple(CardVerdict(int(c.index), c.pci_bus_id, c.uuid, tuple(_finding(f) for f in c.findings))
                  for c in message.cards)
    health = NodeHealth(cards, tuple(_finding(f) for f in message.unattributed))
    domain = DomainMembership(message.nvlink_domain or None, tuple(message.nvlink_clique_ids),
                              reason=message.nvlink_domain_reason)
    ports = tuple(
        IbPort(p.adapter, int(p.port), p.state, float(p.rate_gbps) if p.HasField("rate_gbps") else None,
               p.link_layer, physical_state=p.physical_state)
        for p in message.ib_ports
    )
    fabrics = tuple((p.adapter, int(p.port), p.fabric) for p in message.ib_ports if p.fabric)
    leaves = tuple((p.adapter, int(p.port), p.leaf) for p in message.ib_ports if p.leaf)
    return NodeHealthReport(health=health, domain=domain, imex=bool(message.imex), ib_ports=ports,
                            port_fabrics=fabrics, port_leaves=leaves,
                            source=message.source or "none", notes=tuple(message.notes),
                            read_at=float(message.read_at))


READ_SOURCES = ("nvidia-smi", "nvml")
"""`NodeHealthReport.source` values that mean every card was read (see `llmgw.agent.health`)."""


def with_interconnect(node: NodeState, report: NodeHealthReport | None) -> tuple[NodeState, bool]:
    """`node` with the NVLink domain and InfiniBand adapters (fabric, leaf) of `report`, for placing replicas
    spread over nodes (`llmgw.plan.interconnect_of`); and whether they changed (placement-relevant). No report:
    the node keeps what it had; a report that read no card keeps the node's NVLink domain as it was."""
    if report is None:
        return node, False
    link = interconnect_of(report, {(ca, port): leaf for ca, port, leaf in report.port_leaves})
    if report.source not in READ_SOURCES:  # no card read: the domain stays as it was (a failing tool moves nothing)
        old = node.interconnect
        link = replace(link, domain=old.domain, domain_ready=old.domain_ready, domain_reason=old.domain_reason)
    if link == node.interconnect:
        return node, False
    return replace(node, interconnect=link), True


def _missing_reason(report: NodeHealthReport) -> str:
    """Why a card nvidia-smi no longer lists is out: the blocking unattributed findings (an Xid 79 of its PCI
    address), else a sentence saying where to look."""
    blocking = [f.message for f in report.health.unattributed if f.blocks_placement]
    return "not listed by nvidia-smi -q -x" + (
        f": {'; '.join(blocking)}" if blocking else
        " (it may have fallen off the bus): check `nvidia-smi` and the kernel log")


def apply_health(gpus: tuple[GpuState, ...], report: NodeHealthReport | None) -> tuple[tuple[GpuState, ...], bool]:
    """`gpus` with `unhealthy` set from `report`'s verdicts; and whether any card's `unhealthy` changed.

    A whole card is matched to its verdict by UUID (by index, `device_id`, when either has none); a MIG instance
    by its `parent_uuid`. When the cards were read (`report.source` "nvidia-smi" or "nvml"), a card no longer listed is out
    (`_missing_reason`: a card that fell off the bus vanishes from nvidia-smi, its Xid unattributed). When nothing
    was read (`report` None, or source "none": nvidia-smi missing or failing) every card keeps what it had, so a
    tool failing never moves a replica. NVML ("nvml") counts as nvidia-smi does.
    """
    if report is None or report.source not in READ_SOURCES:
        return gpus, False
    reasons: dict[str, str] = {}
    by_index: dict[str, str] = {}
    for verdict in report.health.cards:
        why = "; ".join(verdict.reasons) if not verdict.placeable else ""
        if verdict.uuid:
            reasons[verdict.uuid] = why
        by_index[str(verdict.index)] = why
    out, changed = [], False
    for gpu in gpus:
        if gpu.is_mig:
            why = reasons.get(gpu.parent_uuid) if gpu.parent_uuid else None
        else:
            why = reasons.get(gpu.uuid) if gpu.uuid else None
            if why is None and (not gpu.uuid or not reasons):
                why = by_index.get(gpu.device_id)
        if why is None and (not gpu.is_mig or gpu.parent_uuid):
            why = _missing_reason(report)
        if why != gpu.unhealthy:
            changed = True
            gpu = replace(gpu, unhealthy=why)
        out.append(gpu)
    return tuple(out), changed
