"""Everything discovery says about a node, read in one call: CPU and memory (`llmgw.agent.inventory`), GPUs (NVML,
else nvidia-smi), GPU topology (`nvidia-smi topo -m`) and fabrics. The thin, blocking I/O layer over the pure parsers.

Tools are run through an injectable `run(argv) -> ToolOutput | None` (None: the tool is not installed), so tests
feed real captures in; `nvml` is the `pynvml` module or a stand-in (None: not installed).
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Collection
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from llmgw.agent.discovery.fabrics import Fabrics, read_fabrics
from llmgw.agent.discovery.nvml import load_nvml, read_nvml
from llmgw.agent.inventory import Inventory, read_inventory
from llmgw.tools import GpuReport, GpuSample, Topology, parse_smi_xml, parse_topo_matrix

TOOL_TIMEOUT = 20.0  # seconds; nvidia-smi -q on an 8-GPU node takes a few seconds


@dataclass(frozen=True)
class ToolOutput:
    """A finished tool: its argv, exit status and output (stdout then stderr, decoded with replacement)."""

    argv: tuple[str, ...]
    exit_code: int
    text: str

    @property
    def command(self) -> str:
        return " ".join(self.argv)


def run_tool(argv: list[str], timeout: float = TOOL_TIMEOUT) -> ToolOutput | None:
    """Run `argv` and collect its output. None when the program does not exist. A timeout gives exit code -1 and
    the words "timed out after N s". Blocking: call it through `trio.to_thread.run_sync` from async code."""
    try:
        done = subprocess.run(argv, capture_output=True, timeout=timeout, check=False)
    except FileNotFoundError:
        return None
    except subprocess.TimeoutExpired:
        return ToolOutput(tuple(argv), -1, f"timed out after {timeout:g} s")
    except PermissionError as exc:
        return ToolOutput(tuple(argv), -1, f"could not be run: {exc}")
    text = done.stdout.decode("utf-8", "replace") + done.stderr.decode("utf-8", "replace")
    return ToolOutput(tuple(argv), done.returncode, text)


Runner = Callable[[list[str]], "ToolOutput | None"]
_LOAD = object()


@dataclass(frozen=True)
class NodeDiscovery:
    """A node as discovery sees it. `gpus.source` "none" means a CPU node. `topology` None when `nvidia-smi topo -m`
    was not available. `smi_samples` holds the readings nvidia-smi gave when it was the GPU source (else empty).
    `warnings` gathers every source's warnings, inventory's included (e.g. no AVX2)."""

    inventory: Inventory
    gpus: GpuReport
    topology: Topology | None
    fabrics: Fabrics
    smi_samples: tuple[GpuSample, ...] = ()

    @property
    def is_cpu_node(self) -> bool:
        return not self.gpus.gpus

    @property
    def warnings(self) -> tuple[str, ...]:
        topo = self.topology.warnings if self.topology else ()
        return (*self.inventory.warnings, *self.gpus.warnings, *topo)

    def to_json(self) -> dict:
        inv = self.inventory
        return {
            "hostname": inv.hostname, "os": inv.os, "arch": inv.arch,
            "cpu": {"model": inv.cpu.model, "cores": inv.cpu.cores, "flags": list(inv.cpu.flags)},
            "memory_total_bytes": inv.memory_total_bytes, "disk_free_bytes": inv.disk_free_bytes,
            "cpu_node": self.is_cpu_node, "gpus": self.gpus.to_json(),
            "topology": self.topology.to_json() if self.topology else None,
            "fabrics": self.fabrics.to_json(), "warnings": list(self.warnings),
        }


def _tool_text(run: Runner, argv: list[str], warnings: list[str]) -> str | None:
    out = run(argv)
    if out is None:
        return None
    if out.exit_code != 0:
        warnings.append(f"{out.command} exited {out.exit_code}: {out.text.strip()[:200]!r}")
        return None
    return out.text


def discover_gpus(our_pids: Collection[int] = (), *, nvml: Any = _LOAD, run: Runner = run_tool,
                  ) -> tuple[GpuReport, Topology | None, tuple[GpuSample, ...]]:
    """GPUs from NVML, or from `nvidia-smi -q -x` (+ `-L`) when NVML is missing; then `nvidia-smi topo -m` for NUMA
    nodes and NVLink peers the source did not give. Blocking. Never raises for tool failures (see warnings)."""
    report = read_nvml(load_nvml() if nvml is _LOAD else nvml, our_pids)
    samples: tuple[GpuSample, ...] = ()
    extra: list[str] = []
    if report.source == "none":
        xml = _tool_text(run, ["nvidia-smi", "-q", "-x"], extra)
        if xml is not None:
            listing = _tool_text(run, ["nvidia-smi", "-L"], extra) or ""
            result = parse_smi_xml(xml, our_pids, listing)
            report = replace(result.report, notes=(*report.notes, *result.report.notes))
            samples = result.samples
        else:
            report = replace(report, notes=(*report.notes, "nvidia-smi: not installed or not working"))
    topology = None
    if report.gpus:
        topo_text = _tool_text(run, ["nvidia-smi", "topo", "-m"], extra)
        if topo_text is not None:
            topology = parse_topo_matrix(topo_text)
            gpus = []
            for gpu in report.gpus:
                row = topology.gpu(gpu.index)
                if row is not None:
                    peers = () if gpu.is_mig_instance else tuple(str(p) for p in sorted(row.nvlink_peers))
                    gpu = gpu.with_topology(row.numa_node, peers)
                gpus.append(gpu)
            report = replace(report, gpus=tuple(gpus))
    return replace(report, warnings=(*report.warnings, *extra)), topology, samples


def discover_node(weights_dir: Path, our_pids: Collection[int] = (), *, nvml: Any = _LOAD, run: Runner = run_tool,
                  proc: Path = Path("/proc"), sys_root: Path = Path("/sys"), etc_root: Path = Path("/etc"),
                  ) -> NodeDiscovery:
    """Discover the whole node. Blocking (file reads, NVML, up to three nvidia-smi runs): from trio, call it with
    `await trio.to_thread.run_sync(discover_node, weights_dir, pids)`. Never raises for missing or broken tools.

    `weights_dir` is where free disk is measured (its nearest existing parent when it does not exist yet).
    """
    gpus, topology, samples = discover_gpus(our_pids, nvml=nvml, run=run)
    return NodeDiscovery(
        inventory=read_inventory(weights_dir, proc=proc), gpus=gpus, topology=topology,
        fabrics=read_fabrics(sys_root, etc_root), smi_samples=samples,
    )
