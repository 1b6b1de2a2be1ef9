"""One node's health report: what the agent reads every minute and the control plane keeps, as one value.

Pure. The agent builds it (`llmgw.agent.health`), sends it in `Heartbeat.health` / `Register.health`
(llmgw/wire/agent.proto `HealthReport`), and the control plane reads it back (`llmgw.control.health`); both sides
use this type and `llmgw.tools.health`'s `NodeHealth` / `CardVerdict` / `Finding`, so there is one word for each
idea.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmgw.tools.health import CardVerdict, DomainMembership, Finding, Level, NodeHealth
from llmgw.tools.ibstat import IbPort


@dataclass(frozen=True)
class NodeHealthReport:
    """A node's GPU health and fabrics.

    `health` every read card's verdict (ignored cards left out) and the unattributed findings; `domain` its
    multi-node NVLink domain membership; `imex` whether NVIDIA IMEX is configured (/etc/nvidia-imex);
    `ib_ports` its InfiniBand / RoCE ports; `port_fabrics` ((adapter, port, fabric id), ...) for the active
    InfiniBand ports whose subnet managers could be read (`llmgw.tools.fabric_id`: the lowest SM GUID); `port_leaves`
    ((adapter, port, leaf switch GUID), ...) where the fabric map placed the port (`llmgw.tools.adapter_leaves`);
    `source` "nvidia-smi" or "nvml" (where the card health was read) or "none" (no GPU health read); `notes` what
    could not be read, and why; `read_at` unix seconds at the agent when read (0.0: unknown).
    """

    health: NodeHealth = NodeHealth(())
    domain: DomainMembership = DomainMembership(None)
    imex: bool = False
    ib_ports: tuple[IbPort, ...] = ()
    port_fabrics: tuple[tuple[str, int, str], ...] = ()
    port_leaves: tuple[tuple[str, int, str], ...] = ()
    source: str = "none"
    notes: tuple[str, ...] = ()
    read_at: float = 0.0

    def card(self, index: int | None = None, uuid: str = "") -> CardVerdict | None:
        """The verdict of the card with this `uuid` (when given and known), else of this `index`; None if none."""
        if uuid:
            for verdict in self.health.cards:
                if verdict.uuid == uuid:
                    return verdict
        for verdict in self.health.cards:
            if index is not None and verdict.index == index and (not uuid or not verdict.uuid):
                return verdict
        return None

    def port_fabric(self, ca: str, port: int) -> str:
        """The fabric id of adapter `ca` port `port` ("" when unknown)."""
        return next((f for c, p, f in self.port_fabrics if c == ca and p == port), "")

    def port_leaf(self, ca: str, port: int) -> str:
        """The leaf switch GUID adapter `ca` port `port` is cabled to ("" when unknown)."""
        return next((f for c, p, f in self.port_leaves if c == ca and p == port), "")

    def unplaceable(self) -> dict[int, str]:
        """{card index: reason} of every card a finding takes out of placement; the reason joins the findings'
        messages with "; "."""
        return {c.index: "; ".join(c.reasons) for c in self.health.cards if not c.placeable}

    def to_json(self) -> dict:
        """Plain JSON types, without the time read (so equal readings give equal documents): {"level", "source",
        "cards": [{"index", "uuid", "pci_bus_id", "level", "placeable", "findings": [finding]}], "unattributed":
        [finding], "nvlink_domain": str | None, "nvlink_domain_reason", "imex", "infiniband": [{"ca", "port",
        "state", "physical_state", "rate_gbps", "link_layer", "fabric": str | None, "leaf": str | None}], "notes"};
        a finding is {"level", "code", "message", "source", "blocks_placement"}."""
        return {
            "level": str(self.health.level),
            "source": self.source,
            "cards": [{"index": c.index, "uuid": c.uuid, "pci_bus_id": c.pci_bus_id, "level": str(c.level),
                       "placeable": c.placeable, "findings": [finding_json(f) for f in c.findings]}
                      for c in self.health.cards],
            "unattributed": [finding_json(f) for f in self.health.unattributed],
            "nvlink_domain": self.domain.domain,
            "nvlink_domain_reason": self.domain.reason,
            "imex": self.imex,
            "infiniband": [{"ca": p.ca, "port": p.port, "state": p.state, "physical_state": p.physical_state,
                            "rate_gbps": p.rate_gbps, "link_layer": p.link_layer,
                            "fabric": self.port_fabric(p.ca, p.port) or None,
                            "leaf": self.port_leaf(p.ca, p.port) or None} for p in self.ib_ports],
            "notes": list(self.notes),
        }


def finding_json(finding: Finding) -> dict:
    """{"level": "warn", "code", "message", "source", "blocks_placement"}."""
    return {"level": str(finding.level), "code": finding.code, "message": finding.message,
            "source": finding.source, "blocks_placement": finding.blocks_placement}


def level_named(word: str) -> Level:
    """"ok" / "warn" / "fail" (any case) -> Level; an unknown word reads as WARN (someone should look)."""
    try:
        return Level[word.strip().upper()]
    except KeyError:
        return Level.WARN
