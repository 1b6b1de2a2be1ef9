"""NVLink error counters judged between two readings by DCGM's limits (llmgw.tools.nvlink_error_findings), and
NVML's numbers in nvidia-smi's words (llmgw.tools.nvml_words)."""

from __future__ import annotations

import pytest

from llmgw.tools import Level, NvLink, NvLinkCard, nvlink_error_findings, parse_nvlink_errors
from llmgw.tools.nvml_words import clock_events, cluster_uuid, fabric_bandwidth

from fixture_files import fixture


def card(**counters) -> NvLinkCard:
    return NvLinkCard(0, "NVIDIA H100 80GB HBM3", "GPU-x", (NvLink(0, 0, None, counters),))


@pytest.mark.parametrize(("before", "after", "seconds", "expected"), [
    ({"Replay Errors": 5}, {"Replay Errors": 5}, 60.0, []),
    ({"Replay Errors": 5}, {"Replay Errors": 6}, 60.0, [("fail", True)]),
    ({"Recovery Errors": 0}, {"Recovery Errors": 1}, 60.0, [("fail", True)]),
    ({"CRC Errors": 0}, {"CRC Errors": 5999}, 60.0, [("warn", False)]),  # 99.98/s
    ({"CRC Errors": 0}, {"CRC Errors": 6000}, 60.0, [("fail", True)]),  # 100/s: DCGM fails at >= 100
    ({"CRC Data Errors": 10}, {"CRC Data Errors": 3}, 60.0, [("warn", False)]),  # reset: counts from 0
    ({"CRC Errors": None}, {"CRC Errors": None}, 60.0, []),
])
def test_counters_rising_between_readings_are_judged_by_dcgms_limits(before, after, seconds, expected):
    found = nvlink_error_findings(card(**after), card(**before), seconds)
    assert [(str(f.level), f.blocks_placement) for f in found] == expected


def test_without_a_previous_reading_the_totals_since_the_driver_loaded_only_warn():
    (found,) = nvlink_error_findings(card(**{"Replay Errors": 3}), None, None)
    assert found.level is Level.WARN and not found.blocks_placement and "link 0: Replay Errors 3" in found.message


def test_the_real_h100_capture_with_zero_counters_says_nothing_on_either_path():
    (h100,) = parse_nvlink_errors(fixture("ml-engineering/nvlink-e-h100-excerpt.txt"))
    assert nvlink_error_findings(h100, None, None) == () and nvlink_error_findings(h100, h100, 60.0) == ()


@pytest.mark.parametrize(("mask", "words"), [
    (1, ("gpu_idle",)),  # the H200 at idle: nvml-dump.json "throttle": 1, the XML's gpu_idle Active
    (4, ("sw_power_cap",)),  # the H200 under load: load-sample.json "throttle": 4
    (0x80 | 0x40, ("hw_thermal_slowdown", "hw_power_brake_slowdown")),
    (0, ()), (None, ()),
])
def test_clock_event_masks_read_as_nvidia_smis_tags(mask, words):
    assert clock_events(mask) == words


def test_fabric_words():
    assert cluster_uuid(bytes(16)) == "00000000-0000-0000-0000-000000000000" and cluster_uuid(b"short") == ""
    assert (fabric_bandwidth(2), fabric_bandwidth(1), fabric_bandwidth(0), fabric_bandwidth(None)) == (
        "Full", "Degraded", "", "")
