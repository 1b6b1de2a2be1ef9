"""What wears a card out, from `nvidia-smi -q -x`: PCIe link, ECC counts, retired pages, remapped rows, clock event
reasons, MIG carving and the NVLink fabric (domain) state. Pure parser; the judgements are in `llmgw.tools.health`.

Format (FORMATS.md; DTD nvsmi_device_v10..v13): captures of drivers 418 (no DTD line), 515 (v11), 525/535/536/570
(v12), 580 (v13, tests/fixtures/nvidia-h200) and 595 (v13) are in tests/fixtures/. What varies:

- `pci/pci_gpu_link_info`: `pcie_gen/{max_link_gen,current_link_gen}`, since v12 also `device_current_link_gen`,
  `max_device_link_gen` (the card's own maximum) and `max_host_link_gen` (the slot's; "N/A" in VMs);
  `link_widths/{max_link_width,current_link_width}` as "16x". The current generation drops at idle.
- `ecc_errors/{volatile,aggregate}`: v10 `single_bit/*` and `double_bit/*` with a `total`; v11-v12 `sram_correctable`,
  `sram_uncorrectable`, `dram_correctable`, `dram_uncorrectable`; v13 splits `sram_uncorrectable_parity` /
  `_secded` and adds `sram_threshold_exceeded`. Consumer cards write "N/A".
- `retired_pages` (pre-Ampere): `multiple_single_bit_retirement/retired_count`, `double_bit_retirement/...`,
  `pending_blacklist` / `pending_retirement` ("Yes"/"No"/"N/A").
- `remapped_rows` (Ampere and newer): a leaf "N/A" (no row remapper, or a VM) or a subtree `remapped_row_corr`,
  `remapped_row_unc`, `remapped_row_pending`, `remapped_row_failure`, `row_remapper_histogram/*` ("3072 bank(s)").
- `clocks_event_reasons/clocks_event_reason_*` (535+) or `clocks_throttle_reasons/clocks_throttle_reason_*`:
  "Active" / "Not Active".
- `fabric`: absent (<= 525), `state`/`status` only (535), or with `cliqueId`, `clusterUuid` and `health/*`
  (550+). A single machine's NVSwitch reports state Completed, status Success, CliqueId 0 and an all-zero
  ClusterUUID: no domain.
- `mig_mode/current_mig` and `mig_devices` ("None" text or `mig_device` elements).
Numbers may be "N/A", "[N/A]", "Not Supported" or "Requested functionality has been deprecated": those read None.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass

from llmgw.tools import values
from llmgw.tools.nvidia_smi import smi_xml_root


@dataclass(frozen=True)
class PcieLink:
    """The card's PCIe link. Generations 1..6, widths in lanes; None where the tool did not say.

    `gen_current` drops when the card idles, so it is never a health signal. `gen_max` is the fastest generation
    the link allows (the card and the slot together); `gen_device_max` the card's own, `gen_host_max` the slot's.
    `width_current` the lanes trained now, `width_max` the most the card and slot allow.
    """

    gen_current: int | None = None
    gen_max: int | None = None
    gen_device_max: int | None = None
    gen_host_max: int | None = None
    width_current: int | None = None
    width_max: int | None = None

    @property
    def gen_capable(self) -> int | None:
        """The fastest generation card and slot allow together: the smaller of the card's and the slot's maxima
        where both are known, else `gen_max`."""
        known = [g for g in (self.gen_device_max, self.gen_host_max) if g is not None]
        if len(known) == 2:
            return min(known)
        return self.gen_max if self.gen_max is not None else (known[0] if known else None)


@dataclass(frozen=True)
class EccCounts:
    """ECC error counts summed over memory kinds (SRAM, DRAM, caches). `volatile_*` since the driver loaded,
    `aggregate_*` over the card's life. None: not reported (ECC off or not supported)."""

    volatile_corrected: int | None = None
    volatile_uncorrected: int | None = None
    aggregate_corrected: int | None = None
    aggregate_uncorrected: int | None = None


@dataclass(frozen=True)
class RetiredPages:
    """Dynamic page retirement (pre-Ampere cards): pages retired for single-bit and double-bit errors, and whether
    a retirement waits for the next reset (`pending`)."""

    single_bit: int | None = None
    double_bit: int | None = None
    pending: bool | None = None


