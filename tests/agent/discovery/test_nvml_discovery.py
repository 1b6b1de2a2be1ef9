"""Discovery through NVML, driven by a stand-in built from the real H200's NVML answers."""

from __future__ import annotations

import copy

import pynvml

from fake_nvml import FakeNvml, h200_dump, load_readings
from llmgw.agent.discovery import read_nvml


def test_h200_is_one_placeable_card_with_the_captured_facts():
    nvml = FakeNvml.h200()
    report = read_nvml(nvml)
    assert report.source == "nvml" and report.warnings == ()
    assert report.driver_version == "580.159.04" and report.cuda_version == "13.0"
    (gpu,) = report.gpus
    assert gpu.device_id == "0" and gpu.uuid == "GPU-050bda45-960a-207c-573e-20129c535d06"
    assert gpu.gpu_class == "h200-141g" and gpu.name == "NVIDIA H200"
    assert (gpu.memory_total_bytes, gpu.memory_used_bytes, gpu.memory_free_bytes) == (
        150754820096, 644939776, 150109880320)
    assert gpu.compute_capability == "9.0"
    assert (gpu.pcie_gen_current, gpu.pcie_gen_max, gpu.pcie_gen_device_max) == (5, 5, 5)
    assert (gpu.pcie_width_current, gpu.pcie_width_max) == (16, 16)
    assert gpu.mig_enabled is False and gpu.ecc_enabled is True and gpu.power_limit_watts == 700.0
    assert gpu.numa_node is None          # NVML said NotSupported in that VM: absent, no warning
    assert gpu.pci_bus_id == "00000000:00:06.0"
    assert gpu.placeable and report.placeable == (gpu,)
    assert nvml.initialised == 0           # shut down again


def test_a_process_we_did_not_start_makes_the_card_not_placeable():
    processes = load_readings()["processes"]          # pid 522, the matmul load
    report = read_nvml(FakeNvml.h200(processes=processes))
    assert report.gpus[0].foreign_pids == (522,) and not report.gpus[0].placeable
    assert read_nvml(FakeNvml.h200(processes=processes), our_pids={522}).gpus[0].placeable


def test_no_nvml_library_is_a_cpu_node_not_an_error():
    report = read_nvml(FakeNvml([], init_error=pynvml.NVMLError_LibraryNotFound()))
    assert report.source == "none" and report.gpus == () and report.warnings == ()
    assert "NVML Shared Library Not Found" in report.notes[0]
    assert read_nvml(None).notes == ("NVML: nvidia-ml-py (pynvml) is not installed",)


def test_a_failing_nvml_call_leaves_the_field_absent_and_says_so():
    nvml = FakeNvml.h200(fail={"nvmlDeviceGetMemoryInfo": pynvml.NVMLError_GpuIsLost()})
    report = read_nvml(nvml)
    gpu = report.gpus[0]
    assert gpu.memory_total_bytes is None and gpu.gpu_class is None and not gpu.placeable
    assert report.warnings == ("NVML: nvmlDeviceGetMemoryInfo on GPU 0 failed: GPU is lost",)


def _a100_with_mig() -> dict:
    card = copy.deepcopy(h200_dump()["devices"][0])
    card.update(name="NVIDIA A100-SXM4-80GB", uuid="GPU-a100", cc=[8, 0], mig_mode=[1, 1], max_mig=7,
                memory={"total": 85899345920, "free": 85899345920, "used": 0}, power_limit_mw=400000,
                processes=[], mig_devices=[
                    {"name": "NVIDIA A100-SXM4-80GB MIG 3g.40gb", "uuid": "MIG-11111111-aaaa",
                     "memory": {"total": 42144366592, "free": 42130735104, "used": 13631488}, "processes": []},
                    None,  # an empty slot answers NotFound
                    {"name": "NVIDIA A100-SXM4-80GB MIG 2g.20gb", "uuid": "MIG-22222222-bbbb",
                     "memory": {"total": 20937965568, "free": 19679674368, "used": 1258291200},
                     "processes": [{"pid": 4242, "used": 1244659712}]},
                ])
    return card


def test_each_mig_instance_is_a_device_with_its_own_class_and_memory():
    report = read_nvml(FakeNvml([_a100_with_mig()]))
    card, first, second = report.gpus
    assert card.mig_enabled and not card.placeable       # a split card is placed through its instances
    assert (first.device_id, first.gpu_class, first.memory_total_bytes) == (
        "MIG-11111111-aaaa", "a100-80g-mig-3g.40gb", 42144366592)
    assert first.is_mig_instance and first.parent_uuid == "GPU-a100" and first.placeable
    assert second.gpu_class == "a100-80g-mig-2g.20gb" and second.foreign_pids == (4242,)
    assert report.placeable == (first,) and report.warnings == ()


def test_nvlink_peers_are_named_by_device_id():
    cards = [copy.deepcopy(h200_dump()["devices"][0]) for _ in range(2)]
    cards[1]["pci"] = dict(cards[1]["pci"], busId="00000000:00:07.0")
    cards[0]["nvlink_states"] = [{"active": 1, "remote": b"00000000:00:07.0"}, {"active": 0, "remote": b""}]
    cards[1]["nvlink_states"] = [{"active": 1, "remote": b"00000000:00:06.0"}]
    report = read_nvml(FakeNvml(cards))
    assert [g.nvlink_peers for g in report.gpus] == [("1",), ("0",)]


def test_pb_fields_build_a_wire_gpu():
    from llmgw.wire import pb

    gpu = read_nvml(FakeNvml.h200()).gpus[0]
    message = pb.Gpu(**gpu.pb_fields())
    assert message.gpu_class == "h200-141g" and message.power_limit_watts == 700.0
    assert not message.HasField("numa_node")               # unknown stays absent on the wire
