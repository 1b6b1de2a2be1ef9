"""A CPU node's inventory for Register: CPUs, memory, free disk, host name; a pure parser plus a thin reader.

This is the minimal CPU-only inventory; GPU discovery (NVML, nvidia-smi) belongs to `llmgw.agent.discovery`.
Format of /proc/cpuinfo: x86 prints one block per logical CPU with "model name" and "flags"; ARM prints
"Features" (and "CPU part", no model name). Blocks are separated by blank lines.
"""

from __future__ import annotations

import os
import platform
import shutil
import socket
from dataclasses import dataclass, field
from pathlib import Path

from llmgw.agent.procfs import parse_meminfo

# The vector extensions engines care about (llama.cpp picks kernels by these); other flags are not reported.
VECTOR_FLAGS = (
    "sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
    "avx_vnni", "amx_tile", "amx_int8", "amx_bf16", "neon", "asimd", "sve", "sve2", "asimddp", "i8mm",
)


@dataclass(frozen=True)
class CpuInfo:
    """Logical CPU count, model name ("" when the kernel does not say) and vector extensions found, sorted."""

    cores: int
    model: str
    flags: tuple[str, ...]


def parse_cpuinfo(text: str) -> CpuInfo:
    """Parse /proc/cpuinfo. Never raises: missing fields give 0 cores, "" model, no flags."""
    cores = 0
    model = ""
    flags: set[str] = set()
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key = key.strip().lower()
        value = value.strip()
        if key == "processor":
            cores += 1
        elif key in ("model name", "cpu model", "hardware") and not model:
            model = value
        elif key in ("flags", "features"):
            flags.update(value.split())
    return CpuInfo(cores=cores, model=model, flags=tuple(sorted(f for f in flags if f in VECTOR_FLAGS)))


@dataclass(frozen=True)
class Inventory:
    """What a CPU node has. Sizes in bytes; `disk_free_bytes` None when the weights directory cannot be measured.

    `warnings` are sentences for the operator (e.g. no AVX2 on x86).
    """

    hostname: str
    os: str
    arch: str
    cpu: CpuInfo
    memory_total_bytes: int
    disk_free_bytes: int | None
    warnings: tuple[str, ...] = field(default=())


def inventory_warnings(arch: str, cpu: CpuInfo) -> tuple[str, ...]:
    """Warnings about the CPU: no AVX2 on x86-64 makes llama.cpp several times slower."""
    warnings = []
    if arch in ("x86_64", "amd64") and "avx2" not in cpu.flags:
        warnings.append("this CPU has no AVX2: llama.cpp runs several times slower on it")
    return tuple(warnings)


def free_bytes_under(path: Path) -> int | None:
    """Free bytes on the file system holding `path` (or its nearest existing parent); None when unmeasurable."""
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        return shutil.disk_usage(probe).free
    except OSError:
        return None


def read_inventory(weights_dir: Path, proc: Path = Path("/proc")) -> Inventory:
    """Read the node's inventory (not a checkpoint: a few small file reads and one statvfs).

    `disk_free_bytes` is measured on the file system that holds `weights_dir` (or its nearest existing parent).
    """
    try:
        cpu = parse_cpuinfo((proc / "cpuinfo").read_text(errors="replace"))
    except OSError:
        cpu = CpuInfo(0, "", ())
    if cpu.cores == 0:
        cpu = CpuInfo(os.cpu_count() or 0, cpu.model, cpu.flags)
    try:
        memory = parse_meminfo((proc / "meminfo").read_text(errors="replace")).get("MemTotal", 0)
    except OSError:
        memory = 0
    arch = platform.machine()
    return Inventory(
        hostname=socket.gethostname(),
        os=f"{platform.system()} {platform.release()}",
        arch=arch,
        cpu=cpu,
        memory_total_bytes=memory,
        disk_free_bytes=free_bytes_under(weights_dir),
        warnings=inventory_warnings(arch, cpu),
    )


def route_address(host: str, port: int) -> str:
    """This node's IP address on the route to `host:port` (no packet is sent: a UDP socket is only connected).

    Returns "127.0.0.1" when the route cannot be worked out (no network).
    """
    try:
        family = socket.AF_INET6 if ":" in host and not host.startswith("[") else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((host.strip("[]"), port))
            return probe.getsockname()[0]
    except OSError:
        return "127.0.0.1"
