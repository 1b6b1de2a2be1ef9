"""llmgw.tools: pure parsers of other tools' output, and the judgements made from them. Used by the agent and the
control plane alike; imports nothing of llmgw but `llmgw.errors` and `llmgw.units`, and does no I/O (an
import-linter contract in pyproject.toml checks both).

Every parser takes the tool's text (a capture's "# $ command" / "# exit=N" frame is tolerated where noted) and
returns frozen dataclasses, or raises `ParseError` (never anything else, whatever the input); a few "never raise"
and say so. Modules, one per tool:

- `nvidia_smi`: `parse_smi_xml(text, our_pids, listing) -> SmiResult` (devices for discovery), `parse_smi_list`,
  `smi_xml_root`; `nvidia_smi_health`: `parse_smi_health(text) -> tuple[CardHealth, ...]` (PCIe maxima, ECC,
  retired pages, remapped rows, clock event reasons, fabric, MIG carving).
- `nvidia_topo`: `parse_topo_matrix(text) -> Topology`; `nvidia_nvlink`: `parse_nvlink_status`,
  `parse_nvlink_errors` -> tuple[NvLinkCard, ...].
- `kernel_log`: `parse_xids(text) -> tuple[XidEvent, ...]` (dmesg, /dev/kmsg, journalctl -k),
  `parse_pcie_bandwidth(text) -> tuple[PcieBandwidthNote, ...]` (the kernel's "limited by" notes); `xid`: NVIDIA's
  catalog, `classify_xid(xid, message) -> XidInfo`.
- `ibstat`: `parse_ibstat(text) -> tuple[IbPort, ...]`; `sminfo`: `parse_sminfo -> SubnetManager`,
  `parse_saquery_smir -> tuple[SubnetManager, ...]`, `fabric_id`; `imex`: `parse_imex_status` (`nvidia-imex-ctl -N
  -j`) -> ImexDomain, `imex_ready`; `ibnetdiscover`: `parse_ibnetdiscover ->
  IbFabricMap`; `fabric_map`: `switch_tiers`, `adapter_leaves` (which leaf each adapter port hangs from), `node_guid`; `perftest`: `parse_perftest_bw -> BwResult`.
- `health`: `node_health(cards, xids, pcie_notes=...) -> NodeHealth`, `card_verdict`, `pcie_findings`,
  `pcie_bandwidth_findings`, `xid_findings`, `memory_findings`, `fabric_findings`, `nvlink_findings`,
  `nvlink_domain(cards) -> DomainMembership`, `nvlink_error_findings` (DCGM's NVLink thresholds between two
  readings), `with_card_findings`; `Level`, `Finding`, `CardVerdict`. `nvml_words`: NVML's numbers in nvidia-smi's
  words (clock event bits, fabric states, NVLink counter names).
- `node_report`: `NodeHealthReport` (one node's verdicts, NVLink domain, IMEX, InfiniBand ports and their fabrics:
  what the agent sends and the control plane keeps); `fabric_groups`: `group_fabrics(reports) -> FabricView`
  (nodes by NVLink domain and InfiniBand fabric, and what is outside them).
- `memory_bandwidth`: `MemoryBandwidth` (a node's memory read bandwidth, one core and all cores, as the agent's probe
  reports it once per boot: what a CPU replica's speed is estimated from).
- `sensors`: the machine room from sysfs text: `parse_hwmon_chip -> HwmonChip`, `cpu_package_temperatures`,
  `inlet_temperature`, `parse_rapl_zone -> RaplCounter`, `energy_watts` (RAPL counters to watts, wrap-around
  handled); `NodeSensors`, `SensorValue` (what a heartbeat carries).
- `model_headers`: what a model's files say before its weights are fetched: `parse_gguf_header`,
  `parse_safetensors_header`, `with_config` (a Hugging Face config.json), `combined` -> `ModelFacts` (the model
  explorer's input; `NeedMoreBytes` asks a reader for more of the file's start).
- `devices` (GpuDevice, GpuReport, GpuSample), `gpuclass` (gpu_class, mig_class, ...), `values` (placeholders,
  units, `ParseError`, `command_body`).
"""

