"""GPU health through NVML (nvidia-ml-py, module `pynvml`): the fields `nvidia-smi -q -x` gives
(`llmgw.tools.parse_smi_health`), read call by call, plus every NVLink's error counters. The agent prefers this
to nvidia-smi when NVML answers (`llmgw.agent.health.HealthReader`): no process to start, no XML to parse.

Calls, per whole card (nvml.h; the H200's answers are in tests/fixtures/nvidia-h200/nvml-dump.json):
- PCIe: `nvmlDeviceGetCurrPcieLinkGeneration`, `...GetMaxPcieLinkGeneration` (card and slot together),
  `...GetGpuMaxPcieLinkGeneration` (the card's own), `...GetCurrPcieLinkWidth`, `...GetMaxPcieLinkWidth`.
  NVML has no call for the slot's own maximum, so `PcieLink.gen_host_max` stays None (nvidia-smi prints "N/A"
  for it in a VM too).
- ECC: `nvmlDeviceGetEccMode`, `nvmlDeviceGetTotalEccErrors(handle, CORRECTED|UNCORRECTED, VOLATILE|AGGREGATE)`.
- Retired pages (pre-Ampere): `nvmlDeviceGetRetiredPages(handle, cause)` (a list of addresses: its length is the
  count) and `nvmlDeviceGetRetiredPagesPendingStatus`.
- Remapped rows (Ampere+): `nvmlDeviceGetRemappedRows` -> (corrected, uncorrected, pending, failure) and
  `nvmlDeviceGetRowRemapperHistogram` (its `none` bin: banks without a spare row).
- Clock event reasons: `nvmlDeviceGetCurrentClocksEventReasons` (a bit mask, `llmgw.tools.nvml_words`).
- NVLink fabric: `nvmlDeviceGetGpuFabricInfoV(handle, byref(c_nvmlGpuFabricInfo_v3_t()))` (v2 where v3 is
  missing): state, status (an nvmlReturn_t), cliqueId, clusterUuid, healthMask, healthSummary.
- MIG: `nvmlDeviceGetMigMode`, and the instances carved (`nvmlDeviceGetMigDeviceHandleByIndex`).
- NVLink errors: for each link whose `nvmlDeviceGetNvLinkState` answers, `nvmlDeviceGetNvLinkErrorCounter(handle,
  link, NVML_NVLINK_ERROR_DL_*)` for replay, recovery, flit CRC and data CRC.
A call the card does not support (NVMLError_NotSupported) leaves its field as nvidia-smi would ("N/A": None);
any other NVML error leaves it None with a note naming the call and card.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

from llmgw.agent.discovery.nvml import NvmlCalls, nvml_text
from llmgw.tools import CardHealth, EccCounts, FabricState, NvLink, NvLinkCard, PcieLink, RemappedRows, RetiredPages
from llmgw.tools import nvml_words

_ENABLED = 1


@dataclass(frozen=True)
class NvmlHealth:
    """What one NVML reading gave: `cards` in NVML's index order, `nvlinks` one entry per card with NVLinks (each
    link's counters by nvidia-smi's name), `notes` what could not be read, and why."""

    cards: tuple[CardHealth, ...]
    nvlinks: tuple[NvLinkCard, ...] = ()
    notes: tuple[str, ...] = ()


def _mode(value: Any) -> bool | None:
    if isinstance(value, (list, tuple)) and value:
        return value[0] == _ENABLED
    return None


def _ecc(calls: NvmlCalls, where: str, handle: Any) -> EccCounts:
    nvml = calls.nvml
    counts = []
    for counter in (nvml.NVML_VOLATILE_ECC, nvml.NVML_AGGREGATE_ECC):
        for kind in (nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED):
            value = calls(where, "nvmlDeviceGetTotalEccErrors", handle, kind, counter)
            counts.append(value if isinstance(value, int) else None)
    return EccCounts(*counts)


def _retired(calls: NvmlCalls, where: str, handle: Any) -> RetiredPages | None:
    nvml = calls.nvml
    single = calls(where, "nvmlDeviceGetRetiredPages", handle,
                   nvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS)
    double = calls(where, "nvmlDeviceGetRetiredPages", handle, nvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
    pending = calls(where, "nvmlDeviceGetRetiredPagesPendingStatus", handle)
    pages = RetiredPages(len(single) if isinstance(single, list) else None,
                         len(double) if isinstance(double, list) else None,
                         bool(pending) if isinstance(pending, int) else None)
    return None if pages == RetiredPages() else pages


def _remapped(calls: NvmlCalls, where: str, handle: Any) -> RemappedRows | None:
    rows = calls(where, "nvmlDeviceGetRemappedRows", handle)
    if not isinstance(rows, (list, tuple)) or len(rows) != 4:
        return None
    histogram = calls(where, "nvmlDeviceGetRowRemapperHistogram", handle, quiet=True)
    banks = getattr(histogram, "none", None)
    corrected, uncorrected, pending, failure = rows
    return RemappedRows(corrected, uncorrected, bool(pending), bool(failure),
                        banks if isinstance(banks, int) else None)


def _fabric(calls: NvmlCalls, where: str, handle: Any) -> FabricState | None:
    nvml = calls.nvml
    kind = getattr(nvml, "c_nvmlGpuFabricInfo_v3_t", None) or getattr(nvml, "c_nvmlGpuFabricInfoV_t", None)
    if kind is None or not hasattr(nvml, "nvmlDeviceGetGpuFabricInfoV"):
        return None  # an nvidia-ml-py older than fabric info: nothing known, as nvidia-smi <= 525 printed none
    info = kind()
    try:
        nvml.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(info))
    except nvml.NVMLError as exc:
        if not isinstance(exc, nvml.NVMLError_NotSupported):
            calls.warnings.append(f"NVML: nvmlDeviceGetGpuFabricInfoV on {where} failed: {exc}")
        return FabricState()  # nvidia-smi prints every fabric field "N/A" then
    status = int(info.status)
    return FabricState(
        state=nvml_words.FABRIC_STATES.get(int(info.state), ""),
        status="Success" if status == 0 else str(nvml.NVMLError(status)),
        clique_id=str(int(info.cliqueId)),
        cluster_uuid=nvml_words.cluster_uuid(bytes(info.clusterUuid)),
        health=nvml_words.fabric_health(getattr(info, "healthSummary", None)),
        bandwidth=nvml_words.fabric_bandwidth(getattr(info, "healthMask", None)),
    )


def _mig_devices(calls: NvmlCalls, where: str, handle: Any) -> int:
    count = calls(where, "nvmlDeviceGetMaxMigDeviceCount", handle) or 0
    return sum(1 for slot in range(count)
               if calls(where, "nvmlDeviceGetMigDeviceHandleByIndex", handle, slot, quiet=True) is not None)


def _nvlinks(calls: NvmlCalls, index: int, name: str, uuid: str, handle: Any) -> NvLinkCard | None:
    nvml = calls.nvml
    links = []
    for link in range(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18)):
        state = calls(f"GPU {index}", "nvmlDeviceGetNvLinkState", handle, link, quiet=True)
        if state is None:
            break  # no NVLink, or past the card's last link
        counters: dict[str, int | None] = {}
        if state:
            for constant, printed in nvml_words.NVLINK_COUNTERS:
                value = calls(f"GPU {index} link {link}", "nvmlDeviceGetNvLinkErrorCounter", handle, link,
                              getattr(nvml, constant))
                counters[printed] = value if isinstance(value, int) else None
        links.append(NvLink(index, link, 1.0 if state else None, counters))
    return NvLinkCard(index, name, uuid, tuple(links)) if links else None


def read_nvml_health(nvml: Any) -> NvmlHealth | None:
    """Read every whole card's health fields and NVLink counters through `nvml` (the `pynvml` module or a stand-in
    with its names). Blocking (microseconds to milliseconds a call). None when `nvml` is None or `nvmlInit` fails
    (the caller falls back to nvidia-smi). `NvLink.speed_gbytes` is 1.0 for an active link (NVML's state says up
    or down, not the speed). Never raises for NVML errors."""
    if nvml is None:
        return None
    try:
        nvml.nvmlInit()
    except nvml.NVMLError:
        return None
    calls = NvmlCalls(nvml)
    cards, nvlinks = [], []
    try:
        for index in range(calls("the system", "nvmlDeviceGetCount") or 0):
            where = f"GPU {index}"
            handle = calls(where, "nvmlDeviceGetHandleByIndex", index)
            if handle is None:
                continue
            pci = calls(where, "nvmlDeviceGetPciInfo", handle)
            uuid = nvml_text(calls(where, "nvmlDeviceGetUUID", handle) or "")
            name = nvml_text(calls(where, "nvmlDeviceGetName", handle) or "")
            mig = _mode(calls(where, "nvmlDeviceGetMigMode", handle, quiet=True))
            cards.append(CardHealth(
                index=index, pci_bus_id=nvml_text(getattr(pci, "busId", "")).upper() if pci is not None else "",
                uuid=uuid, name=name,
                pcie=PcieLink(
                    gen_current=calls(where, "nvmlDeviceGetCurrPcieLinkGeneration", handle),
                    gen_max=calls(where, "nvmlDeviceGetMaxPcieLinkGeneration", handle),
                    gen_device_max=calls(where, "nvmlDeviceGetGpuMaxPcieLinkGeneration", handle, quiet=True),
                    width_current=calls(where, "nvmlDeviceGetCurrPcieLinkWidth", handle),
                    width_max=calls(where, "nvmlDeviceGetMaxPcieLinkWidth", handle)),
                ecc_enabled=_mode(calls(where, "nvmlDeviceGetEccMode", handle)),
                ecc=_ecc(calls, where, handle),
                retired_pages=_retired(calls, where, handle),
                remapped_rows=_remapped(calls, where, handle),
                clock_events=nvml_words.clock_events(calls(where, "nvmlDeviceGetCurrentClocksEventReasons", handle)),
                fabric=_fabric(calls, where, handle),
                mig_enabled=mig,
                mig_devices=_mig_devices(calls, where, handle) if mig else 0,
            ))
            links = _nvlinks(calls, index, name, uuid, handle)
            if links is not None:
                nvlinks.append(links)
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError as exc:
            calls.warnings.append(f"NVML: nvmlShutdown failed: {exc}")
    return NvmlHealth(tuple(cards), tuple(nvlinks), tuple(calls.warnings))