@dataclass(frozen=True)
class RemappedRows:
    """Row remapping (Ampere and newer): rows remapped for correctable and uncorrectable errors; `pending` a remap
    waits for a GPU reset; `failure` a remap failed (the card needs service); `banks_without_spare` from the
    histogram's "None" bin (banks with no spare row left), None when absent."""

    correctable: int | None = None
    uncorrectable: int | None = None
    pending: bool | None = None
    failure: bool | None = None
    banks_without_spare: int | None = None


@dataclass(frozen=True)
class FabricState:
    """The card's NVLink fabric (multi-node NVLink domain) membership, as printed ("" where absent).

    `state` "Completed" / "In Progress" / "Not Started" / "Not Supported"; `status` "Success" or an error;
    `clique_id` "0"; `cluster_uuid` "00000000-0000-0000-0000-000000000000"; `health` the `health/summary` word
    ("Healthy"), `bandwidth` the `health/bandwidth` word ("Full", "Degraded").
    """

    state: str = ""
    status: str = ""
    clique_id: str = ""
    cluster_uuid: str = ""
    health: str = ""
    bandwidth: str = ""

    @property
    def domain(self) -> str | None:
        """The multi-node NVLink domain's ClusterUUID; None when the card is in none (no fabric, a placeholder, or
        the all-zero UUID of a single machine's NVSwitch)."""
        uuid = self.cluster_uuid.strip().lower()
        if values.is_placeholder(uuid) or not uuid.replace("0", "").replace("-", ""):
            return None
        return uuid

    @property
    def joined(self) -> bool:
        """True when registration with the fabric manager completed successfully (state Completed, status
        Success)."""
        return self.state.lower() == "completed" and self.status.lower() == "success"


@dataclass(frozen=True)
class CardHealth:
    """The health fields of one whole card. `index` in document order, `pci_bus_id` "00000000:3B:00.0" (as the
    kernel log's XIDs are normalised), `clock_events` the active clock event reasons by nvidia-smi's suffix
    ("sw_power_cap", "hw_slowdown", ...), `mig_enabled` the current MIG mode and `mig_devices` how many MIG devices
    are carved. `remapped_rows`, `retired_pages` and `fabric` are None when the card does not report them."""

    index: int
    pci_bus_id: str
    uuid: str = ""
    name: str = ""
    pcie: PcieLink = PcieLink()
    ecc_enabled: bool | None = None
    ecc: EccCounts = EccCounts()
    retired_pages: RetiredPages | None = None
    remapped_rows: RemappedRows | None = None
    clock_events: tuple[str, ...] = ()
    fabric: FabricState | None = None
    mig_enabled: bool | None = None
    mig_devices: int = 0


def _text(node: ET.Element | None, path: str) -> str | None:
    found = node.find(path) if node is not None else None
    if found is None or found.text is None:
        return None
    return found.text.strip()


def _pcie(gpu: ET.Element) -> PcieLink:
    link = "pci/pci_gpu_link_info"
    return PcieLink(
        gen_current=values.integer(_text(gpu, f"{link}/pcie_gen/current_link_gen")),
        gen_max=values.integer(_text(gpu, f"{link}/pcie_gen/max_link_gen")),
        gen_device_max=values.integer(_text(gpu, f"{link}/pcie_gen/max_device_link_gen")),
        gen_host_max=values.integer(_text(gpu, f"{link}/pcie_gen/max_host_link_gen")),
        width_current=values.integer(_text(gpu, f"{link}/link_widths/current_link_width")),
        width_max=values.integer(_text(gpu, f"{link}/link_widths/max_link_width")),
    )


