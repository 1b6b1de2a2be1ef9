"""`llmgw node doctor`'s health checks: the same reading and verdicts the agent reports every minute
(`llmgw.agent.health`), one check per finding. Pure over the report; `run_doctor` does the reading.

Each check is (name, status, detail): name "health" for a card's findings and unattributed XIDs, "nvlink" for the
node's NVLink domain, "fabrics" for its InfiniBand ports as the control plane groups them; status (`CheckStatus`)
FAIL for a finding that takes its card out of placement, WARN for any other finding, OK for a card without
findings, INFO for facts and for what could not be read.
"""

from __future__ import annotations

import enum

from llmgw.tools import Finding, Level, group_fabrics
from llmgw.tools.node_report import NodeHealthReport


class CheckStatus(str, enum.Enum):
    """A `llmgw node doctor` check's status; the text and the JSON carry `.value`."""

    OK = "ok"
    INFO = "info"    # a fact, e.g. "a CPU node"
    WARN = "warn"    # works, but worse or soon broken
    FAIL = "fail"    # this node cannot do its job until fixed


OK, INFO, WARN, FAIL = CheckStatus.OK, CheckStatus.INFO, CheckStatus.WARN, CheckStatus.FAIL


def _status(finding: Finding) -> CheckStatus:
    if finding.blocks_placement or finding.level is Level.FAIL:
        return FAIL
    return WARN if finding.level is Level.WARN else INFO


def health_checks(report: NodeHealthReport) -> list[tuple[str, CheckStatus, str]]:
    """The checks of `report`, cards in index order, then unattributed findings, the NVLink domain and notes."""
    checks: list[tuple[str, CheckStatus, str]] = []
    for card in report.health.cards:
        label = f"GPU {card.index} ({card.pci_bus_id})"
        if not card.findings:
            checks.append(("health", OK, f"{label}: no health findings"))
        for finding in card.findings:
            out = "; out of placement until it clears" if finding.blocks_placement else ""
            checks.append(("health", _status(finding), f"{label}: {finding.message}{out} [{finding.source}]"))
    for finding in report.health.unattributed:
        checks.append(("health", _status(finding), f"{finding.message} [{finding.source}]"))
    domain = report.domain
    if report.health.cards:
        if domain.domain:
            checks.append(("nvlink", INFO, f"in NVLink domain {domain.domain} (cliques "
                                           f"{', '.join(sorted(set(domain.clique_ids))) or '?'})"))
        else:
            checks.append(("nvlink", INFO, f"no multi-node NVLink domain: {domain.reason}"))
    checks.extend(fabric_checks(report))
    checks.extend(("health", INFO, note) for note in report.notes)
    return checks


def fabric_checks(report: NodeHealthReport) -> list[tuple[str, CheckStatus, str]]:
    """The node's InfiniBand as the control plane groups it (`llmgw.tools.group_fabrics` over this one node):
    "fabrics" info per physical fabric (named by its lowest subnet manager GUID) with its ports; warn for each port
    outside any fabric (down, or no subnet manager read), and warn when the ports span two or more physical
    fabrics: whatever one name an operator gives them, llmgw never places a replica across them."""
    view = group_fabrics({"": report})
    infiniband = view.of_kind("infiniband")
    checks = [("fabrics", INFO, f"InfiniBand fabric {g.name}: ports "
                                f"{', '.join(p.partition(':')[2] for p in g.ports)}") for g in infiniband]
    if len(infiniband) > 1:
        checks.append(("fabrics", WARN, f"InfiniBand ports on {len(infiniband)} physical fabrics "
                                        f"({', '.join(g.name for g in infiniband)}, by their subnet managers): "
                                        "even under one name, a replica is never placed across them; cable "
                                        "the rails to one fabric if they were meant as one"))
    checks.extend(("fabrics", WARN, reason) for _, reason in view.outside if reason.startswith("InfiniBand"))
    return checks
