"""An InstallEngine that names a path, or that meets an OSError, fails as that install and nothing more: the agent
keeps running, its other installs stay, and the failure carries the reason (issue 19, item 5)."""

from __future__ import annotations

from pathlib import Path

import trio

from llmgw.agent import AgentConfig, run_agent
from llmgw.wire import control_message, pb

from agent_support import ControlSide, next_matching

FAKE_SERVER = b"#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'version: 4242 (test)' >&2; exit 0; fi\nexit 3\n"


def _server_at(root: Path) -> None:
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "llama-server").write_bytes(FAKE_SERVER)
    (root / "bin" / "llama-server").chmod(0o755)


def _body(kind):
    return lambda m: m.WhichOneof("body") == kind


async def _install(link, command_id: str, version: str, mirror: Path) -> pb.CommandResult:
    await link.send(control_message(command_id=command_id, install_engine=pb.InstallEngine(
        engine="llama.cpp", version=version, mirror=str(mirror))))
    return (await next_matching(link, lambda m: _body("command_result")(m)
                                and m.command_result.command_id == command_id)).command_result


async def test_an_install_of_version_dot_dot_fails_and_the_agent_and_its_engines_stay(tmp_path: Path) -> None:
    mirror = tmp_path / "mirror"
    _server_at(mirror)  # what `<mirror>/llama.cpp/../bin/llama-server` finds
    _server_at(mirror / "llama.cpp" / "b1")
    config = AgentConfig(node_id="n", state_dir=tmp_path / "state", heartbeat_interval=0.2,
                         cache_dir=tmp_path / "cache")
    control = ControlSide()
    async with trio.open_nursery() as nursery:
        await nursery.start(run_agent, config, control.connect)
        link = await control.links.receive()
        await link.receive()  # register
        assert (await _install(link, "i1", "b1", mirror)).ok
        result = await _install(link, "i2", "..", mirror)
        assert not result.ok and "refusing to install llama.cpp version '..'" in result.error
        assert (tmp_path / "state" / "engines" / "llama.cpp" / "b1" / "installed.json").is_file()
        beat = await next_matching(link, _body("heartbeat"))
        assert "llama.cpp@b1" in beat.heartbeat.engines_installed
        nursery.cancel_scope.cancel()


async def test_an_oserror_during_an_install_is_that_install_failure_and_the_agent_keeps_running(tmp_path: Path) -> None:
    mirror = tmp_path / "mirror"
    _server_at(mirror / "llama.cpp" / "b2")
    engines = tmp_path / "engines"
    engines.write_text("a file where the engines directory should be")
    config = AgentConfig(node_id="n", state_dir=tmp_path / "state", heartbeat_interval=0.2,
                         cache_dir=tmp_path / "cache", engines_dir=str(engines))
    control = ControlSide()
    async with trio.open_nursery() as nursery:
        await nursery.start(run_agent, config, control.connect)
        link = await control.links.receive()
        await link.receive()  # register
        result = await _install(link, "i1", "b2", mirror)
        assert not result.ok and "Not a directory" in result.error, result.error
        await next_matching(link, _body("heartbeat"))  # still alive after the failure
        nursery.cancel_scope.cancel()
