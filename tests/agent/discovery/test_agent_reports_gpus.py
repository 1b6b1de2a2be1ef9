"""The running agent reports GPUs: Register carries what NVML says about the card, every Heartbeat its readings.
NVML is the stand-in built from the real H200 captures (nvml-dump.json, load-sample.json), given to `run_agent`."""

from __future__ import annotations

import sys
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/agent: the in-process control side

from agent_support import ControlSide  # noqa: E402
from fake_nvml import FakeNvml, h200_dump, load_readings  # noqa: E402

from llmgw.agent import AgentConfig, run_agent  # noqa: E402


async def _next_heartbeat(link, predicate=lambda beat: True):
    with trio.fail_after(20):
        while True:
            message = await link.receive()
            if message.WhichOneof("body") == "heartbeat" and predicate(message.heartbeat):
                return message.heartbeat


async def test_register_carries_the_h200_and_heartbeats_carry_its_readings(tmp_path):
    readings = load_readings()["under_load"]
    nvml = FakeNvml.h200(readings=readings)
    card = h200_dump()["devices"][0]
    # readings every 3 s (10 s by default, all of the later beat's wait): the first beat, 0.2 s in, still carries
    # the first reading alone, without GPM
    config = AgentConfig(node_id="gpu-node", state_dir=tmp_path / "state", heartbeat_interval=0.2,
                         telemetry_interval=3.0)
    control = ControlSide()
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: run_agent(config, control.connect, nvml=nvml, task_status=task_status))
        link = await control.links.receive()
        register = (await link.receive()).register
        (gpu,) = register.gpus
        assert (gpu.name, gpu.gpu_class, gpu.compute_capability) == ("NVIDIA H200", "h200-141g", "9.0")
        assert gpu.memory_total_bytes == card["memory"]["total"] == 150_754_820_096
        assert gpu.uuid == card["uuid"] and gpu.power_limit_watts == 700.0 and gpu.ecc_enabled
        assert list(gpu.foreign_pids) == []

        first = await _next_heartbeat(link)
        (sample,) = first.gpus
        reading = readings[0]
        assert sample.utilization_percent == reading["gpu"] and sample.temperature_celsius == reading["temp"]
        assert sample.power_draw_watts == reading["power_mW"] / 1000 and sample.power_limit_watts == 700.0
        assert sample.memory_used_bytes == reading["used_MiB"] * 1024**2 and sample.sm_clock_mhz == reading["sm_clock"]
        assert sample.clock_event_reasons == 4                     # software power cap, as captured
        assert sample.HasField("ecc_uncorrected") and sample.ecc_uncorrected == 0   # measured 0 on an ECC card
        # GPM needs two samples a period apart: absent in the first beat, never reported as 0
        assert not sample.HasField("sm_active_percent") and not sample.HasField("tensor_active_percent")

        nvml.advance()  # the card's next captured reading
        later = await _next_heartbeat(link, lambda beat: beat.gpus[0].power_draw_watts == readings[1]["power_mW"] / 1000)
        assert later.gpus[0].utilization_percent == readings[1]["gpu"]
        assert later.gpus[0].HasField("sm_active_percent") and later.gpus[0].HasField("dram_bandwidth_percent")
        nursery.cancel_scope.cancel()
    assert nvml.initialised == 0  # every nvmlInit (discovery, telemetry) was shut down again


async def test_readings_the_card_cannot_give_are_absent_from_the_heartbeat(tmp_path):
    nvml = FakeNvml.h200(ecc_mode=[0, 0], gpm_supported=None)  # ECC off, no GPM
    config = AgentConfig(node_id="gpu-node", state_dir=tmp_path / "state", heartbeat_interval=0.1)
    control = ControlSide()
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: run_agent(config, control.connect, nvml=nvml, task_status=task_status))
        link = await control.links.receive()
        register = (await link.receive()).register
        assert register.gpus[0].gpu_class == "h200-141g" and not register.gpus[0].ecc_enabled
        await _next_heartbeat(link)
        (sample,) = (await _next_heartbeat(link)).gpus  # the second beat: GPM would have two samples by now
        assert sample.HasField("utilization_percent") and sample.HasField("power_draw_watts")
        for name in ("ecc_uncorrected", "sm_active_percent", "sm_occupancy_percent", "tensor_active_percent",
                     "dram_bandwidth_percent"):
            assert not sample.HasField(name), name
        nursery.cancel_scope.cancel()


async def test_a_node_without_nvml_registers_no_gpus(tmp_path):
    import pynvml

    nvml = FakeNvml([], init_error=pynvml.NVMLError_LibraryNotFound())
    config = AgentConfig(node_id="cpu-node", state_dir=tmp_path / "state", heartbeat_interval=0.1)
    control = ControlSide()
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: run_agent(config, control.connect, nvml=nvml, task_status=task_status))
        link = await control.links.receive()
        assert list((await link.receive()).register.gpus) == []
        assert list((await _next_heartbeat(link)).gpus) == []
        nursery.cancel_scope.cancel()
