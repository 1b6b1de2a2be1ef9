"""GPUs through NVML (the `nvidia-ml-py` package, module `pynvml`): a thin reader over an injectable module.

`read_nvml(nvml, our_pids)` takes the module object, so tests drive it with a fake built from the real H200 capture
(shared/fixtures/nvidia-h200/nvml-dump.json). Units as NVML gives them are converted: power mW -> W, memory bytes
stay bytes. A call the card does not support (NVMLError_NotSupported) leaves its field None quietly; any other NVML
error leaves it None with a warning naming the call, the GPU and NVML's words. No NVML library or driver is not an
error: the report's source is "none" and a note says why (a CPU node, or try nvidia-smi).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from types import ModuleType
from typing import Any

from llmgw.tools import GpuDevice, GpuReport, gpu_class, mig_class, mig_profile

_MIG_ENABLE = 1


def load_nvml() -> ModuleType | None:
    """The `pynvml` module of nvidia-ml-py, or None when the package is not installed."""
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml


def nvml_text(value: Any) -> str:
    """NVML text (bytes from older nvidia-ml-py, str from newer) as str."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class NvmlCalls:
    """Calls NVML functions by name, turning failures into None plus (for unexpected ones) a warning.

    `calls(where, "nvmlDeviceGetX", *args, quiet=False)`: the function's result, or None when this nvidia-ml-py
    lacks it (a warning unless `quiet`), the card does not support it or has no such object (NotSupported,
    NotFound: quietly), or another NVMLError (a warning naming `where`, unless `quiet`). `warnings` collects them.
    """

    def __init__(self, nvml: Any):
        self.nvml = nvml
        self.warnings: list[str] = []
        self._not_supported = getattr(nvml, "NVMLError_NotSupported", ())
        self._not_found = getattr(nvml, "NVMLError_NotFound", ())

    def __call__(self, where: str, function: str, *args: Any, quiet: bool = False) -> Any:
        fn: Callable[..., Any] | None = getattr(self.nvml, function, None)
        if fn is None:
            if not quiet:
                self.warnings.append(f"NVML: this nvidia-ml-py has no {function} ({where})")
            return None
        try:
            return fn(*args)
        except self.nvml.NVMLError as exc:
            if quiet or (self._not_supported and isinstance(exc, self._not_supported)):
                return None
            if self._not_found and isinstance(exc, self._not_found):
                return None
            self.warnings.append(f"NVML: {function} on {where} failed: {exc}")
            return None


def _pids(calls: NvmlCalls, where: str, handle: Any) -> set[int]:
    pids: set[int] = set()
    for function in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
        for process in calls(where, function, handle, quiet=function.endswith("GraphicsRunningProcesses")) or ():
            pid = getattr(process, "pid", None)
            if isinstance(pid, int):
                pids.add(pid)
    return pids


def _memory(calls: NvmlCalls, where: str, handle: Any) -> tuple[int | None, int | None, int | None]:
    info = calls(where, "nvmlDeviceGetMemoryInfo", handle)
    if info is None:
        return None, None, None
    return (getattr(info, "total", None), getattr(info, "used", None), getattr(info, "free", None))


def _mode(value: Any) -> bool | None:
    """NVML mode pairs ([current, pending]) -> current == enabled."""
    if isinstance(value, (list, tuple)) and value:
        return value[0] == _MIG_ENABLE
    return None


def _read_card(calls: NvmlCalls, index: int, handle: Any, our_pids: Collection[int]) -> GpuDevice:
    nvml = calls.nvml
    where = f"GPU {index}"
    name = nvml_text(calls(where, "nvmlDeviceGetName", handle) or "")
    uuid = nvml_text(calls(where, "nvmlDeviceGetUUID", handle) or "")
    total, used, free = _memory(calls, where, handle)
    cc = calls(where, "nvmlDeviceGetCudaComputeCapability", handle)
    limit_mw = calls(where, "nvmlDeviceGetEnforcedPowerLimit", handle)
    if limit_mw is None:
        limit_mw = calls(where, "nvmlDeviceGetPowerManagementLimit", handle)
    pci = calls(where, "nvmlDeviceGetPciInfo", handle)
    numa = calls(where, "nvmlDeviceGetNumaNodeId", handle, quiet=True)
    foreign = sorted(_pids(calls, where, handle) - set(our_pids))
    return GpuDevice(
        index=index, device_id=str(index), uuid=uuid, name=name, gpu_class=gpu_class(name, total),
        memory_total_bytes=total, memory_used_bytes=used, memory_free_bytes=free,
        compute_capability=f"{cc[0]}.{cc[1]}" if isinstance(cc, (list, tuple)) and len(cc) == 2 else None,
        pcie_gen_current=calls(where, "nvmlDeviceGetCurrPcieLinkGeneration", handle),
        pcie_gen_max=calls(where, "nvmlDeviceGetMaxPcieLinkGeneration", handle),
        pcie_gen_device_max=calls(where, "nvmlDeviceGetGpuMaxPcieLinkGeneration", handle, quiet=True),
        pcie_width_current=calls(where, "nvmlDeviceGetCurrPcieLinkWidth", handle),
        pcie_width_max=calls(where, "nvmlDeviceGetMaxPcieLinkWidth", handle),
        mig_enabled=_mode(calls(where, "nvmlDeviceGetMigMode", handle)) if hasattr(nvml, "nvmlDeviceGetMigMode") else None,
        ecc_enabled=_mode(calls(where, "nvmlDeviceGetEccMode", handle)),
        power_limit_watts=limit_mw / 1000.0 if isinstance(limit_mw, (int, float)) else None,
        foreign_pids=tuple(foreign),
        numa_node=numa if isinstance(numa, int) and numa >= 0 else None,
        pci_bus_id=nvml_text(getattr(pci, "busId", "")) if pci is not None else "",
    )


