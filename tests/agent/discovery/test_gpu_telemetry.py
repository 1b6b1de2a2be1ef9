"""GPU telemetry through NVML, on readings the H200 really gave under a matmul load (load-sample.json)."""

from __future__ import annotations

from pathlib import Path

import pynvml

from captures import capture
from fake_nvml import FakeNvml, h200_dump, load_readings
from llmgw.agent.discovery import ToolOutput
from llmgw.agent.telemetry import open_gpu_telemetry, smi_samples
from llmgw.wire import pb

GPM_LOAD = {"NVML_GPM_METRIC_SM_UTIL": 98.7, "NVML_GPM_METRIC_SM_OCCUPANCY": 47.5,
            "NVML_GPM_METRIC_ANY_TENSOR_UTIL": 83.0, "NVML_GPM_METRIC_DRAM_BW_UTIL": 21.25}


def test_samples_follow_the_captured_load_readings():
    readings = load_readings()["under_load"]
    nvml = FakeNvml.h200(readings=readings)
    with open_gpu_telemetry(nvml) as telemetry:
        got = []
        for _ in readings:
            (sample,) = telemetry.sample()
            got.append(sample)
            nvml.advance()
    assert [s.utilization_percent for s in got] == [r["gpu"] for r in readings]
    assert [s.power_draw_watts for s in got] == [r["power_mW"] / 1000 for r in readings]
    assert [s.sm_clock_mhz for s in got] == [r["sm_clock"] for r in readings]
    assert {s.clock_event_reasons for s in got} == {4}                      # software power cap
    assert {s.memory_used_bytes for s in got} == {1625 * 1024**2}
    assert got[0].temperature_celsius == 56.0 and got[0].power_limit_watts == 700.0
    assert got[0].ecc_uncorrected == 0 and telemetry.warnings == []
    assert nvml.initialised == 0


def test_gpm_needs_two_samples_and_then_reports_the_period_between():
    nvml = FakeNvml.h200(gpm_readings=[h200_dump()["devices"][0]["gpm_idle"], GPM_LOAD])
    with open_gpu_telemetry(nvml) as telemetry:
        (first,) = telemetry.sample()
        (second,) = telemetry.sample()
    assert first.sm_active_percent is None and first.tensor_active_percent is None     # absent, not 0
    assert (second.sm_active_percent, second.sm_occupancy_percent, second.tensor_active_percent,
            second.dram_bandwidth_percent) == (98.7, 47.5, 83.0, 21.25)
    assert nvml.gpm_freed == 2                       # the older sample each period, the last one on close


def test_idle_gpm_reads_zero_where_the_card_said_zero():
    nvml = FakeNvml.h200()
    with open_gpu_telemetry(nvml) as telemetry:
        telemetry.sample()
        (sample,) = telemetry.sample()
    assert sample.sm_active_percent == 0.0 and sample.dram_bandwidth_percent == 0.00037408468578571446


def test_cards_without_gpm_or_ecc_leave_those_absent():
    nvml = FakeNvml.h200(gpm_supported=None, ecc_mode=[0, 0])
    with open_gpu_telemetry(nvml) as telemetry:
        telemetry.sample()
        (sample,) = telemetry.sample()
    assert sample.sm_active_percent is None and sample.ecc_uncorrected is None
    assert sample.utilization_percent == 0.0 and telemetry.warnings == []


def test_a_failing_reading_is_absent_and_warned_once():
    nvml = FakeNvml.h200(fail={"nvmlDeviceGetPowerUsage": pynvml.NVMLError_GpuIsLost()})
    with open_gpu_telemetry(nvml) as telemetry:
        samples = [telemetry.sample()[0] for _ in range(3)]
    assert {s.power_draw_watts for s in samples} == {None}
    assert telemetry.warnings == ["NVML: nvmlDeviceGetPowerUsage on GPU 0 failed: GPU is lost"]


def test_no_nvml_samples_nothing():
    with open_gpu_telemetry(FakeNvml([], init_error=pynvml.NVMLError_LibraryNotFound())) as telemetry:
        assert telemetry.sample() == () and not telemetry.available
    assert open_gpu_telemetry(None).sample() == ()


def test_samples_become_wire_messages_with_unmeasured_values_absent():
    with open_gpu_telemetry(FakeNvml.h200()) as telemetry:
        (sample,) = telemetry.sample()
    message = pb.GpuSample(**sample.pb_fields())
    assert message.power_draw_watts == 77.743 and message.HasField("utilization_percent")
    assert not message.HasField("sm_active_percent")


def test_nvidia_smi_fallback_samples():
    def run(argv):
        return ToolOutput(tuple(argv), 0, capture("nvidia-smi-q-x-after-load.xml"))

    (sample,) = smi_samples(run)
    assert sample.power_limit_watts == 700.0 and sample.power_draw_watts is not None
    assert smi_samples(lambda argv: None) == ()


def test_hbm_temperature_comes_from_nvmls_memory_temperature_field():
    with open_gpu_telemetry(FakeNvml.h200()) as telemetry:
        (sample,) = telemetry.sample()
    assert sample.memory_temperature_celsius == 36.0 and telemetry.warnings == []
    assert pb.GpuSample(**sample.pb_fields()).memory_temperature_celsius == 36.0


def test_a_card_without_a_memory_sensor_leaves_hbm_temperature_absent():
    with open_gpu_telemetry(FakeNvml.h200(memory_temp_c=None)) as telemetry:
        (sample,) = telemetry.sample()
    assert sample.memory_temperature_celsius is None and telemetry.warnings == []
    assert not pb.GpuSample(**sample.pb_fields()).HasField("memory_temperature_celsius")


def test_nvidia_smi_fallback_reads_hbm_temperature_where_the_card_prints_it():
    (h200,) = smi_samples(lambda argv: ToolOutput(tuple(argv), 0, capture("nvidia-smi-q-x.xml")))
    assert h200.memory_temperature_celsius == 36.0          # "<memory_temp>36 C</memory_temp>"
    gddr = (Path(__file__).resolve().parents[2] / "fixtures" / "telegraf" / "rtx-3080-v13.xml").read_text()
    (rtx,) = smi_samples(lambda argv: ToolOutput(tuple(argv), 0, gddr))
    assert rtx.memory_temperature_celsius is None            # GDDR boards print "N/A"
