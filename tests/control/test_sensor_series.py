"""The machine room's sensors travel from the agent's reading (node_exporter's captured sysfs tree) in a Heartbeat to
the fleet state and out as `llmgw_node_*` series; a sensor the node did not measure has no series (never 0)."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.agent.reporting import Samples, heartbeat_message
from llmgw.agent.sensors import SysfsSensors
from llmgw.control.metrics_fleet import fleet_families
from llmgw.control.registry import FleetRegistry
from llmgw.control.reports import readings_from_heartbeat
from llmgw.plan.types import GpuState, NodeState
from llmgw.tools import GpuSample
from llmgw.tools.sensors import NodeSensors, SensorValue
from llmgw.wire import pb

from support.ttar import extract_fixture

NO_SAMPLES = Samples(None, None, None, None, {})


def scrape(sensors: NodeSensors | None, gpu: GpuSample) -> dict[tuple[str, frozenset], float]:
    beat = heartbeat_message(NO_SAMPLES, [], [], [], now=1000.0, gpus=[pb.GpuSample(**gpu.pb_fields())],
                             sensors=sensors)
    beat = pb.Heartbeat.FromString(beat.SerializeToString())     # as it crosses the wire
    readings = readings_from_heartbeat(beat, 50.0)
    registry = FleetRegistry(lost_after=30.0)
    node = NodeState("g1", gpus=(GpuState("0", "h200-141g", 141 << 30, 141 << 30),), cpu_cores=16.0)
    registry, _ = registry.register(node, 50.0)
    registry, _ = registry.heartbeat("g1", 50.0, readings=readings)
    assert registry.records()[0].readings.sensors == (sensors or NodeSensors())
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in fleet_families(registry, None, 50.0) for s in family.samples}


def test_captured_packages_power_and_hbm_become_series(tmp_path: Path):
    root = extract_fixture("node_exporter/sys-hwmon-powercap.ttar", tmp_path)
    sensors = SysfsSensors(root)
    sensors.read(0.0)
    energy = root / "sys/class/powercap/intel-rapl:0/energy_uj"
    energy.write_text(str(int(energy.read_text()) + 180_000_000))   # 180 J over 2 s
    found = scrape(sensors.read(2.0), GpuSample(0, temperature_celsius=36.0, memory_temperature_celsius=36.0))
    for chip in ("coretemp.0", "coretemp.1"):
        key = ("llmgw_node_cpu_package_temperature_celsius", frozenset({("node", "g1"), ("sensor", chip)}))
        assert found[key] == 55.0
    assert found[("llmgw_node_cpu_package_power_watts",
                  frozenset({("node", "g1"), ("zone", "package-0")}))] == pytest.approx(90.0)
    assert found[("llmgw_gpu_memory_temperature_celsius",
                  frozenset({("node", "g1"), ("gpu", "0"), ("gpu_class", "h200-141g")}))] == 36.0
    # node_exporter's board chip (nct6779) has no temperature input: no inlet series
    assert not any(name == "llmgw_node_inlet_temperature_celsius" for name, _ in found)


def test_an_inlet_is_one_series_per_node():
    inlet = NodeSensors(inlet_celsius=SensorValue("nct6775.656", "SYSTIN", 31.0))
    found = scrape(inlet, GpuSample(0))
    assert found[("llmgw_node_inlet_temperature_celsius", frozenset({("node", "g1")}))] == 31.0


@pytest.mark.parametrize("sensors", [None, NodeSensors()], ids=["older agent", "a VM measuring nothing"])
def test_unmeasured_sensors_have_no_series_never_zero(sensors):
    found = scrape(sensors, GpuSample(0, temperature_celsius=40.0))
    names = {name for name, _ in found}
    assert "llmgw_gpu_temperature_celsius" in names
    assert not names & {"llmgw_node_cpu_package_temperature_celsius", "llmgw_node_cpu_package_power_watts",
                        "llmgw_node_inlet_temperature_celsius", "llmgw_gpu_memory_temperature_celsius"}
