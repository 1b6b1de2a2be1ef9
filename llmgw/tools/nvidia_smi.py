"""GPUs through `nvidia-smi` when NVML cannot be loaded: `nvidia-smi -q -x` and `nvidia-smi -L`, pure parsers.

Formats (FORMATS.md, shared/fixtures/nvidia-h200/ for driver 580): DTD v6..v13. Differences handled here: power
under `power_readings` (<= 525) or `gpu_power_readings` (535+), draw as `power_draw` or `instant_power_draw` /
`average_power_draw` (~570+); `clocks_throttle_reasons` (<= 530) or `clocks_event_reasons`; 4- or 8-digit PCI
domains; `mig_devices` holding the text "None" or `mig_device` elements (index, gpu_instance_id,
compute_instance_id, fb_memory_usage; no profile name and no UUID, which `nvidia-smi -L` gives); empty
`processes` written as `<processes />`, whitespace or "None"; placeholders in numeric fields (see `values`).
Output that is not XML (one driver emitted malformed XML; a truncated pipe) gives no GPUs and a warning. XML with
entity declarations is refused rather than expanded.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Collection
from dataclasses import dataclass, replace

from llmgw.tools import values
from llmgw.tools.devices import GpuDevice, GpuReport, GpuSample
from llmgw.tools.gpuclass import gpu_class, mig_class
from llmgw.tools.values import ParseError

# nvmlClocksEventReason* bits (nvml.h) by the suffix nvidia-smi uses in its tag names.
CLOCK_EVENT_BITS = {
    "gpu_idle": 0x1, "applications_clocks_setting": 0x2, "sw_power_cap": 0x4, "hw_slowdown": 0x8,
    "sync_boost": 0x10, "sw_thermal_slowdown": 0x20, "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80, "display_clocks_setting": 0x100,
}


@dataclass(frozen=True)
class MigListing:
    """One MIG device line of `nvidia-smi -L`: card index, device index on the card, profile, UUID."""

    gpu_index: int
    device_index: int
    profile: str
    uuid: str


_GPU_LINE = re.compile(r"^GPU\s+(\d+):")
_MIG_LINE = re.compile(r"^\s+MIG\s+(\S+)\s+Device\s+(\d+):\s*\(UUID:\s*(MIG-[^)\s]+)\)")


def parse_smi_list(text: str) -> tuple[MigListing, ...]:
    """Parse `nvidia-smi -L` for its MIG lines ("  MIG 3g.40gb     Device  0: (UUID: MIG-...)"), in order.

    Lines that do not match are skipped (GPU lines only set the card index). Never raises.
    """
    found = []
    gpu = None
    for line in text.splitlines():
        match = _GPU_LINE.match(line)
        if match:
            gpu = int(match.group(1))
            continue
        match = _MIG_LINE.match(line)
        if match and gpu is not None:
            found.append(MigListing(gpu, int(match.group(2)), match.group(1).lower(), match.group(3)))
    return tuple(found)


def _text(node: ET.Element | None, path: str) -> str | None:
    found = node.find(path) if node is not None else None
    if found is None or found.text is None:
        return None
    return found.text.strip()


def _first(node: ET.Element, *paths: str) -> str | None:
    """The first of `paths` that holds a real value (not a placeholder)."""
    for path in paths:
        text = _text(node, path)
        if not values.is_placeholder(text):
            return text
    return None


def _power(gpu: ET.Element, *names: str) -> float | None:
    return values.number(_first(gpu, *(f"{block}/{name}" for block in ("gpu_power_readings", "power_readings")
                                       for name in names)))


def _clock_events(gpu: ET.Element) -> int | None:
    block = gpu.find("clocks_event_reasons")
    if block is None:
        block = gpu.find("clocks_throttle_reasons")
    if block is None:
        return None
    mask = 0
    seen = False
    for child in block:
        suffix = re.sub(r"^clocks_(event|throttle)_reason_", "", child.tag)
        state = values.enabled(child.text)
        if suffix in CLOCK_EVENT_BITS and state is not None:
            seen = True
            if state:
                mask |= CLOCK_EVENT_BITS[suffix]
    return mask if seen else None


def _ecc_uncorrected(gpu: ET.Element) -> int | None:
    volatile = gpu.find("ecc_errors/volatile")
    if volatile is None:
        return None
    total = None
    for leaf in volatile.iter():
        path_ok = "uncorrectable" in leaf.tag or (leaf.tag == "total" and "double" in _parent_tag(volatile, leaf))
        if path_ok and len(leaf) == 0:
            value = values.integer(leaf.text)
            if value is not None:
                total = (total or 0) + value
    return total


def _parent_tag(root: ET.Element, leaf: ET.Element) -> str:
    for parent in root.iter():
        if leaf in list(parent):
            return parent.tag
    return ""


def _processes(node: ET.Element) -> list[tuple[int, str | None, str | None]]:
    """(pid, gpu_instance_id, compute_instance_id) of each process_info; empty forms give []."""
    out = []
    for info in node.findall("processes/process_info"):
        pid = values.integer(_text(info, "pid"))
        if pid is not None:
            out.append((pid, _text(info, "gpu_instance_id"), _text(info, "compute_instance_id")))
    return out


def _card(gpu: ET.Element, index: int, our_pids: Collection[int], warnings: list[str]) -> GpuDevice:
    name = _text(gpu, "product_name") or ""
    total = values.size_bytes(_text(gpu, "fb_memory_usage/total"))
    if total is None:
        warnings.append(f"nvidia-smi -q -x: GPU {index} memory total is "
                        f"{_text(gpu, 'fb_memory_usage/total')!r}, not a size; it is not placeable")
    link = "pci/pci_gpu_link_info"
    mig = values.enabled(_text(gpu, "mig_mode/current_mig"))
    pids = {pid for pid, _, _ in _processes(gpu)}
    return GpuDevice(
        index=index, device_id=str(index), uuid=_text(gpu, "uuid") or "", name=name,
        gpu_class=gpu_class(name, total), memory_total_bytes=total,
        memory_used_bytes=values.size_bytes(_text(gpu, "fb_memory_usage/used")),
        memory_free_bytes=values.size_bytes(_text(gpu, "fb_memory_usage/free")),
        pcie_gen_current=values.integer(_first(gpu, f"{link}/pcie_gen/current_link_gen")),
        pcie_gen_max=values.integer(_first(gpu, f"{link}/pcie_gen/max_link_gen")),
        pcie_gen_device_max=values.integer(_first(gpu, f"{link}/pcie_gen/max_device_link_gen")),
        pcie_gen_host_max=values.integer(_first(gpu, f"{link}/pcie_gen/max_host_link_gen")),
        pcie_width_current=values.integer(_first(gpu, f"{link}/link_widths/current_link_width")),
        pcie_width_max=values.integer(_first(gpu, f"{link}/link_widths/max_link_width")),
        mig_enabled=mig, ecc_enabled=values.enabled(_text(gpu, "ecc_mode/current_ecc")),
        power_limit_watts=_power(gpu, "enforced_power_limit", "current_power_limit", "power_limit"),
        foreign_pids=tuple(sorted(pids - set(our_pids))),
        pci_bus_id=_text(gpu, "pci/pci_bus_id") or gpu.get("id", ""),
        architecture=_text(gpu, "product_architecture") or "",
    )


def _mig_instances(gpu: ET.Element, card: GpuDevice, listing: tuple[MigListing, ...], our_pids: Collection[int],
                   warnings: list[str]) -> list[GpuDevice]:
    listed = {m.device_index: m for m in listing if m.gpu_index == card.index}
    processes = _processes(gpu)
    out = []
    for element in gpu.findall("mig_devices/mig_device"):
        slot = values.integer(_text(element, "index"))
        gi = _text(element, "gpu_instance_id")
        ci = _text(element, "compute_instance_id")
        if slot is None:
            warnings.append(f"nvidia-smi -q -x: GPU {card.index} has a MIG device without an index; skipped")
            continue
        entry = listed.get(slot)
        if entry is None:
            warnings.append(f"nvidia-smi -L does not list MIG device {slot} of GPU {card.index}: its profile and "
                            "UUID are unknown, so it is not placeable")
        pids = {pid for pid, p_gi, p_ci in processes if p_gi == gi and (p_ci == ci or values.is_placeholder(p_ci))}
        out.append(GpuDevice(
            index=card.index, device_id=entry.uuid if entry else f"{card.index}:{slot}",
            uuid=entry.uuid if entry else "", name=card.name,
            gpu_class=mig_class(card.gpu_class, entry.profile) if entry else None,
            memory_total_bytes=values.size_bytes(_text(element, "fb_memory_usage/total")),
            memory_used_bytes=values.size_bytes(_text(element, "fb_memory_usage/used")),
            memory_free_bytes=values.size_bytes(_text(element, "fb_memory_usage/free")),
            mig_enabled=True, is_mig_instance=True, parent_uuid=card.uuid,
            mig_profile=entry.profile if entry else "", ecc_enabled=card.ecc_enabled,
            foreign_pids=tuple(sorted(pids - set(our_pids))), pci_bus_id=card.pci_bus_id,
            architecture=card.architecture,
        ))
    return out


def _sample(gpu: ET.Element, index: int, limit: float | None) -> GpuSample:
    return GpuSample(
        index=index,
        utilization_percent=values.number(_text(gpu, "utilization/gpu_util")),
        memory_used_bytes=values.size_bytes(_text(gpu, "fb_memory_usage/used")),
        power_draw_watts=_power(gpu, "instant_power_draw", "power_draw", "average_power_draw"),
        power_limit_watts=limit,
        temperature_celsius=values.number(_text(gpu, "temperature/gpu_temp")),
        memory_temperature_celsius=values.number(_text(gpu, "temperature/memory_temp")),
        sm_clock_mhz=values.integer(_text(gpu, "clocks/sm_clock")),
        clock_event_reasons=_clock_events(gpu),
        ecc_uncorrected=_ecc_uncorrected(gpu),
    )


def smi_xml_root(text: str) -> ET.Element:
    """The `<nvidia_smi_log>` element of `nvidia-smi -q -x` output (a "# $ ..." capture frame is tolerated).

    Raises: ParseError when the text declares XML entities (refused rather than expanded), is not well-formed
    XML, or its root is another element.
    """
    body = values.command_body(text).strip()
    if re.search(r"<!ENTITY", body, re.IGNORECASE):
        raise ParseError("nvidia-smi -q -x", "output declares XML entities; refused to expand them")
    try:
        root = ET.fromstring(body)
    except ET.ParseError as exc:
        raise ParseError("nvidia-smi -q -x", f"output is not well-formed XML ({exc})",
                         text=body[:80].replace("\n", " ")) from exc
    if root.tag != "nvidia_smi_log":
        raise ParseError("nvidia-smi -q -x", f"expected <nvidia_smi_log>, got <{root.tag}>")
    return root


@dataclass(frozen=True)
class SmiResult:
    """What `nvidia-smi -q -x` said: the discovery report and one telemetry sample per card."""

    report: GpuReport
    samples: tuple[GpuSample, ...]


def parse_smi_xml(text: str, our_pids: Collection[int] = (), listing: str = "") -> SmiResult:
    """Parse `nvidia-smi -q -x` output (and optionally `nvidia-smi -L` output as `listing`, for MIG UUIDs/profiles).

    Cards are numbered in document order (nvidia-smi writes them by index). `our_pids` as in `read_nvml`.
    Never raises: XML that is malformed or declares entities gives an empty report with a warning.
    """
    warnings: list[str] = []
    try:
        root = smi_xml_root(text)
    except ParseError as exc:
        return SmiResult(GpuReport(source="nvidia-smi", warnings=(str(exc),)), ())
    migs = parse_smi_list(listing)
    cards: list[GpuDevice] = []
    instances: list[GpuDevice] = []
    samples: list[GpuSample] = []
    for index, gpu in enumerate(root.findall("gpu")):
        card = _card(gpu, index, our_pids, warnings)
        if card.mig_enabled:
            card_instances = _mig_instances(gpu, card, migs, our_pids, warnings)
            instances.extend(card_instances)
            # Processes inside MIG instances are not the whole card's business.
            card = replace(card, foreign_pids=())
        cards.append(card)
        samples.append(_sample(gpu, index, card.power_limit_watts))
    return SmiResult(
        GpuReport(source="nvidia-smi", gpus=(*cards, *instances), driver_version=_text(root, "driver_version") or "",
                  cuda_version=_text(root, "cuda_version") or "", warnings=tuple(warnings)),
        tuple(samples),
    )
