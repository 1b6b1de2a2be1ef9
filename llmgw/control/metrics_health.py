"""GPU health and fabrics as Prometheus metric families: what each node's last health report found
(`NodeHealthReport`, read by the agent every `health_interval`: XIDs, remapped rows, PCIe links, ECC, clock
slowdowns, NVLink fabric and errors, InfiniBand ports).

Pure, like `llmgw.control.metrics_fleet`: a function of the fleet's records at scrape time. A lost node, or one
whose agent has sent no health report, has no series here (absent, never "healthy"). Labels are bounded: `code` is
one of `llmgw.tools.health`'s finding codes (listed in docs/observability.md), `level` "warn" or "fail";
the findings' sentences and evidence stay on the console's node page and in `llmgw status`, not in labels.

Card findings split in two: NVLink's (`FABRIC_CODES`) are `llmgw_fabric_nvlink_findings`, the rest
`llmgw_gpu_health_findings`; each sample counts the card's findings of that code and level (two XIDs of different
numbers are two findings of code "xid").
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from llmgw.control.registry import NodeRecord
from llmgw.tools.health import Finding

FABRIC_CODES = frozenset({"fabric-unjoined", "fabric-degraded", "nvlink-inactive", "nvlink-errors"})
"""Finding codes about a card's NVLinks and NVLink fabric: exported as `llmgw_fabric_nvlink_findings`."""

CARD = ["node", "gpu"]


def _counts(findings: Iterable[Finding]) -> dict[tuple[str, str], int]:
    out: dict[tuple[str, str], int] = {}
    for finding in findings:
        key = (finding.code, str(finding.level))
        out[key] = out.get(key, 0) + 1
    return out


def health_families(records: Iterable[NodeRecord]) -> Iterator[Metric]:
    """The `llmgw_gpu_health_*` and `llmgw_fabric_*` families of every live node's last health report; families
    without a sample are still yielded (HELP and TYPE)."""
    level = GaugeMetricFamily("llmgw_gpu_health_level", "The card's worst health finding: 0 ok, 1 warn, 2 fail.",
                              labels=CARD)
    placeable = GaugeMetricFamily("llmgw_gpu_health_placeable", "1 while no health finding takes the card out of "
                                  "placement, else 0.", labels=CARD)
    findings = GaugeMetricFamily("llmgw_gpu_health_findings", "The card's health findings of this code and level "
                                 "(xid, remap-pending, pcie-width, ...).", labels=[*CARD, "code", "level"])
    unattributed = GaugeMetricFamily("llmgw_gpu_health_unattributed_findings", "Findings of no card the node "
                                     "answers for (an XID of a card fallen off the bus).",
                                     labels=["node", "code", "level"])
    read_at = GaugeMetricFamily("llmgw_gpu_health_read_timestamp_seconds", "When the agent last read the node's "
                                "GPU health, unix seconds at the agent.", labels=["node", "source"])
    nvlink = GaugeMetricFamily("llmgw_fabric_nvlink_findings", "The card's NVLink and NVLink-fabric findings of "
                               "this code and level.", labels=[*CARD, "code", "level"])
    domain = GaugeMetricFamily("llmgw_fabric_nvlink_domain_member", "1 for the multi-node NVLink domain "
                               "(ClusterUUID) the node's cards have all joined.", labels=["node", "domain"])
    imex = GaugeMetricFamily("llmgw_fabric_imex_up", "1 while NVIDIA IMEX is up on the node, else 0 (nodes in an "
                             "NVLink domain or with IMEX configured).", labels=["node"])
    port_active = GaugeMetricFamily("llmgw_fabric_ib_port_active", "1 while the InfiniBand / RoCE port is Active "
                                    "and LinkUp, else 0.", labels=["node", "adapter", "port", "link_layer", "fabric"])
    port_rate = GaugeMetricFamily("llmgw_fabric_ib_port_rate_bytes_per_second", "The port's signalling rate, "
                                  "bytes per second.", labels=["node", "adapter", "port"])
    for record in records:
        report = record.health
        if record.lost or report is None:
            continue
        node = record.node_id
        if report.read_at:
            read_at.add_metric([node, report.source], report.read_at)
        for card in report.health.cards:
            gpu = [node, str(card.index)]
            level.add_metric(gpu, float(int(card.level)))
            placeable.add_metric(gpu, 1.0 if card.placeable else 0.0)
            for (code, word), count in sorted(_counts(card.findings).items()):
                (nvlink if code in FABRIC_CODES else findings).add_metric([*gpu, code, word], float(count))
        for (code, word), count in sorted(_counts(report.health.unattributed).items()):
            unattributed.add_metric([node, code, word], float(count))
        if report.domain.domain:
            domain.add_metric([node, report.domain.domain], 1.0)
        if report.domain.domain or report.imex:
            imex.add_metric([node], 1.0 if report.imex else 0.0)
        for port in report.ib_ports:
            port_active.add_metric([node, port.ca, str(port.port), port.link_layer,
                                    report.port_fabric(port.ca, port.port)], 1.0 if port.active else 0.0)
            if port.rate_gbps is not None:
                port_rate.add_metric([node, port.ca, str(port.port)], port.rate_gbps * 1e9 / 8)
    yield from (level, placeable, findings, unattributed, read_at, nvlink, domain, imex, port_active, port_rate)
