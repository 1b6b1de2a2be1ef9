"""GPU health end to end: a real control plane and an in-process agent (NVML stand-in from the H200 captures,
nvidia-smi -q -x the H200 capture, the kernel log through an injected journalctl). An Xid 79 takes the card out of
placement with its reason in "unplaced" and in the nodes document; when it no longer counts, the replica is placed."""

from __future__ import annotations

import sys
from pathlib import Path

import trio

from llmgw.agent import run_agent
from llmgw.agent.discovery import ToolOutput
from llmgw.agent.health import HealthReader
from llmgw.control import ControlConfig, ControlPlane

from .conftest import stand_in_agent
from .test_fleet_readings import gpu_repo, unplaced_reasons
from .test_in_process_fleet import wait_for

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "agent" / "discovery"))
from captures import capture  # noqa: E402
from fake_nvml import FakeNvml  # noqa: E402

XID_79 = ("2026-11-24T12:00:09+00:00 h200 kernel: NVRM: Xid (PCI:0000:00:06): 79, pid='<unknown>', "
          "name=<unknown>, GPU has fallen off the bus.")


async def test_an_xid_79_keeps_the_card_out_of_placement_with_its_reason_until_it_clears(
    tmp_path, weights_mirror, fake_engine,
):
    mirror, sha = weights_mirror
    journal = [XID_79]
    now = [0.0]

    def run(argv):
        if argv[0] == "nvidia-smi":
            return ToolOutput(tuple(argv), 0, capture("nvidia-smi-q-x.xml"))
        if argv[0] == "journalctl":
            return ToolOutput(tuple(argv), 0, (journal.pop(0) + "\n-- cursor: s=1") if journal else "")
        return None

    reader = HealthReader(run, sys_root=tmp_path, etc_root=tmp_path, xid_hold=60.0, interval=0.3,
                          clock=lambda: now[0])
    plane = ControlPlane(ControlConfig(repo=str(gpu_repo(tmp_path, sha)), state_dir=tmp_path / "state"))
    async with trio.open_nursery() as nursery:
        await nursery.start(plane.run)
        agent = stand_in_agent("gpu1", tmp_path / "agent", mirror, fake_engine)
        await nursery.start(lambda task_status: run_agent(agent, plane.local_connector(), nvml=FakeNvml.h200(),
                                                          health=reader, task_status=task_status))
        await wait_for(lambda: "out of placement for health (GPU 0: Xid 79" in unplaced_reasons(plane), 20,
                       "big-0 unplaced: the card fell off the bus", lambda: plane.status())
        node = plane.status()["nodes"]["gpu1"]
        card = node["health"]["cards"][0]
        assert card["placeable"] is False and card["findings"][0]["code"] == "xid"
        assert node["health"]["source"] == "nvidia-smi"

        now[0] = 120.0  # past the hold: the next reading (every 0.3 s here) no longer counts the Xid
        await wait_for(lambda: plane.snapshot().fleet.get("gpu1").state.gpus[0].unhealthy == "", 20,
                       "the card is back", lambda: plane.status())
        await wait_for(lambda: not unplaced_reasons(plane), 20, "big-0 placed", lambda: plane.status())
        nursery.cancel_scope.cancel()

