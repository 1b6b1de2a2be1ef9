"""Installed engines are checked again periodically: an install that breaks after it was verified (a shared library
deleted, the binary removed) leaves engines_installed in the next heartbeat, with a warning saying why."""

from __future__ import annotations

import logging
import shutil
import subprocess

import pytest
import trio

from llmgw.agent import AgentConfig, run_agent
from llmgw.wire import control_message, pb

from agent_support import ControlSide, next_matching, wait_for

STUB_LIBRARY = "libllmgwstub.so"
MAIN_C = r"""
#include <stdio.h>
#include <string.h>
int stub_answer(void);
int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--version") == 0) {
        fprintf(stderr, "version: 7 (stub %d)\n", stub_answer());
        return 0;
    }
    return 3;
}
"""


def dynamic_llama_server(mirror, version: str):
    """A mirror holding `llama.cpp/<version>/bin/llama-server`: a real dynamically linked executable that needs
    the shared library beside it (found through its $ORIGIN rpath), as a CUDA or shared-library build does."""
    bin_dir = mirror / "llama.cpp" / version / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "stub.c").write_text("int stub_answer(void) { return 42; }\n")
    (bin_dir / "main.c").write_text(MAIN_C)
    subprocess.run(["cc", "-shared", "-fPIC", "-o", STUB_LIBRARY, "stub.c"], cwd=bin_dir, check=True)
    subprocess.run(["cc", "-o", "llama-server", "main.c", "-L.", "-lllmgwstub", "-Wl,-rpath,$ORIGIN"],
                   cwd=bin_dir, check=True)
    for source in ("stub.c", "main.c"):
        (bin_dir / source).unlink()
    return mirror


def _config(tmp_path, **changes) -> AgentConfig:
    values = dict(node_id="n", state_dir=tmp_path / "state", engines_dir=tmp_path / "engines",
                  cache_dir=tmp_path / "cache", heartbeat_interval=0.1, engine_check_interval=0.3)
    values.update(changes)
    return AgentConfig(**values)


async def _install(link, mirror, version: str) -> None:
    await link.send(control_message(command_id=f"install-{version}", install_engine=pb.InstallEngine(
        engine="llama.cpp", version=version, mirror=str(mirror))))
    result = await next_matching(link, lambda m: m.WhichOneof("body") == "command_result")
    assert result.command_result.ok, result.command_result.error


def _beat_with(key: str, present: bool):
    return lambda m: (m.WhichOneof("body") == "heartbeat"
                      and (key in m.heartbeat.engines_installed) == present)


@pytest.mark.skipif(shutil.which("cc") is None or shutil.which("ldd") is None, reason="needs a C compiler and ldd")
async def test_an_install_whose_shared_library_is_deleted_leaves_engines_installed_with_a_warning(tmp_path, caplog):
    mirror = dynamic_llama_server(tmp_path / "mirror", "b7")
    control = ControlSide()
    caplog.set_level(logging.INFO, logger="llmgw.agent")
    async with trio.open_nursery() as nursery:
        agent = await nursery.start(run_agent, _config(tmp_path), control.connect)
        link = await control.links.receive()
        await _install(link, mirror, "b7")
        await next_matching(link, _beat_with("llama.cpp@b7", True))

        # a working install survives the periodic checks
        checks = agent.engine_checks.checks
        await wait_for(lambda: agent.engine_checks.checks >= checks + 2)
        await next_matching(link, _beat_with("llama.cpp@b7", True))
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]

        # a package upgrade removes the library: still a marked install with its binary, but it cannot run
        (tmp_path / "engines" / "llama.cpp" / "b7" / "bin" / STUB_LIBRARY).unlink()
        failed = await next_matching(link, lambda m: m.WhichOneof("body") == "engine_status")
        assert (failed.engine_status.engine, failed.engine_status.state) == ("llama.cpp@b7", "failed")
        assert f"needs shared libraries this node lacks: {STUB_LIBRARY}" in failed.engine_status.error
        await next_matching(link, _beat_with("llama.cpp@b7", False))
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "llama.cpp@b7 no longer works" in warnings[0] and STUB_LIBRARY in warnings[0]

        # warned once, not at every check; a new agent's Register leaves it out too
        checks = agent.engine_checks.checks
        await wait_for(lambda: agent.engine_checks.checks >= checks + 2)
        assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1
        await link.aclose()
        again = await control.links.receive()
        assert "llama.cpp@b7" not in (await again.receive()).register.engines_installed

        # installing it again brings it back
        await _install(again, mirror, "b7")
        await next_matching(again, _beat_with("llama.cpp@b7", True))
        nursery.cancel_scope.cancel()


async def test_a_deleted_binary_is_found_at_the_next_check_and_said_why(tmp_path, caplog):
    mirror = tmp_path / "mirror"
    bin_dir = mirror / "llama.cpp" / "b8" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "llama-server").write_text("#!/bin/sh\n[ \"$1\" = --version ] && echo 'version: 8 (sh)' && exit 0\nexit 3\n")
    (bin_dir / "llama-server").chmod(0o755)
    control = ControlSide()
    caplog.set_level(logging.INFO, logger="llmgw.agent")
    async with trio.open_nursery() as nursery:
        await nursery.start(run_agent, _config(tmp_path, engine_check_interval=0.2), control.connect)
        link = await control.links.receive()
        await _install(link, mirror, "b8")
        await next_matching(link, _beat_with("llama.cpp@b8", True))
        binary = tmp_path / "engines" / "llama.cpp" / "b8" / "bin" / "llama-server"
        binary.unlink()
        failed = await next_matching(link, lambda m: m.WhichOneof("body") == "engine_status")
        assert failed.engine_status.state == "failed" and failed.engine_status.error == f"{binary} is missing"
        await next_matching(link, _beat_with("llama.cpp@b8", False))
        assert any(r.levelno == logging.WARNING and "llama.cpp@b8 no longer works" in r.getMessage()
                   and "is missing" in r.getMessage() for r in caplog.records)
        assert not (tmp_path / "engines" / "llama.cpp" / "b8" / "installed.json").exists()  # InstallEngine redoes it
        nursery.cancel_scope.cancel()


async def test_the_check_runs_at_start_so_a_broken_install_is_never_registered(tmp_path):
    home = tmp_path / "engines" / "llama.cpp" / "b9"
    (home / "bin").mkdir(parents=True)
    (home / "bin" / "llama-server").write_text("#!/bin/sh\nexit 1\n")  # was fine once; now fails --version
    (home / "bin" / "llama-server").chmod(0o755)
    (home / "installed.json").write_text("{}")
    control = ControlSide()
    async with trio.open_nursery() as nursery:
        await nursery.start(run_agent, _config(tmp_path, engine_check_interval=600), control.connect)
        link = await control.links.receive()
        assert list((await link.receive()).register.engines_installed) == []
        nursery.cancel_scope.cancel()
