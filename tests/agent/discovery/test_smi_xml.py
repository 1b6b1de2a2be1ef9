"""`nvidia-smi -q -x` on the real H200 captures and on variants for other driver generations."""

from __future__ import annotations

import pytest

from captures import capture, variant
from llmgw.tools import parse_smi_list, parse_smi_xml

MiB = 1024**2


@pytest.mark.parametrize(("name", "used_mib", "power", "sm_clock", "reasons"), [
    ("nvidia-smi-q-x.xml", 0, 123.69, 1980, 0x1),               # idle: gpu_idle active
    ("nvidia-smi-q-x-after-load.xml", None, None, None, None),  # filled in below from the file itself
])
def test_h200_capture_gives_the_card_and_a_sample(name, used_mib, power, sm_clock, reasons):
    result = parse_smi_xml(capture(name))
    report = result.report
    assert report.source == "nvidia-smi" and report.warnings == ()
    assert (report.driver_version, report.cuda_version) == ("580.159.04", "13.0")
    (gpu,) = report.gpus
    assert gpu.gpu_class == "h200-141g" and gpu.uuid == "GPU-050bda45-960a-207c-573e-20129c535d06"
    assert gpu.memory_total_bytes == 143771 * MiB and gpu.architecture == "Hopper"
    assert (gpu.pcie_gen_current, gpu.pcie_gen_max, gpu.pcie_gen_device_max, gpu.pcie_gen_host_max) == (5, 5, 5, None)
    assert (gpu.pcie_width_current, gpu.pcie_width_max) == (16, 16)
    assert gpu.mig_enabled is False and gpu.ecc_enabled is True and gpu.power_limit_watts == 700.0
    assert gpu.pci_bus_id == "00000000:00:06.0" and gpu.foreign_pids == () and gpu.placeable
    (sample,) = result.samples
    assert sample.power_limit_watts == 700.0 and sample.ecc_uncorrected == 0
    if used_mib is not None:
        assert sample.memory_used_bytes == used_mib * MiB and sample.power_draw_watts == power
        assert sample.sm_clock_mhz == sm_clock and sample.clock_event_reasons == reasons
        assert sample.temperature_celsius == 37.0 and sample.utilization_percent == 0.0
    else:
        assert sample.power_draw_watts is not None and sample.sm_clock_mhz is not None


def test_average_power_is_used_when_instant_power_is_not_reported():
    text = capture("nvidia-smi-q-x.xml").replace(
        "<instant_power_draw>123.69 W</instant_power_draw>", "<instant_power_draw>N/A</instant_power_draw>")
    assert parse_smi_xml(text).samples[0].power_draw_watts == 123.63


def test_driver_525_with_mig_old_power_and_throttle_tags():
    result = parse_smi_xml(variant("smi-q-x-525-a100-mig.xml"), listing=variant("smi-L-a100-mig.txt"))
    report = result.report
    assert report.warnings == () and report.driver_version == "525.85.12"
    card0, card1, mig0, mig1 = report.gpus
    assert card0.mig_enabled and not card0.placeable and card0.pci_bus_id == "0000:07:00.0"
    assert card0.gpu_class == "a100-80g" and card0.power_limit_watts == 400.0
    assert (mig0.device_id, mig0.gpu_class, mig0.memory_total_bytes) == (
        "MIG-0a7c2b43-aaaa-5d4e-8f00-000000000010", "a100-80g-mig-3g.40gb", 40192 * MiB)
    assert mig0.placeable and mig0.parent_uuid == card0.uuid
    assert mig1.gpu_class == "a100-80g-mig-2g.20gb" and mig1.foreign_pids == (4242,) and not mig1.placeable
    assert (card1.pcie_gen_current, card1.pcie_width_current) == (1, 8) and card1.placeable
    s0, s1 = result.samples
    assert s0.utilization_percent is None                       # MIG parent: N/A, not 0
    assert (s0.power_draw_watts, s0.clock_event_reasons, s0.ecc_uncorrected) == (62.53, 0x1, 2)
    assert (s1.power_draw_watts, s1.clock_event_reasons, s1.ecc_uncorrected) == (398.1, 0x4 | 0x40, 1)
    assert (s1.temperature_celsius, s1.sm_clock_mhz, s1.utilization_percent) == (81.0, 1275, 97.0)


def test_mig_devices_without_a_listing_are_not_placeable_and_say_why():
    report = parse_smi_xml(variant("smi-q-x-525-a100-mig.xml")).report
    migs = [g for g in report.gpus if g.is_mig_instance]
    assert [g.gpu_class for g in migs] == [None, None] and not any(g.placeable for g in migs)
    assert "nvidia-smi -L does not list MIG device 0 of GPU 0" in report.warnings[0]


def test_eight_h100_on_driver_535_with_every_empty_process_form():
    result = parse_smi_xml(variant("smi-q-x-535-8xh100.xml"), our_pids={1})
    report = result.report
    assert report.warnings == () and len(report.gpus) == 8
    assert {g.gpu_class for g in report.gpus} == {"h100-80g"}
    assert [g.foreign_pids for g in report.gpus].count(()) == 7 and report.gpus[5].foreign_pids == (31337,)
    assert report.gpus[3].pci_bus_id == "00000000:5D:00.0" and report.gpus[0].pcie_gen_host_max == 5
    assert [s.power_draw_watts for s in result.samples][:2] == [70.25, 71.25]
    last = result.samples[7]
    assert (last.power_draw_watts, last.temperature_celsius, last.sm_clock_mhz) == (None, None, None)
    assert result.samples[5].clock_event_reasons == 0 and result.samples[5].utilization_percent == 87.0


@pytest.mark.parametrize(("text", "words"), [
    (variant("smi-q-x-truncated.xml"), "not well-formed XML"),
    (variant("smi-q-x-bad-ampersand.xml"), "not well-formed XML"),
    ("", "not well-formed XML"),
    ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.", "not well-formed XML"),
    ('<?xml version="1.0"?><!DOCTYPE x [<!ENTITY a "aaaa">]><nvidia_smi_log>&a;</nvidia_smi_log>', "entities"),
    ("<html><body>proxy error</body></html>", "expected <nvidia_smi_log>"),
])
def test_garbage_gives_no_gpus_and_a_warning_naming_the_tool(text, words):
    report = parse_smi_xml(text).report
    assert report.gpus == ()
    (warning,) = report.warnings
    assert warning.startswith("nvidia-smi -q -x:") and words in warning


def test_listing_parser_reads_mig_lines_and_ignores_the_rest():
    assert parse_smi_list(capture("nvidia-smi-L.txt")) == ()
    listed = parse_smi_list(variant("smi-L-a100-mig.txt"))
    assert [(m.gpu_index, m.device_index, m.profile) for m in listed] == [(0, 0, "3g.40gb"), (0, 1, "2g.20gb")]
    assert parse_smi_list("garbage\n  MIG x Device") == ()
