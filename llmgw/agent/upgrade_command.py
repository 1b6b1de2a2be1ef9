"""The agent's handler of UpgradeAgent (`llmgw.agent.commands`): a release in pieces, then install and re-exec.

Each piece is answered once written (`llmgw.agent.upgrading.receive_piece`); the last one is answered once the
release is verified and installed beside the running one and `current` points at it (a task of the agent's
nursery: the install takes up to a minute and the connection goes on meanwhile). After that answer the agent asks
its runtime to restart: `llmgw agent` re-executes itself from the new version (`upgrading.reexec_argv`). A failure
is the answer's sentence, and the agent goes on with the version it runs.
"""

from __future__ import annotations

import logging
import sys

import trio

from llmgw.agent import upgrading
from llmgw.agent.node import Command, NodeAgent
from llmgw.errors import InstallError, ReleaseError
from llmgw.wire import pb

log = logging.getLogger("llmgw.agent")

NOT_LAID_OUT = ("this agent does not run from a release installed as `llmgw node add` installs it (/opt/llmgw/"
                "<version> with a `current` link), so it cannot upgrade itself: upgrade it where it was installed")


async def upgrade_agent(agent: NodeAgent, command: Command) -> None:
    """UpgradeAgent: write one piece; on the last, install (a task) and restart into the new version. A
    checkpoint."""
    body: pb.UpgradeAgent = command.body
    layout = agent.upgrade_layout()
    if layout is None:
        agent.result(command.id, NOT_LAID_OUT)
        return
    try:
        agent.transfer = await trio.to_thread.run_sync(
            upgrading.receive_piece, agent.transfer, agent.config.state_dir, body.version, body.offset, body.data)
    except (ReleaseError, OSError) as exc:
        agent.transfer = None
        agent.result(command.id, str(exc))
        return
    if not body.last:
        agent.result(command.id)
        return
    transfer, agent.transfer = agent.transfer, None
    agent.nursery.start_soon(_install, agent, command.id, body, transfer, layout)


async def _install(agent: NodeAgent, command_id: str, body: pb.UpgradeAgent, transfer: upgrading.Transfer,
                   layout: upgrading.InstallLayout) -> None:
    log.info("installing llmgw %s beside %s (%d bytes received)", body.version, layout.version, transfer.size)
    try:
        await trio.to_thread.run_sync(upgrading.install_release, transfer.path, body.total_bytes, body.sha256,
                                      body.version, list(body.trusted_keys), layout)
        await trio.to_thread.run_sync(upgrading.mark_pending, agent.config.state_dir, layout, body.version,
                                      body.confirm_seconds or 120.0, sys.argv[1:])
        await trio.to_thread.run_sync(upgrading.switch_current, layout.root, body.version)
    except (ReleaseError, InstallError, OSError) as exc:
        log.warning("the upgrade to llmgw %s failed: %s", body.version, exc)
        agent.result(command_id, f"the upgrade to llmgw {body.version} failed: {exc}")
        return
    log.info("llmgw %s installed and current; the agent re-executes itself from it (engines keep running)",
             body.version)
    agent.result(command_id)
    agent.restart_requested.set()