def _ecc_sums(block: ET.Element | None) -> tuple[int | None, int | None]:
    """(corrected, uncorrected) summed over `block`'s leaves: *_correctable / *_uncorrectable* (v11+), or the
    `total` of single_bit / double_bit (v10). None when no leaf holds a number."""
    if block is None:
        return None, None
    corrected = uncorrected = None
    old_style = block.find("single_bit") is not None or block.find("double_bit") is not None
    if old_style:
        corrected = values.integer(_text(block, "single_bit/total"))
        uncorrected = values.integer(_text(block, "double_bit/total"))
        return corrected, uncorrected
    for leaf in block:
        count = values.integer(leaf.text)
        if count is None or len(leaf):
            continue
        if "uncorrectable" in leaf.tag:
            uncorrected = (uncorrected or 0) + count
        elif "correctable" in leaf.tag:
            corrected = (corrected or 0) + count
    return corrected, uncorrected


def _retired(gpu: ET.Element) -> RetiredPages | None:
    block = gpu.find("retired_pages")
    if block is None:
        return None
    pending = values.enabled(_text(block, "pending_retirement"))
    if pending is None:
        pending = values.enabled(_text(block, "pending_blacklist"))
    pages = RetiredPages(
        single_bit=values.integer(_text(block, "multiple_single_bit_retirement/retired_count")),
        double_bit=values.integer(_text(block, "double_bit_retirement/retired_count")),
        pending=pending,
    )
    return None if pages == RetiredPages() else pages


def _remapped(gpu: ET.Element) -> RemappedRows | None:
    block = gpu.find("remapped_rows")
    if block is None or len(block) == 0:
        return None  # absent, or the leaf "N/A"
    rows = RemappedRows(
        correctable=values.integer(_text(block, "remapped_row_corr")),
        uncorrectable=values.integer(_text(block, "remapped_row_unc")),
        pending=values.enabled(_text(block, "remapped_row_pending")),
        failure=values.enabled(_text(block, "remapped_row_failure")),
        banks_without_spare=values.integer(
            (_text(block, "row_remapper_histogram/row_remapper_histogram_none") or "").replace("bank(s)", "")),
    )
    return None if rows == RemappedRows() else rows


def _clock_events(gpu: ET.Element) -> tuple[str, ...]:
    block = gpu.find("clocks_event_reasons")
    if block is None:
        block = gpu.find("clocks_throttle_reasons")
    if block is None:
        return ()
    active = []
    for child in block:
        if values.enabled(child.text):
            active.append(child.tag.replace("clocks_event_reason_", "").replace("clocks_throttle_reason_", ""))
    return tuple(active)


def _fabric(gpu: ET.Element) -> FabricState | None:
    block = gpu.find("fabric")
    if block is None:
        return None

    def word(path: str) -> str:
        text = _text(block, path)
        return "" if values.is_placeholder(text) else (text or "")

    return FabricState(state=word("state"), status=word("status"), clique_id=word("cliqueId"),
                       cluster_uuid=word("clusterUuid"), health=word("health/summary"),
                       bandwidth=word("health/bandwidth"))


def parse_smi_health(text: str) -> tuple[CardHealth, ...]:
    """The health fields of every whole card in `nvidia-smi -q -x` output, in document order (MIG devices are
    counted in `mig_devices`, not listed). A document with no `<gpu>` gives ().

    Raises: ParseError (from `smi_xml_root`) when the text is not nvidia-smi's XML.
    """
    root = smi_xml_root(text)
    cards = []
    for index, gpu in enumerate(root.findall("gpu")):
        volatile = _ecc_sums(gpu.find("ecc_errors/volatile"))
        aggregate = _ecc_sums(gpu.find("ecc_errors/aggregate"))
        bus = _text(gpu, "pci/pci_bus_id") or gpu.get("id", "")
        cards.append(CardHealth(
            index=index, pci_bus_id=bus.upper(), uuid=_text(gpu, "uuid") or "", name=_text(gpu, "product_name") or "",
            pcie=_pcie(gpu), ecc_enabled=values.enabled(_text(gpu, "ecc_mode/current_ecc")),
            ecc=EccCounts(volatile[0], volatile[1], aggregate[0], aggregate[1]),
            retired_pages=_retired(gpu), remapped_rows=_remapped(gpu), clock_events=_clock_events(gpu),
            fabric=_fabric(gpu), mig_enabled=values.enabled(_text(gpu, "mig_mode/current_mig")),
            mig_devices=len(gpu.findall("mig_devices/mig_device")),
        ))
    return tuple(cards)
