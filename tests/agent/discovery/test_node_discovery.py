"""A whole node: NVML first, nvidia-smi when NVML is missing, topology applied, CPU facts, fabrics as "none"."""

from __future__ import annotations

from pathlib import Path

import pynvml

from captures import capture, variant
from fake_nvml import FakeNvml
from llmgw.agent.discovery import ToolOutput, discover_gpus, discover_node, read_fabrics
from llmgw.agent.inventory import inventory_warnings, parse_cpuinfo
from llmgw.agent.procfs import parse_meminfo
from llmgw.tools import parse_ibstat

NO_NVML = FakeNvml([], init_error=pynvml.NVMLError_DriverNotLoaded())


def tool_outputs(outputs: dict[tuple[str, ...], str]):
    """A `run` that answers from captures; commands not in `outputs` are not installed."""
    calls = []

    def run(argv):
        calls.append(tuple(argv))
        text = outputs.get(tuple(argv))
        return None if text is None else ToolOutput(tuple(argv), 0, text)

    run.calls = calls
    return run


def test_without_nvml_the_h200_is_found_through_nvidia_smi_with_topology():
    run = tool_outputs({
        ("nvidia-smi", "-q", "-x"): capture("nvidia-smi-q-x.xml"),
        ("nvidia-smi", "-L"): capture("nvidia-smi-L.txt"),
        ("nvidia-smi", "topo", "-m"): capture("nvidia-smi-topo-m.txt"),
    })
    report, topology, samples = discover_gpus(nvml=NO_NVML, run=run)
    assert report.source == "nvidia-smi" and report.warnings == ()
    assert "Driver Not Loaded" in report.notes[0]
    assert report.gpus[0].gpu_class == "h200-141g" and report.gpus[0].numa_node == 0
    assert topology.gpu(0).cpu_affinity == "0-15" and samples[0].power_draw_watts == 123.69


def test_nvml_topology_gains_nvlink_peers_from_topo_matrix():
    nvml = FakeNvml([FakeNvml.h200().cards[0] for _ in range(4)])
    run = tool_outputs({("nvidia-smi", "topo", "-m"): variant("topo-4xv100-adapter-columns.txt")})
    report, _, _ = discover_gpus(nvml=nvml, run=run)
    assert [g.nvlink_peers for g in report.gpus] == [("1",), ("0",), ("3",), ("2",)]
    assert run.calls == [("nvidia-smi", "topo", "-m")]      # NVML answered: no nvidia-smi -q


def test_no_driver_and_no_tool_is_a_cpu_node(tmp_path):
    node = discover_node(tmp_path / "weights", nvml=NO_NVML, run=tool_outputs({}), sys_root=tmp_path,
                         etc_root=tmp_path)
    assert node.is_cpu_node and node.topology is None and node.gpus.warnings == ()
    assert node.inventory.cpu.cores > 0 and node.inventory.memory_total_bytes > 0
    assert node.inventory.disk_free_bytes is not None           # measured on the nearest existing parent
    assert node.to_json()["cpu_node"] is True


def test_a_failing_nvidia_smi_is_a_warning_with_its_words(tmp_path):
    def run(argv):
        return ToolOutput(tuple(argv), 9, "NVIDIA-SMI has failed because it couldn't communicate with the driver")

    report, topology, _ = discover_gpus(nvml=NO_NVML, run=run)
    assert report.gpus == () and topology is None
    assert report.warnings == ("nvidia-smi -q -x exited 9: \"NVIDIA-SMI has failed because it couldn't "
                               "communicate with the driver\"",)


def test_h200_cpu_captures_have_avx2_and_memory():
    cpu = parse_cpuinfo(capture("proc-cpuinfo-flags.txt"))
    assert "avx2" in cpu.flags and "amx_tile" in cpu.flags and inventory_warnings("x86_64", cpu) == ()
    assert parse_meminfo(capture("proc-meminfo.txt"))["MemTotal"] == 131981020 * 1024


def test_a_cpu_without_avx2_is_warned_about():
    flags = capture("proc-cpuinfo-flags.txt").replace(" avx2", "").replace(" avx512f", "")
    (warning,) = inventory_warnings("x86_64", parse_cpuinfo(flags))
    assert "no AVX2" in warning and "several times slower" in warning


def test_missing_infiniband_and_imex_mean_none(tmp_path):
    assert parse_ibstat(capture("ibstat.txt")) == ()
    assert parse_ibstat(capture("sminfo.txt")) == ()
    fabrics = read_fabrics(tmp_path, tmp_path)
    assert fabrics.infiniband == () and fabrics.imex is False


def test_infiniband_ports_from_sysfs_and_ibstat(tmp_path):
    port = tmp_path / "class" / "infiniband" / "mlx5_0" / "ports" / "1"
    port.mkdir(parents=True)
    (port / "state").write_text("4: ACTIVE\n")
    (port / "rate").write_text("400 Gb/sec (4X NDR)\n")
    (port / "link_layer").write_text("InfiniBand\n")
    (tmp_path / "nvidia-imex").mkdir()
    fabrics = read_fabrics(tmp_path, tmp_path)
    assert [(p.ca, p.port, p.state, p.rate_gbps) for p in fabrics.infiniband] == [("mlx5_0", 1, "Active", 400.0)]
    assert fabrics.imex
    ibstat = ("CA 'mlx5_0'\n\tCA type: MT4129\n\tNumber of ports: 1\n\tPort 1:\n\t\tState: Active\n"
              "\t\tPhysical state: LinkUp\n\t\tRate: 400\n\t\tLink layer: InfiniBand\n")
    (p,) = parse_ibstat(ibstat)
    assert (p.ca, p.port, p.state, p.rate_gbps, p.link_layer) == ("mlx5_0", 1, "Active", 400.0, "InfiniBand")


def test_infiniband_ports_of_a_real_h100_node_from_sysfs():
    """gpud's capture of /sys/class/infiniband on an H100 node (tests/fixtures/README.md): eight NDR rails and a
    RoCE bond; sysfs carries no LIDs there, so they are None."""
    sys_root = Path(__file__).resolve().parents[2] / "fixtures" / "gpud" / "sys-class-infiniband-h100"
    ports = read_fabrics(sys_root, sys_root).infiniband
    assert [p.ca for p in ports] == [f"mlx5_{i}" for i in (0, 1, 4, 5, 6, 7, 8, 9)] + ["mlx5_bond_0"]
    assert {(p.state, p.physical_state, p.rate_gbps, p.link_layer) for p in ports[:-1]} == {
        ("Active", "LinkUp", 400.0, "InfiniBand")}
    assert (ports[-1].rate_gbps, ports[-1].link_layer) == (200.0, "Ethernet")
    assert all(p.active and p.base_lid is None for p in ports)


def test_sysfs_lids_and_physical_state_are_read_when_present(tmp_path):
    port = tmp_path / "class" / "infiniband" / "mlx5_3" / "ports" / "1"
    port.mkdir(parents=True)
    for name, value in (("state", "1: DOWN"), ("phys_state", "2: Polling"), ("rate", "10 Gb/sec (4X SDR)"),
                        ("link_layer", "InfiniBand"), ("lid", "0xffff"), ("sm_lid", "0x0")):
        (port / name).write_text(value + "\n")
    (p,) = read_fabrics(tmp_path, tmp_path).infiniband
    assert (p.state, p.physical_state, p.base_lid, p.sm_lid, p.active) == ("Down", "Polling", 65535, 0, False)
