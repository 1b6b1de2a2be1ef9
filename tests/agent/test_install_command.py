"""InstallEngine over an in-process link: a llama.cpp install from a mirror directory, and refusals."""

from __future__ import annotations

import shutil

import trio

from llmgw.agent import AgentConfig, run_agent
from llmgw.wire import control_message, pb

from agent_support import ControlSide, next_matching


def _body(kind):
    return lambda m: m.WhichOneof("body") == kind


async def test_install_engine_from_a_mirror_reports_progress_and_the_engine_becomes_installed(tmp_path, llama_server_binary):
    mirror = tmp_path / "mirror"
    (mirror / "llama.cpp" / "b2" / "bin").mkdir(parents=True)
    shutil.copy2(llama_server_binary, mirror / "llama.cpp" / "b2" / "bin" / "llama-server")
    config = AgentConfig(node_id="n", state_dir=tmp_path / "state", heartbeat_interval=0.2,
                         cache_dir=tmp_path / "cache")
    control = ControlSide()
    async with trio.open_nursery() as nursery:
        await nursery.start(run_agent, config, control.connect)
        link = await control.links.receive()
        assert list((await link.receive()).register.engines_installed) == []
        await link.send(control_message(command_id="i1", install_engine=pb.InstallEngine(
            engine="llama.cpp", version="b2", mirror=str(mirror))))
        states = []
        with trio.fail_after(60):
            while True:
                message = await link.receive()
                if message.WhichOneof("body") == "engine_status":
                    states.append(message.engine_status.state)
                if message.WhichOneof("body") == "command_result":
                    assert message.command_result.command_id == "i1"
                    assert message.command_result.ok, message.command_result.error
                    break
        assert states[0] == "installing" and states[-1] == "installed"
        assert (tmp_path / "state" / "engines" / "llama.cpp" / "b2" / "installed.json").is_file()
        beat = await next_matching(link, lambda m: _body("heartbeat")(m)
                                   and "llama.cpp@b2" in m.heartbeat.engines_installed)
        assert list(beat.heartbeat.engines_installing) == []

        await link.send(control_message(command_id="i2", install_engine=pb.InstallEngine(engine="sglang", version="0.9")))
        failed = await next_matching(link, lambda m: _body("engine_status")(m) and m.engine_status.state == "failed")
        assert "sglang has no cpu build" in failed.engine_status.error  # this node has no GPU
        assert not (await next_matching(link, _body("command_result"))).command_result.ok

        # vLLM is installable, but an InstallEngine without python_packages is refused with a sentence
        await link.send(control_message(command_id="i3", install_engine=pb.InstallEngine(engine="vllm", version="0.9")))
        failed = await next_matching(link, lambda m: _body("engine_status")(m) and m.engine_status.state == "failed")
        assert "cannot install vllm 0.9: engines.yaml gives it no python_packages" in failed.engine_status.error
        assert not (await next_matching(link, _body("command_result"))).command_result.ok

        await link.send(control_message(command_id="x", request_logs=pb.RequestLogs(request_id="r", lines=100)))
        own = await next_matching(link, _body("log_lines"))
        assert any("installed llama.cpp@b2" in line for line in own.log_lines.lines)  # the agent's own log
        nursery.cancel_scope.cancel()
