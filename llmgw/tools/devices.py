"""What discovery finds, as frozen dataclasses: GPUs (whole cards and MIG instances) and the GPU source's report.

Sizes are bytes, power watts. A field that the source could not say is None (never 0); the reason is one of the
report's `warnings`, each naming the tool and what it said.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace


@dataclass(frozen=True)
class GpuDevice:
    """One device an engine can be given: a whole card or a MIG instance.

    `index` is the card's index (a MIG instance carries its parent's); `device_id` is what the engine is given
    ("0", or the instance's "MIG-..." UUID); `gpu_class` e.g. "h200-141g" or "a100-80g-mig-3g.40gb" (None when the
    name or memory is unknown). `compute_capability` "9.0". PCIe: `pcie_gen_current`/`pcie_gen_max` of the link,
    `pcie_gen_device_max`/`pcie_gen_host_max` of the card and of the host side where the source says them,
    widths in lanes. `mig_enabled` the card's current MIG mode. `foreign_pids` are processes on the device that
    llmgw did not start: such a device is not placeable. `numa_node` and `nvlink_peers` (device ids) come from
    NVML or `nvidia-smi topo -m`.
    """

    index: int
    device_id: str
    uuid: str = ""
    name: str = ""
    gpu_class: str | None = None
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    memory_free_bytes: int | None = None
    compute_capability: str | None = None
    pcie_gen_current: int | None = None
    pcie_gen_max: int | None = None
    pcie_gen_device_max: int | None = None
    pcie_gen_host_max: int | None = None
    pcie_width_current: int | None = None
    pcie_width_max: int | None = None
    mig_enabled: bool | None = None
    is_mig_instance: bool = False
    parent_uuid: str = ""
    mig_profile: str = ""
    ecc_enabled: bool | None = None
    power_limit_watts: float | None = None
    foreign_pids: tuple[int, ...] = ()
    numa_node: int | None = None
    nvlink_peers: tuple[str, ...] = ()
    pci_bus_id: str = ""
    architecture: str = ""

    @property
    def placeable(self) -> bool:
        """True when shards may be placed here: class known, no foreign process, not a card split into MIG."""
        if self.gpu_class is None or self.foreign_pids or self.memory_total_bytes is None:
            return False
        return self.is_mig_instance or not self.mig_enabled

    def with_topology(self, numa_node: int | None, nvlink_peers: tuple[str, ...]) -> GpuDevice:
        """A copy with NUMA node and NVLink peers filled in where this device does not know them yet."""
        return replace(
            self,
            numa_node=self.numa_node if self.numa_node is not None else numa_node,
            nvlink_peers=self.nvlink_peers or nvlink_peers,
        )

    def pb_fields(self) -> dict:
        """Keyword arguments for `llmgw.wire.pb.Gpu(**fields)`: proto field names, None values left out."""
        values = {
            "index": self.index, "uuid": self.uuid, "name": self.name, "gpu_class": self.gpu_class or "",
            "device_id": self.device_id, "memory_total_bytes": self.memory_total_bytes or 0,
            "memory_used_bytes": self.memory_used_bytes, "memory_free_bytes": self.memory_free_bytes,
            "compute_capability": self.compute_capability or "",
            "pcie_gen_current": self.pcie_gen_current, "pcie_gen_max": self.pcie_gen_max,
            "pcie_width_current": self.pcie_width_current, "pcie_width_max": self.pcie_width_max,
            "mig_enabled": bool(self.mig_enabled), "is_mig_instance": self.is_mig_instance,
            "parent_uuid": self.parent_uuid, "ecc_enabled": self.ecc_enabled,
            "power_limit_watts": self.power_limit_watts, "foreign_pids": list(self.foreign_pids),
            "numa_node": self.numa_node, "nvlink_peers": list(self.nvlink_peers),
        }
        return {k: v for k, v in values.items() if v is not None}

    def to_json(self) -> dict:
        """Every field as JSON-ready values (tuples become lists), plus `placeable`."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["foreign_pids"] = list(self.foreign_pids)
        out["nvlink_peers"] = list(self.nvlink_peers)
        out["placeable"] = self.placeable
        return out


@dataclass(frozen=True)
class GpuReport:
    """What one GPU source found.

    `source` is "nvml", "nvidia-smi" or "none" (a CPU node: no driver, library or tool; not an error).
    `gpus` lists whole cards then MIG instances, in index order. `warnings` are sentences naming the tool and what
    it said (something is wrong or missing); `notes` are plain facts (e.g. why there is no NVML on a CPU node).
    """

    source: str
    gpus: tuple[GpuDevice, ...] = ()
    driver_version: str = ""
    cuda_version: str = ""
    warnings: tuple[str, ...] = field(default=())
    notes: tuple[str, ...] = field(default=())

    @property
    def placeable(self) -> tuple[GpuDevice, ...]:
        """The devices shards may be placed on."""
        return tuple(g for g in self.gpus if g.placeable)

    def to_json(self) -> dict:
        return {
            "source": self.source, "driver_version": self.driver_version, "cuda_version": self.cuda_version,
            "gpus": [g.to_json() for g in self.gpus], "warnings": list(self.warnings), "notes": list(self.notes),
        }


_SAMPLE_FIELDS: dict[type, tuple[str, ...]] = {}
"""Field names of `GpuSample` (and subclasses), by class, in order."""


@dataclass(frozen=True)
class GpuSample:
    """One device's readings at one moment (a heartbeat's GpuSample). None: not measured, never 0.

    `utilization_percent` 0-100 over the driver's last sample period; `memory_used_bytes`; power in watts;
    `temperature_celsius`; `sm_clock_mhz`; `clock_event_reasons` NVML's bit mask (nvmlClocksEventReason*: 0x1 idle,
    0x4 software power cap, 0x8 hardware slowdown, 0x20/0x40 thermal, ...); `ecc_uncorrected` volatile uncorrected
    ECC errors since the driver loaded. GPM metrics (Hopper and newer, 0-100) need two readings a period apart, so
    they are None in the first sample. `foreign_pids` are the processes on the card now that llmgw did not start
    (judged on every sample, so a card comes back to placement as soon as such a process exits).
    `memory_temperature_celsius` the memory's (HBM) temperature where the card measures it (NVML's field
    NVML_FI_DEV_MEMORY_TEMP, nvidia-smi's "Memory Current Temp"); None on cards that do not (GDDR boards say N/A).
    """

    index: int
    utilization_percent: float | None = None
    memory_used_bytes: int | None = None
    power_draw_watts: float | None = None
    power_limit_watts: float | None = None
    temperature_celsius: float | None = None
    sm_clock_mhz: int | None = None
    clock_event_reasons: int | None = None
    ecc_uncorrected: int | None = None
    sm_active_percent: float | None = None
    sm_occupancy_percent: float | None = None
    tensor_active_percent: float | None = None
    dram_bandwidth_percent: float | None = None
    foreign_pids: tuple[int, ...] = ()
    memory_temperature_celsius: float | None = None

    def pb_fields(self) -> dict:
        """Keyword arguments for `llmgw.wire.pb.GpuSample(**fields)`, None values left out (absent on the wire)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}

    def to_json(self) -> dict:
        """Every field by name (None when not measured); `foreign_pids` as a list."""
        names = _SAMPLE_FIELDS.get(type(self))
        if names is None:  # dataclasses.fields() costs more than the copy itself: 2,000 nodes x 8 cards per status
            names = _SAMPLE_FIELDS[type(self)] = tuple(f.name for f in fields(self))
        out = {name: getattr(self, name) for name in names}
        out["foreign_pids"] = list(self.foreign_pids)
        return out