def _read_mig(calls: NvmlCalls, card: GpuDevice, handle: Any, our_pids: Collection[int]) -> list[GpuDevice]:
    where = f"GPU {card.index}"
    count = calls(where, "nvmlDeviceGetMaxMigDeviceCount", handle) or 0
    instances = []
    for slot in range(count):
        mig = calls(where, "nvmlDeviceGetMigDeviceHandleByIndex", handle, slot, quiet=True)
        if mig is None:
            continue  # an empty slot answers NotFound
        at = f"GPU {card.index} MIG {slot}"
        name = nvml_text(calls(at, "nvmlDeviceGetName", mig) or "")
        uuid = nvml_text(calls(at, "nvmlDeviceGetUUID", mig) or "")
        total, used, free = _memory(calls, at, mig)
        profile = mig_profile(name)
        if not profile:
            calls.warnings.append(f"NVML: {at} is named {name!r}, which names no MIG profile; it is not placeable")
        foreign = sorted(_pids(calls, at, mig) - set(our_pids))
        instances.append(GpuDevice(
            index=card.index, device_id=uuid or f"{card.index}:{slot}", uuid=uuid, name=name,
            gpu_class=mig_class(card.gpu_class, profile), memory_total_bytes=total, memory_used_bytes=used,
            memory_free_bytes=free, compute_capability=card.compute_capability, mig_enabled=True,
            is_mig_instance=True, parent_uuid=card.uuid, mig_profile=profile, ecc_enabled=card.ecc_enabled,
            foreign_pids=tuple(foreign), numa_node=card.numa_node, pci_bus_id=card.pci_bus_id,
        ))
    return instances


def _nvlink_peers(calls: NvmlCalls, handle: Any, index: int, by_bus: dict[str, str]) -> tuple[str, ...]:
    nvml = calls.nvml
    peers: list[str] = []
    for link in range(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18)):
        state = calls(f"GPU {index}", "nvmlDeviceGetNvLinkState", handle, link, quiet=True)
        if state is None:
            break  # no NVLink, or past the card's last link
        if not state:
            continue
        remote = calls(f"GPU {index}", "nvmlDeviceGetNvLinkRemotePciInfo", handle, link, quiet=True)
        peer = by_bus.get(nvml_text(getattr(remote, "busId", "")).lower()) if remote is not None else None
        if peer is not None and peer not in peers:
            peers.append(peer)
    return tuple(peers)


def read_nvml(nvml: Any, our_pids: Collection[int] = ()) -> GpuReport:
    """Discover every GPU and MIG instance through NVML. Blocking (NVML calls take microseconds to milliseconds).

    `nvml` is the `pynvml` module (see `load_nvml`) or a stand-in with the same names; None means not installed.
    `our_pids` are the processes llmgw started (every pid of every shard's process group): other processes on a
    device make it not placeable. Never raises for NVML failures: see the module docstring.
    """
    if nvml is None:
        return GpuReport(source="none", notes=("NVML: nvidia-ml-py (pynvml) is not installed",))
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        return GpuReport(source="none", notes=(f"NVML: no NVIDIA driver or library here ({exc})",))
    calls = NvmlCalls(nvml)
    try:
        driver = nvml_text(calls("the system", "nvmlSystemGetDriverVersion") or "")
        cuda_raw = calls("the system", "nvmlSystemGetCudaDriverVersion", quiet=True)
        cuda = f"{cuda_raw // 1000}.{cuda_raw % 1000 // 10}" if isinstance(cuda_raw, int) and cuda_raw > 0 else ""
        count = calls("the system", "nvmlDeviceGetCount") or 0
        cards: list[tuple[GpuDevice, Any]] = []
        for index in range(count):
            handle = calls(f"GPU {index}", "nvmlDeviceGetHandleByIndex", index)
            if handle is None:
                continue
            cards.append((_read_card(calls, index, handle, our_pids), handle))
        by_bus = {card.pci_bus_id.lower(): card.device_id for card, _ in cards if card.pci_bus_id}
        devices: list[GpuDevice] = []
        instances: list[GpuDevice] = []
        for card, handle in cards:
            card = card.with_topology(None, _nvlink_peers(calls, handle, card.index, by_bus))
            devices.append(card)
            if card.mig_enabled:
                instances.extend(_read_mig(calls, card, handle, our_pids))
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError as exc:
            calls.warnings.append(f"NVML: nvmlShutdown failed: {exc}")
    return GpuReport(source="nvml", gpus=(*devices, *instances), driver_version=driver, cuda_version=cuda,
                     warnings=tuple(calls.warnings))
