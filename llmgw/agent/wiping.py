"""The agent's handler of WipeNode (`llmgw node remove NODE`: the control plane drained the node, then tells its
agent over the stream to take llmgw off the host).

In order: every engine this agent runs is stopped (the node is drained; what is left would hold files open), the
host's install journal (`AgentConfig.install_journal`) is undone as `llmgw wipe` undoes it (`llmgw.install.wiping`,
the same code; the agent's own unit only disabled), the CommandResult answers with what was removed (`report`, the
lines `llmgw wipe` prints), and the agent stops itself: `run_agent` returns `WIPED` once that answer is out (where
systemd runs, `systemctl stop --no-block` of the agent's unit as well, so its restart policy does not bring it
back). A host without a journal (an agent not installed by `llmgw node add`) is answered not ok, nothing changed.

The agent's own release (/opt/llmgw/<version>) is among what is removed while it runs: everything the rest of its
life needs is imported before the undo, and it writes nothing under the removed directories after it.
"""

from __future__ import annotations

import logging
from pathlib import Path

import trio

from llmgw.agent.node import Command, NodeAgent
from llmgw.errors import InstallError
from llmgw.install.commands import run_command
from llmgw.install.wiping import wipe_host
from llmgw.wire import agent_message, pb

log = logging.getLogger("llmgw.agent")

AGENT_UNIT = "llmgw-agent.service"
"""The agent's own systemd unit (deploy/systemd), disabled by the wipe and stopped once it answered."""


async def wipe_node(agent: NodeAgent, command: Command) -> None:
    """WipeNode (module docstring). Answers on the command's own connection, then asks the agent to stop
    (`agent.wiped`, `agent.restart_requested`). A checkpoint; takes as long as the engines' stop and the removal."""
    request: pb.WipeNode = command.body
    journal = Path(agent.config.install_journal)
    if not journal.is_file():
        agent.result(command.id, f"{journal}: no install journal on this node: llmgw was not installed here by "
                                 "`llmgw node add`, so there is nothing the agent can wipe; nothing was removed")
        return
    log.warning("the control plane asked this agent to wipe the host: stopping every engine, then undoing %s",
                journal)
    await agent.supervisor.stop_all()
    try:
        lines = await trio.to_thread.run_sync(
            lambda: wipe_host(journal, keep_weights=request.keep_weights, spare_unit=AGENT_UNIT))
    except InstallError as exc:
        agent.result(command.id, f"the wipe stopped halfway: {exc}")
        return
    for line in lines:
        log.info("wipe: %s", line)
    agent.wiped = True
    await command.link.send(agent_message(command_result=pb.CommandResult(command_id=command.id, ok=True,
                                                                          report=lines)))
    if Path("/run/systemd/system").is_dir():  # its restart policy would start it again
        await trio.to_thread.run_sync(run_command, ["systemctl", "stop", "--no-block", AGENT_UNIT])
    agent.restart_requested.set()
