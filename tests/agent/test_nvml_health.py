"""GPU health through NVML (llmgw.agent.nvml_health) against the NVML stand-in built from the real H200's answers:
the card reads exactly as its `nvidia-smi -q -x` capture does, NVML's error codes leave fields as nvidia-smi's "N/A"
would, and remapped rows, ECC, clock events, the fabric and every NVLink's counters come through."""

from __future__ import annotations

import copy

import pynvml

from nvml_support import FakeNvml, h200_dump, two_h200s

from captures import capture
from llmgw.agent.nvml_health import read_nvml_health
from llmgw.tools import FabricState, RemappedRows, card_verdict, nvlink_domain, parse_smi_health

CLUSTER = bytes(range(1, 17))


def test_the_h200_read_through_nvml_equals_its_nvidia_smi_capture():
    health = read_nvml_health(FakeNvml.h200())
    (smi,) = parse_smi_health(capture("nvidia-smi-q-x.xml"))
    (card,) = health.cards
    assert card == smi  # PCIe maxima, ECC, remapped rows, clock events ("gpu_idle"), fabric, MIG: field by field
    assert card_verdict(card) == card_verdict(smi) and not card_verdict(card).findings
    assert health.nvlinks == () and health.notes == ()


def test_nvml_failing_to_start_gives_none_so_the_agent_falls_back_to_nvidia_smi():
    assert read_nvml_health(FakeNvml([], init_error=pynvml.NVMLError_DriverNotLoaded())) is None
    assert read_nvml_health(None) is None


def test_a_worn_card_reports_pending_and_failed_remaps_ecc_counts_and_a_power_brake():
    nvml = FakeNvml.h200(remapped_rows=[3, 1, 1, 1], row_remapper_histogram={"max": 3070, "none": 2},
                         ecc_uncorrected=2, ecc_counts={"volatile_corrected": 7, "aggregate_corrected": 40,
                                                        "aggregate_uncorrected": 5},
                         throttle=0x80 | 0x4)
    (card,) = read_nvml_health(nvml).cards
    assert card.remapped_rows == RemappedRows(3, 1, True, True, 2)
    assert (card.ecc.volatile_corrected, card.ecc.volatile_uncorrected, card.ecc.aggregate_corrected,
            card.ecc.aggregate_uncorrected) == (7, 2, 40, 5)
    assert card.clock_events == ("sw_power_cap", "hw_power_brake_slowdown")
    codes = {f.code: f.blocks_placement for f in card_verdict(card).findings}
    assert codes == {"remap-failure": True, "remap-pending": False, "ecc-uncorrected": False, "clock-slowdown": False}


def test_an_error_other_than_not_supported_is_a_note_naming_the_call_and_card():
    nvml = FakeNvml.h200(fail={"nvmlDeviceGetRemappedRows": pynvml.NVMLError_Unknown()})
    health = read_nvml_health(nvml)
    assert health.cards[0].remapped_rows is None
    assert health.notes == ("NVML: nvmlDeviceGetRemappedRows on GPU 0 failed: Unknown Error",)


def test_a_joined_fabric_card_and_each_nvlinks_error_counters():
    cards = two_h200s().cards
    for card in cards:
        card["fabric_info"] = {"state": pynvml.NVML_GPU_FABRIC_STATE_COMPLETED, "cliqueId": 7,
                               "clusterUuid": CLUSTER, "healthMask": 2, "healthSummary": 1}
        card["nvlink_states"][0]["errors"] = {"replay": 0, "crc_flit": 0}
    cards[1]["nvlink_states"].append({"active": 0, "remote": b"00000000:00:06.0"})
    cards[1]["nvlink_states"][0]["errors"] = {"replay": 4, "recovery": 1, "crc_flit": 250}
    health = read_nvml_health(FakeNvml(cards))
    assert health.cards[0].fabric == FabricState("Completed", "Success", "7", "01020304-0506-0708-090a-0b0c0d0e0f10",
                                                 "Healthy", "Full")
    assert nvlink_domain(health.cards).domain == "01020304-0506-0708-090a-0b0c0d0e0f10"
    first, second = health.nvlinks
    assert [link.counters for link in first.links] == [
        {"Replay Errors": 0, "Recovery Errors": 0, "CRC Errors": 0, "CRC Data Errors": 0}]
    assert [(link.link, link.active, link.errors) for link in second.links] == [(0, True, 255), (1, False, 0)]


def test_an_unjoined_fabric_card_keeps_nvmls_status_words():
    card = copy.deepcopy(h200_dump()["devices"][0])
    card["fabric_info"] = {"state": pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS, "cliqueId": 0,
                           "clusterUuid": bytes(16), "status": pynvml.NVML_ERROR_NOT_READY}
    (read,) = read_nvml_health(FakeNvml([card])).cards
    assert (read.fabric.state, read.fabric.joined) == ("In Progress", False)
    assert read.fabric.status == str(pynvml.NVMLError(pynvml.NVML_ERROR_NOT_READY))
    assert [f.code for f in card_verdict(read).findings] == ["fabric-unjoined"]


def test_the_agent_reads_health_through_nvml_first_and_nvidia_smi_when_nvml_does_not_start(tmp_path):
    from health_support import Tools

    from llmgw.agent.health import HealthReader

    tools = Tools()
    report = HealthReader(tools, sys_root=tmp_path, etc_root=tmp_path, nvml=FakeNvml.h200()).read()
    assert report.source == "nvml" and [c.uuid for c in report.health.cards] == [h200_dump()["devices"][0]["uuid"]]
    assert [c[0] for c in tools.calls] == ["journalctl"]  # no nvidia-smi; the kernel log as before
    broken = FakeNvml([], init_error=pynvml.NVMLError_LibraryNotFound())
    fallback = HealthReader(Tools(), sys_root=tmp_path, etc_root=tmp_path, nvml=broken).read()
    assert fallback.source == "nvidia-smi" and len(fallback.health.cards) == 2


def test_nvlink_counters_rising_past_dcgms_limits_take_the_card_out_between_two_readings(tmp_path):
    from health_support import Tools, counting_clock

    from llmgw.agent.health import HealthReader

    nvml = two_h200s()
    link = nvml.cards[1]["nvlink_states"][0]
    link["errors"] = {"crc_flit": 40}  # since the driver loaded: only a warning, no rate is known yet
    clock, advance = counting_clock()
    reader = HealthReader(Tools(), sys_root=tmp_path, etc_root=tmp_path, nvml=nvml, clock=clock)
    first = reader.read()
    assert [(f.code, str(f.level)) for f in first.health.cards[1].findings] == [("nvlink-errors", "warn")]
    advance(60.0)
    link["errors"] = {"crc_flit": 40 + 600}  # 10 a second: below DCGM's 100/s
    slow = reader.read().health.cards[1]
    assert slow.placeable and "below DCGM's 100/s" in slow.findings[0].message
    advance(60.0)
    link["errors"] = {"crc_flit": 640 + 6000 * 2, "replay": 1}  # 200 a second, and a replay
    failing = reader.read()
    assert failing.unplaceable().keys() == {1}
    assert "link 0: Replay Errors +1; link 0: CRC Errors +12000 (200/s)" in failing.unplaceable()[1]
    assert failing.health.cards[0].placeable
    advance(60.0)  # nothing new: the card comes back
    assert reader.read().unplaceable() == {}
