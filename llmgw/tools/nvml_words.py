"""NVML's numbers in nvidia-smi's words, so a card read through NVML is judged exactly as one read from
`nvidia-smi -q -x` (`llmgw.tools.health`). Pure.

Sources: nvml.h as nvidia-ml-py 13.x (module `pynvml`) carries it: `nvmlClocksEventReason*` bit masks,
`NVML_GPU_FABRIC_STATE_*`, `NVML_GPU_FABRIC_HEALTH_MASK_*_DEGRADED_BW`, `NVML_NVLINK_ERROR_DL_*`; nvidia-smi's
XML tags for the same (`clocks_event_reason_<word>`, the H200 capture tests/fixtures/nvidia-h200/nvidia-smi-q-x.xml)
and its `nvlink -e` counter names (tests/fixtures/ml-engineering/nvlink-e-h100-excerpt.txt).
"""

from __future__ import annotations

import uuid

# nvmlClocksEventReason* bit -> the word of nvidia-smi's clocks_event_reason_<word> tag.
CLOCK_EVENT_BITS = (
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clocks_setting"),
)

# NVML_GPU_FABRIC_STATE_* -> nvidia-smi's Fabric/State word.
FABRIC_STATES = {0: "Not Supported", 1: "Not Started", 2: "In Progress", 3: "Completed"}

# NVML_NVLINK_ERROR_DL_* counter -> the name `nvidia-smi nvlink -e` prints ("CRC Errors" counts flit CRC errors).
NVLINK_COUNTERS = (
    ("NVML_NVLINK_ERROR_DL_REPLAY", "Replay Errors"),
    ("NVML_NVLINK_ERROR_DL_RECOVERY", "Recovery Errors"),
    ("NVML_NVLINK_ERROR_DL_CRC_FLIT", "CRC Errors"),
    ("NVML_NVLINK_ERROR_DL_CRC_DATA", "CRC Data Errors"),
)

_DEGRADED_BW_SHIFT, _DEGRADED_BW_WIDTH = 0, 0x3  # NVML_GPU_FABRIC_HEALTH_MASK_{SHIFT,WIDTH}_DEGRADED_BW
_HEALTH_SUMMARY = {1: "Healthy", 2: "Unhealthy", 3: "Limited Capacity"}  # NVML_GPU_FABRIC_HEALTH_SUMMARY_*


def clock_events(mask: int | None) -> tuple[str, ...]:
    """The active clock event reasons of `nvmlDeviceGetCurrentClocksEventReasons`'s bit mask, in nvidia-smi's tag
    order (0x4 -> ("sw_power_cap",)); () for None. Unknown bits are left out."""
    if not isinstance(mask, int):
        return ()
    return tuple(word for bit, word in CLOCK_EVENT_BITS if mask & bit)


def fabric_bandwidth(health_mask: int | None) -> str:
    """"Degraded", "Full" or "" (not supported / unknown) from a fabric info's `healthMask`."""
    if not isinstance(health_mask, int):
        return ""
    value = (health_mask >> _DEGRADED_BW_SHIFT) & _DEGRADED_BW_WIDTH
    return {1: "Degraded", 2: "Full"}.get(value, "")


def fabric_health(summary: int | None) -> str:
    """"Healthy", "Unhealthy", "Limited Capacity" or "" from a v3 fabric info's `healthSummary`."""
    return _HEALTH_SUMMARY.get(summary, "") if isinstance(summary, int) else ""


def cluster_uuid(raw: bytes | bytearray | list[int] | tuple[int, ...]) -> str:
    """The 16 bytes of a fabric info's `clusterUuid` as nvidia-smi prints them ("00000000-0000-...").
    Anything that is not 16 bytes gives ""."""
    data = bytes(raw)
    return str(uuid.UUID(bytes=data)) if len(data) == 16 else ""
