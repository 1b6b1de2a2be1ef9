"""llmgw.agent.discovery: what a node has, each source a pure parser plus a thin reader (see DESIGN.md).

Public API:
- `discover_node(weights_dir, our_pids, *, nvml, run) -> NodeDiscovery` (blocking; everything at once),
  `discover_gpus(our_pids, *, nvml, run) -> (GpuReport, Topology | None, smi samples)`.
- GPUs: `read_nvml(nvml, our_pids) -> GpuReport`, `load_nvml()`, `parse_smi_xml(text, our_pids, listing)`,
  `parse_smi_list(text)`; types `GpuDevice` (`.pb_fields()` for `pb.Gpu`), `GpuReport`, `GpuSample`.
- `parse_topo_matrix(text) -> Topology`; `gpu_class(name, memory_bytes)`, `mig_class`, `marketed_gb`.
- Fabrics: `parse_ibstat`, `read_fabrics`. Tools: `run_tool`, `ToolOutput`.
CPU and memory come from `llmgw.agent.inventory` (reused, not repeated here).
"""

from llmgw.agent.discovery.devices import GpuDevice, GpuReport, GpuSample
from llmgw.agent.discovery.fabrics import Fabrics, IbPort, parse_ibstat, read_fabrics
from llmgw.agent.discovery.gpuclass import card_label, gpu_class, marketed_gb, mig_class, mig_profile
from llmgw.agent.discovery.node import NodeDiscovery, ToolOutput, discover_gpus, discover_node, run_tool
from llmgw.agent.discovery.nvml import load_nvml, read_nvml
from llmgw.agent.discovery.smi import MigListing, SmiResult, parse_smi_list, parse_smi_xml
from llmgw.agent.discovery.topology import GpuLinks, Topology, parse_topo_matrix

__all__ = [
    "Fabrics", "GpuDevice", "GpuLinks", "GpuReport", "GpuSample", "IbPort", "MigListing", "NodeDiscovery",
    "SmiResult", "ToolOutput", "Topology", "card_label", "discover_gpus", "discover_node", "gpu_class",
    "load_nvml", "marketed_gb", "mig_class", "mig_profile", "parse_ibstat", "parse_smi_list", "parse_smi_xml",
    "parse_topo_matrix", "read_fabrics", "read_nvml", "run_tool",
]
