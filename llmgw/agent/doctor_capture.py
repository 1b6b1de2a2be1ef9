"""`llmgw node doctor --from DIR`: what the agent would conclude from a directory of captured tool output.

The capture (`llmgw.agent.discovery.captured.CaptureDir`, layout in docs/doctor-captures.md) stands in for the
node's tools and sysfs; discovery (`discover_gpus`) and the health reading (`HealthReader`) run unchanged over it,
without NVML (a capture has no live library), so devices come from `nvidia-smi -q -x` as on a node whose NVML
cannot be loaded. The node's own CPU, disk, engines, clock and certificate are not judged: they are the machine
running the doctor, not the captured one. Files the doctor asked for and did not find are one "capture" info check
each ("not captured"), never a failure.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from llmgw.agent.discovery import NodeDiscovery, discover_gpus
from llmgw.agent.discovery.captured import CaptureDir, CaptureError
from llmgw.agent.doctor import Check, DoctorReport, gpu_checks, node_checks
from llmgw.agent.doctor_health import INFO, OK
from llmgw.agent.health import HealthReader
from llmgw.agent.inventory import CpuInfo, Inventory, parse_meminfo


def _inventory(capture: CaptureDir, hostname: str) -> Inventory:
    found = capture.read("proc-meminfo.txt")
    memory = parse_meminfo(found[0]).get("MemTotal", 0) if found is not None and found[1] == 0 else 0
    return Inventory(hostname=hostname, os="", arch="", cpu=CpuInfo(0, "", ()), memory_total_bytes=memory,
                     disk_free_bytes=None, warnings=())


def doctor_from(directory: Path) -> DoctorReport:
    """Judge the capture in `directory` as the agent would (see the module docstring). Blocking (file reads).

    Returns the report: first a "capture" check naming the directory and the GPU source, then the devices, the
    fabrics, the health findings, discovery's warnings and one "capture" info per file not captured.
    Raises `CaptureError` (a `UsageError`) when `directory` is not a directory, holds none of the files of the
    layout (nothing was captured: judging it would call a node with nothing on record ready), or a file in it
    cannot be read.
    """
    capture = CaptureDir(Path(directory))
    if not capture.captured():
        raise CaptureError(f"nothing was captured in {directory}: it holds none of the files `llmgw node doctor "
                           f"--from` reads (nvidia-smi-q-x.xml, hostname.txt, ...; docs/doctor-captures.md). "
                           f"Capture the node with `sh deploy/capture-node.sh {directory}` on it.")
    hostname = capture.hostname()
    gpus, topology, samples = discover_gpus(nvml=None, run=capture.run)
    gpus = replace(gpus, notes=())  # "NVML is not installed" is about this machine, not the captured one
    node = NodeDiscovery(inventory=_inventory(capture, hostname), gpus=gpus, topology=topology,
                         fabrics=capture.fabrics(), smi_samples=samples)
    reader = HealthReader(capture.run, nvml=None, fabric_source=capture, own_names=(hostname,) if hostname else ())
    health = reader.read()
    if gpus.source == "none":
        source = Check("capture", INFO, f"{directory}: no GPU captured (nvidia-smi -q -x absent or not installed)")
    else:
        source = Check("capture", OK, f"{directory}: {hostname or 'node'} read from nvidia-smi -q -x, driver "
                                      f"{gpus.driver_version or '?'}, CUDA {gpus.cuda_version or '?'}, "
                                      f"{sum(not g.is_mig_instance for g in gpus.gpus)} card(s)")
    checks = [source, *(c for c in gpu_checks(node) if c.name != "nvml"), *node_checks(node, health)]
    checks.extend(Check("capture", INFO, f"not captured: {name}") for name in capture.not_captured)
    return DoctorReport(tuple(checks), node, health)