from llmgw.tools.devices import GpuDevice, GpuReport, GpuSample
from llmgw.tools.fabric_groups import FabricGroup, FabricView, group_fabrics
from llmgw.tools.gpuclass import card_label, gpu_class, marketed_gb, mig_class, mig_profile
from llmgw.tools.health import (
    CardVerdict, DomainMembership, Finding, Level, NodeHealth, card_verdict, fabric_findings, link_gbytes,
    memory_findings, node_health, nvlink_domain, nvlink_error_findings, nvlink_findings, pcie_bandwidth_findings,
    pcie_findings, with_card_findings, xid_findings,
)
from llmgw.tools.fabric_map import adapter_leaves, node_guid, switch_tiers
from llmgw.tools.ibnetdiscover import IbFabricMap, IbLink, IbNode, parse_ibnetdiscover
from llmgw.tools.ibstat import IbPort, parse_ibstat, rate_gbps
from llmgw.tools.imex import ImexDomain, ImexNode, imex_ready, parse_imex_status
from llmgw.tools.kernel_log import PcieBandwidthNote, XidEvent, normalise_bus_id, parse_pcie_bandwidth, parse_xids
from llmgw.tools.nvidia_nvlink import NvLink, NvLinkCard, parse_nvlink_errors, parse_nvlink_status
from llmgw.tools.nvidia_smi import MigListing, SmiResult, parse_smi_list, parse_smi_xml, smi_xml_root
from llmgw.tools.nvidia_smi_health import (
    CardHealth, EccCounts, FabricState, PcieLink, RemappedRows, RetiredPages, parse_smi_health,
)
from llmgw.tools.node_report import NodeHealthReport
from llmgw.tools.nvidia_topo import GpuLinks, Topology, parse_topo_matrix
from llmgw.tools.perftest import BwResult, BwRow, parse_perftest_bw
from llmgw.tools.sensors import (
    HwmonChip, HwmonTemp, NodeSensors, RaplCounter, SensorValue, cpu_package_temperatures, energy_watts,
    inlet_temperature, parse_hwmon_chip, parse_rapl_zone,
)
from llmgw.tools.model_headers import (
    ModelFacts, NeedMoreBytes, Quantisation, combined, parse_gguf_header, parse_safetensors_header, with_config,
)
from llmgw.tools.sminfo import SubnetManager, fabric_id, parse_saquery_smir, parse_sminfo
from llmgw.tools.values import ParseError, command_body
from llmgw.tools.xid import XidAction, XidInfo, classify_xid, xid_info

__all__ = [
    "BwResult", "BwRow", "CardHealth", "CardVerdict", "DomainMembership", "EccCounts", "FabricGroup", "FabricState",
    "FabricView", "Finding", "NodeHealthReport", "group_fabrics",
    "GpuDevice", "GpuLinks", "GpuReport", "GpuSample", "IbFabricMap", "IbLink", "IbNode", "IbPort", "Level",
    "MigListing", "NodeHealth", "NvLink", "NvLinkCard", "ParseError", "PcieBandwidthNote", "PcieLink",
    "RemappedRows", "RetiredPages", "SmiResult", "SubnetManager", "Topology", "XidAction", "XidEvent", "XidInfo",
    "card_label", "card_verdict", "classify_xid", "command_body", "fabric_findings", "fabric_id", "gpu_class",
    "link_gbytes", "marketed_gb", "memory_findings", "mig_class", "mig_profile", "node_health", "normalise_bus_id",
    "nvlink_domain", "nvlink_findings", "parse_ibnetdiscover", "parse_ibstat", "parse_nvlink_errors",
    "parse_nvlink_status", "parse_pcie_bandwidth", "parse_perftest_bw", "parse_saquery_smir", "parse_smi_health",
    "parse_smi_list", "parse_smi_xml", "parse_sminfo", "parse_topo_matrix", "parse_xids", "pcie_bandwidth_findings",
    "pcie_findings", "rate_gbps", "smi_xml_root", "xid_findings", "xid_info", "nvlink_error_findings",
    "with_card_findings", "HwmonChip", "HwmonTemp", "NodeSensors", "RaplCounter", "SensorValue",
    "cpu_package_temperatures", "energy_watts", "inlet_temperature", "parse_hwmon_chip", "parse_rapl_zone",
    "ModelFacts", "NeedMoreBytes", "Quantisation", "combined", "parse_gguf_header", "parse_safetensors_header",
    "with_config", "adapter_leaves", "node_guid", "switch_tiers", "ImexDomain", "ImexNode", "imex_ready", "parse_imex_status",
]
