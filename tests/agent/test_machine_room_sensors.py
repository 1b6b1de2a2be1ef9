"""The agent's machine-room sensors read from real captured sysfs trees (prometheus/node_exporter's and
prometheus/procfs's fixtures, tests/fixtures/README.md) and a hand-made RAPL counter wrap: CPU package
temperatures from coretemp, RAPL package power from two readings of the energy counter, the inlet only where a
label names it, and nothing at all (absent, never 0) where the trees are missing, as on this machine (a VM)."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from agent_support import ControlSide, next_matching
from nvml_support import two_h200s

from llmgw.agent import AgentConfig, run_agent
from llmgw.agent.readings import Readings
from llmgw.agent.sensors import SysfsSensors
from llmgw.agent.telemetry import open_gpu_telemetry
from llmgw.tools.sensors import (
    HwmonChip, HwmonTemp, NodeSensors, RaplCounter, SensorValue, energy_watts, inlet_temperature, parse_hwmon_chip,
)

from support.ttar import extract_fixture

NODE_EXPORTER = "node_exporter/sys-hwmon-powercap.ttar"
PROCFS = "procfs/sys-powercap.ttar"
ENERGY_UJ = 240422366267          # both captures' intel-rapl:0/energy_uj
MAX_RANGE_UJ = 262143328850       # their max_energy_range_uj


@pytest.fixture
def node_exporter(tmp_path: Path) -> Path:
    return extract_fixture(NODE_EXPORTER, tmp_path)


def test_coretemp_packages_are_read_per_chip_even_when_both_say_physical_id_0(node_exporter):
    got = SysfsSensors(node_exporter).read(0.0)
    assert got.cpu_package_celsius == (SensorValue("coretemp.0", "Physical id 0", 55.0),
                                       SensorValue("coretemp.1", "Physical id 0", 55.0))


def test_the_capture_has_no_inlet_the_boards_nct6779_carries_only_fans_and_voltages(node_exporter):
    sensors = SysfsSensors(node_exporter)
    chips = {c.device: c for c in sensors.chips()}
    assert chips["nct6775.656"] == HwmonChip("nct6775.656", "nct6779", ())
    # the wifi chips' unlabelled temp1, the bogus chip's "Physical id 0" on a non-temp input and hwmon4's
    # "foosensor"s are no CPU package and no inlet
    assert sensors.read(0.0).inlet_celsius is None
    assert chips["hwmon4"].temps == (HwmonTemp("foosensor", 55.0), HwmonTemp("foosensor", 54.0))


def test_an_inlet_is_the_input_its_label_names_in_order_of_preference():
    # labels as the kernel's drivers write them: nct6775-core.c's "SYSTIN", dell-smm-hwmon's "Ambient"
    board = parse_hwmon_chip("nct6775.656", {"name": "nct6779\n", "temp1_input": "31000\n", "temp1_label": "SYSTIN\n",
                                             "temp2_input": "45000\n", "temp2_label": "CPUTIN\n"})
    dell = parse_hwmon_chip("dell_smm", {"name": "dell_smm", "temp1_input": "27000", "temp1_label": "Ambient",
                                         "temp2_input": "oops", "temp2_label": "Other"})
    assert inlet_temperature([board]) == SensorValue("nct6775.656", "SYSTIN", 31.0)
    assert inlet_temperature([board, dell]) == SensorValue("dell_smm", "Ambient", 27.0)
    assert dell.temps == (HwmonTemp("Ambient", 27.0),)     # an input reading garbage is left out, never 0
    unlabelled = parse_hwmon_chip("it87.656", {"name": "it8728", "temp1_input": "30000"})
    assert unlabelled.temps == (HwmonTemp("temp1", 30.0),) and inlet_temperature([unlabelled]) is None


def test_amd_packages_prefer_tdie_to_tctl():
    zen = parse_hwmon_chip("0000:00:18.3", {"name": "k10temp", "temp1_input": "67250", "temp1_label": "Tctl",
                                            "temp2_input": "40250", "temp2_label": "Tdie"})
    only_tctl = parse_hwmon_chip("0000:00:18.3", {"name": "k10temp", "temp1_input": "52125", "temp1_label": "Tctl"})
    from llmgw.tools.sensors import cpu_package_temperatures
    assert cpu_package_temperatures([zen, only_tctl]) == (SensorValue("0000:00:18.3", "Tdie", 40.25),
                                                          SensorValue("0000:00:18.3", "Tctl", 52.125))


def test_rapl_power_needs_two_readings_and_counts_only_package_zones(node_exporter):
    sensors = SysfsSensors(node_exporter)
    assert sensors.read(100.0).cpu_package_watts == ()              # one counter reading: no power yet
    zone = node_exporter / "sys/class/powercap/intel-rapl:0"
    (zone / "energy_uj").write_text(f"{ENERGY_UJ + 2_500_000}\n")  # 2.5 J later
    (zone.parent / "intel-rapl:0:0" / "energy_uj").write_text("1\n")  # the core sub-zone is not counted again
    got = sensors.read(110.0)
    assert got.cpu_package_watts == (SensorValue("package-0", "intel-rapl:0", pytest.approx(0.25)),)


def test_procfs_capture_zones_each_count_including_an_odd_zone_name(tmp_path):
    root = extract_fixture(PROCFS, tmp_path) / "fixtures"
    sensors = SysfsSensors(root)
    assert [(c.zone, c.name) for c in sensors.counters()] == [("intel-rapl:0", "package-0"),
                                                              ("intel-rapl:a", "package-10")]
    sensors.read(0.0)
    for zone in ("intel-rapl:0", "intel-rapl:a"):
        (root / "sys/class/powercap" / zone / "energy_uj").write_text(str(ENERGY_UJ + 90_000_000))
    got = sensors.read(1.0)
    assert [(v.sensor, v.value) for v in got.cpu_package_watts] == [("package-0", 90.0), ("package-10", 90.0)]
    assert got.cpu_package_celsius == () and got.inlet_celsius is None     # no hwmon in this tree: absent


def test_a_counter_that_wraps_past_max_energy_range_still_gives_the_energy_used():
    # hand-made: 1 J before the wrap and 3 J after it, 2 s apart -> 4 J / 2 s
    before = RaplCounter("intel-rapl:0", "package-0", MAX_RANGE_UJ - 1_000_000, MAX_RANGE_UJ)
    after = RaplCounter("intel-rapl:0", "package-0", 3_000_000, MAX_RANGE_UJ)
    assert energy_watts(before, after, 2.0) == pytest.approx(2.0)
    assert energy_watts(before, RaplCounter("intel-rapl:0", "package-0", 3_000_000, None), 2.0) == pytest.approx(2.0)
    unknown = RaplCounter("intel-rapl:0", "package-0", 5_000_000, None)
    assert energy_watts(unknown, RaplCounter("intel-rapl:0", "package-0", 3_000_000, None), 2.0) is None
    assert energy_watts(after, after, 0.0) is None


def test_a_wrap_read_from_files_gives_the_same(node_exporter):
    zone = node_exporter / "sys/class/powercap/intel-rapl:0"
    (zone / "energy_uj").write_text(f"{MAX_RANGE_UJ - 1_000_000}\n")
    sensors = SysfsSensors(node_exporter)
    sensors.read(0.0)
    (zone / "energy_uj").write_text("3000000\n")
    assert sensors.read(2.0).cpu_package_watts[0].value == pytest.approx(2.0)


def test_an_unreadable_energy_counter_is_absent_not_zero(node_exporter):
    zone = node_exporter / "sys/class/powercap/intel-rapl:0"
    sensors = SysfsSensors(node_exporter)
    sensors.read(0.0)
    (zone / "energy_uj").unlink()       # what a non-root agent meets on kernels that keep energy_uj for root
    (zone / "energy_uj").mkdir()        # (the tests run as root: a directory cannot be read as a file either)
    assert sensors.read(1.0).cpu_package_watts == ()
    assert sensors.counters()[0].energy_uj is None


def test_a_machine_without_hwmon_or_powercap_measures_nothing(tmp_path):
    (tmp_path / "sys" / "class" / "net").mkdir(parents=True)
    got = SysfsSensors(tmp_path).read(0.0)
    assert got == NodeSensors() and not got.measured


def test_this_machine_reports_only_what_its_sys_holds():
    """This machine is a VM without /sys/class/hwmon or /sys/class/powercap: the agent reports nothing here. (On
    a machine with the trees, every value reported names a chip or zone found there.)"""
    got = SysfsSensors().read(0.0)
    hwmon, powercap = Path("/sys/class/hwmon"), Path("/sys/class/powercap")
    if not hwmon.exists() and not powercap.exists():
        assert got == NodeSensors()
    else:
        assert got.cpu_package_watts == ()      # first read: power needs a second one
        chips = {c.device for c in SysfsSensors().chips()}
        assert {v.sensor for v in got.cpu_package_celsius} <= chips


async def test_each_reading_carries_the_sensors(node_exporter, autojump_clock):
    readings = Readings(open_gpu_telemetry(None), dict, lambda: 5.0, trio.Event, tuple,
                        smi=tuple, sensors=SysfsSensors(node_exporter))
    reading = await readings.take()
    assert [v.sensor for v in reading.sensors.cpu_package_celsius] == ["coretemp.0", "coretemp.1"]


async def test_a_real_agent_on_this_machine_sends_its_sensors_with_each_heartbeat(tmp_path):
    """The agent as it runs (its default reader of this machine's /sys): every heartbeat carries `sensors`, so a
    control plane tells "measured nothing here" (this VM) from an older agent; the cards' HBM temperatures ride in
    each GpuSample."""
    config = AgentConfig(node_id="vm-node", state_dir=tmp_path / "state", heartbeat_interval=0.1,
                         telemetry_interval=0.1)
    control = ControlSide()
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: run_agent(config, control.connect, nvml=two_h200s(),
                                                          task_status=task_status))
        link = await control.links.receive()
        beat = (await next_matching(link, lambda m: m.WhichOneof("body") == "heartbeat" and m.heartbeat.gpus)).heartbeat
        nursery.cancel_scope.cancel()
    assert beat.HasField("sensors")
    assert [g.memory_temperature_celsius for g in beat.gpus] == [36.0, 36.0]
    if not Path("/sys/class/hwmon").exists() and not Path("/sys/class/powercap").exists():   # this VM
        assert not beat.sensors.cpu_package_celsius and not beat.sensors.cpu_package_watts
        assert not beat.sensors.HasField("inlet_celsius")
