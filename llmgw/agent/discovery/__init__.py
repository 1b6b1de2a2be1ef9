"""llmgw.agent.discovery: what a node has, the thin readers (NVML, sysfs, running tools) over the pure parsers of
`llmgw.tools` (see DESIGN.md). The parsers' names are re-exported here for the agent's callers.

Public API:
- `discover_node(weights_dir, our_pids, *, nvml, run) -> NodeDiscovery` (blocking; everything at once),
  `discover_gpus(our_pids, *, nvml, run) -> (GpuReport, Topology | None, smi samples)`.
- GPUs: `read_nvml(nvml, our_pids) -> GpuReport`, `load_nvml()`, `parse_smi_xml(text, our_pids, listing)`,
  `parse_smi_list(text)`; types `GpuDevice` (`.pb_fields()` for `pb.Gpu`), `GpuReport`, `GpuSample`.
- `parse_topo_matrix(text) -> Topology`; `gpu_class(name, memory_bytes)`, `mig_class`, `marketed_gb`.
- Fabrics: `parse_ibstat`, `read_fabrics`, `SysfsFabrics` (the live source; `captured.CaptureDir` the captured one). Tools: `run_tool`, `ToolOutput`.
CPU and memory come from `llmgw.agent.inventory` (reused, not repeated here).
"""

from llmgw.agent.discovery.fabrics import Fabrics, SysfsFabrics, read_fabrics
from llmgw.agent.discovery.node import NodeDiscovery, ToolOutput, discover_gpus, discover_node, run_tool
from llmgw.agent.discovery.nvml import load_nvml, read_nvml
from llmgw.tools import (
    GpuDevice, GpuLinks, GpuReport, GpuSample, IbPort, MigListing, SmiResult, Topology, card_label, gpu_class,
    marketed_gb, mig_class, mig_profile, parse_ibstat, parse_smi_list, parse_smi_xml, parse_topo_matrix,
)

__all__ = [
    "Fabrics", "GpuDevice", "GpuLinks", "GpuReport", "GpuSample", "IbPort", "MigListing", "NodeDiscovery",
    "SmiResult", "SysfsFabrics", "ToolOutput", "Topology", "card_label", "discover_gpus", "discover_node", "gpu_class",
    "load_nvml", "marketed_gb", "mig_class", "mig_profile", "parse_ibstat", "parse_smi_list", "parse_smi_xml",
    "parse_topo_matrix", "read_fabrics", "read_nvml", "run_tool",
]
