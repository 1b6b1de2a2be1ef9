"""The agent's answers to the control plane: one handler per kind of ControlMessage, found in `COMMANDS`.

`handle(agent, message, link)` checks a command that changes the node against the fence (`llmgw.agent.fencing`:
one from a deposed leader is refused), then looks its body's kind up in `COMMANDS` and awaits that handler with the
`NodeAgent` and the `Command`. A body this agent does not know (from a newer control plane: it arrives without a
body, its field unknown to this agent's protocol) goes to `not_understood`, which answers a command with an id as
not understood. Adding a command is: the message in `llmgw.wire`, a handler, a line in `COMMANDS`; no if-chain.

The handlers, by concept: StartShard and StopShard in `llmgw.agent.shard_commands`, InstallEngine in
`llmgw.agent.install_command`, StartTraining and CancelTraining in `llmgw.agent.training_commands`, AgentSettings,
RequestLogs, FabricTest, Restart and the notices Registered, SlurmJobsRecorded, CertificateRenewed and
TrustCertificates in `llmgw.agent.node_commands`, UpgradeAgent in `llmgw.agent.upgrade_command`, WipeNode in
`llmgw.agent.wiping`. Each command is answered with a CommandResult carrying its
`command_id` (FabricTest with a FabricTestOutput; the notices not at all). Long commands (starting a shard,
installing an engine) run as tasks of the agent's own nursery, so they go on while the connection is down.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from types import MappingProxyType

import trio

from llmgw.agent import install_command, node_commands, shard_commands, training_commands, upgrade_command, wiping
from llmgw.agent.fencing import FENCED_COMMANDS, save_token
from llmgw.agent.node import Command, CommandHandler, NodeAgent
from llmgw.wire import AgentLink, pb

log = logging.getLogger("llmgw.agent")


async def not_understood(agent: NodeAgent, command: Command) -> None:
    """A body this agent has no handler for: a command with an id is answered not ok, naming its kind ("None"
    when the body is one this agent's protocol does not know) and asking for an upgrade; without an id, nothing."""
    if command.id:
        agent.result(command.id, f"this agent does not understand the command {command.kind!r}; upgrade it")


COMMANDS: Mapping[str, CommandHandler] = MappingProxyType({
    "start_shard": shard_commands.start_shard,
    "stop_shard": shard_commands.stop_shard,
    "install_engine": install_command.install_engine,
    "agent_settings": node_commands.agent_settings,
    "request_logs": node_commands.request_logs,
    "fabric_test": node_commands.fabric_test,
    "restart": node_commands.restart,
    "registered": node_commands.registered,
    "slurm_jobs_recorded": node_commands.slurm_jobs_recorded,
    "certificate_renewed": node_commands.certificate_renewed,
    "trust_certificates": node_commands.trust_certificates,
    "upgrade_agent": upgrade_command.upgrade_agent,
    "wipe_node": wiping.wipe_node,
    "start_training": training_commands.start_training,
    "cancel_training": training_commands.cancel_training,
})
"""The handler of each ControlMessage body, by its field name in the `body` oneof."""


def handler_for(kind: str | None) -> CommandHandler:
    """The handler of a body of `kind` (a field name of the `body` oneof; None: no body this agent knows):
    its entry in `COMMANDS`, else `not_understood`."""
    return COMMANDS.get(kind or "", not_understood)


def command_of(message: pb.ControlMessage, link: AgentLink) -> Command:
    """The `Command` a handler gets for `message`, received on `link`."""
    kind = message.WhichOneof("body")
    return Command(kind=kind, body=getattr(message, kind) if kind else None, id=message.command_id, link=link)


async def handle(agent: NodeAgent, message: pb.ControlMessage, link: AgentLink) -> None:
    """Act on one ControlMessage received on `link`: refused when it changes the node and carries an older
    leader-lease token than the newest seen (the newest is kept under the state directory), else handed to its
    handler (`handler_for`). Returns once the handler did: a long command goes on as a task of the agent's
    nursery. A checkpoint when the fence moves or the handler awaits. A failure of the command is its answer;
    raises only what `link.send` raises (Restart answers on `link`)."""
    command = command_of(message, link)
    if command.kind in FENCED_COMMANDS and not await _admit(agent, command, message.fencing_token):
        return
    await handler_for(command.kind)(agent, command)


async def _admit(agent: NodeAgent, command: Command, token: int) -> bool:
    """Whether the fence admits `command` carrying `token`; a refused one is answered with the refusal."""
    fence, refusal = agent.fence.admit(token)
    if refusal:
        log.warning("%s %s", command.kind, refusal)
        agent.result(command.id, refusal)
        return False
    if fence is not agent.fence:
        agent.fence = fence
        try:
            await trio.to_thread.run_sync(save_token, agent.config.state_dir, fence.newest)
        except OSError as exc:
            log.warning("could not keep the fencing token in %s: %s", agent.config.state_dir, exc)
    return True
