"""`nvidia-smi topo -m`: NVLink peers, NUMA affinity and each GPU's distance to each network adapter. Pure parser.

Format (FORMATS.md; shared/fixtures/nvidia-h200/nvidia-smi-topo-m.txt): a tab-separated matrix whose header row is
wrapped in ANSI underline codes even when written to a file; a leading empty cell, then one column per GPU and NIC,
then "CPU Affinity", "NUMA Affinity" and (newer drivers) "GPU NUMA ID". The self cell is " X ", links are "NV<n>"
(bonded NVLinks, NV4..NV18), or PCIe paths SYS, NODE, PHB, PXB, PIX. Empty cells show up as double tabs, NUMA
fields may read "N/A". Newer drivers name adapters NIC0.. and map them in a "NIC Legend:" block
("  NIC0: mlx5_0"); older ones use the adapter name (mlx5_0) as the column header. NIC0 need not be mlx5_0.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from llmgw.tools import values

_TRAILING = ("cpu affinity", "numa affinity", "gpu numa id")
_GPU_NAME = re.compile(r"^GPU(\d+)$")
_NVLINK = re.compile(r"^NV(\d+)$")
_PATHS = {"X", "SYS", "NODE", "PHB", "PXB", "PIX", "NV", "NVB", "SOC", "PSB"}
_LEGEND_LINE = re.compile(r"^\s*(NIC\d+)\s*:\s*(\S+)\s*$")


@dataclass(frozen=True)
class GpuLinks:
    """One GPU's row: `nvlink_peers` {peer GPU index: number of bonded links}, `cpu_affinity` as printed
    ("0-15", None when absent), `numa_node` (None for "N/A"), `gpu_numa_id`, `nic_distance` {adapter: path word,
    e.g. "mlx5_0": "PIX"}."""

    index: int
    nvlink_peers: dict[int, int] = field(default_factory=dict)
    cpu_affinity: str | None = None
    numa_node: int | None = None
    gpu_numa_id: int | None = None
    nic_distance: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Topology:
    """The matrix: GPUs in row order, adapter names (legend-resolved), and warnings about cells not understood."""

    gpus: tuple[GpuLinks, ...] = ()
    nics: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()

    def gpu(self, index: int) -> GpuLinks | None:
        """The row of GPU `index`, or None."""
        return next((g for g in self.gpus if g.index == index), None)

    def to_json(self) -> dict:
        return {
            "gpus": [{"index": g.index, "nvlink_peers": {str(k): v for k, v in g.nvlink_peers.items()},
                      "cpu_affinity": g.cpu_affinity, "numa_node": g.numa_node, "gpu_numa_id": g.gpu_numa_id,
                      "nic_distance": dict(g.nic_distance)} for g in self.gpus],
            "nics": list(self.nics), "warnings": list(self.warnings),
        }


def _nic_legend(lines: list[str]) -> dict[str, str]:
    legend: dict[str, str] = {}
    inside = False
    for line in lines:
        if line.strip().lower().startswith("nic legend"):
            inside = True
            continue
        if inside:
            match = _LEGEND_LINE.match(line)
            if match:
                legend[match.group(1)] = match.group(2)
    return legend


def parse_topo_matrix(text: str) -> Topology:
    """Parse `nvidia-smi topo -m` output. Never raises: no header gives an empty Topology with a warning."""
    lines = [values.strip_ansi(line).rstrip("\r\n") for line in text.splitlines()]
    header_at = next((i for i, line in enumerate(lines) if "\t" in line and "GPU0" in line.split("\t")
                      or re.match(r"^\s*\tGPU0\b", line)), None)
    if header_at is None:
        return Topology(warnings=(f"nvidia-smi topo -m: no matrix header found in {text.strip()[:80]!r}",))
    header = [cell.strip() for cell in lines[header_at].split("\t") if cell.strip()]
    trailing_at = next((i for i, cell in enumerate(header) if cell.lower() in _TRAILING), len(header))
    columns = header[:trailing_at]
    trailing = [cell.lower() for cell in header[trailing_at:]]
    legend = _nic_legend(lines[header_at + 1:])
    nic_columns = [c for c in columns if not _GPU_NAME.match(c)]
    warnings: list[str] = []
    gpus: list[GpuLinks] = []
    for line in lines[header_at + 1:]:
        if not line.strip() or line.strip().startswith("Legend"):
            break
        cells = line.split("\t")
        match = _GPU_NAME.match(cells[0].strip())
        if not match:
            continue  # a NIC row: its distances repeat the GPU rows'
        index = int(match.group(1))
        links = [cell.strip() for cell in cells[1:1 + len(columns)]]
        rest = [cell.strip() for cell in cells[1 + len(columns):] if cell.strip()]
        peers: dict[int, int] = {}
        nics: dict[str, str] = {}
        for column, cell in zip(columns, links):
            nvlink = _NVLINK.match(cell)
            gpu_column = _GPU_NAME.match(column)
            if cell not in _PATHS and not nvlink:
                warnings.append(f"nvidia-smi topo -m: GPU{index} to {column} reads {cell!r}, not a link type")
                continue
            if gpu_column and nvlink and int(gpu_column.group(1)) != index:
                peers[int(gpu_column.group(1))] = int(nvlink.group(1))
            elif not gpu_column:
                nics[legend.get(column, column)] = cell
        fields_ = dict(zip(trailing, rest))
        gpus.append(GpuLinks(
            index=index, nvlink_peers=peers,
            cpu_affinity=None if values.is_placeholder(fields_.get("cpu affinity")) else fields_.get("cpu affinity"),
            numa_node=values.integer(fields_.get("numa affinity")),
            gpu_numa_id=values.integer(fields_.get("gpu numa id")),
            nic_distance=nics,
        ))
    return Topology(gpus=tuple(gpus), nics=tuple(legend.get(c, c) for c in nic_columns), warnings=tuple(warnings))
