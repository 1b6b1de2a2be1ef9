"""The agent's handlers (`llmgw.agent.commands`) of the commands about the agent itself: AgentSettings, RequestLogs,
FabricTest, Restart, and the two notices that are not answered (Registered, SlurmJobsRecorded).

AgentSettings is applied before the next message of its connection is handled (that one is traced by the new
settings); a FabricTest runs as a task of the agent's nursery and is answered with a FabricTestOutput only.
"""

from __future__ import annotations

import logging

import trio

from llmgw import __version__
from llmgw.agent import upgrading
from llmgw.agent.config import save_agent_settings, save_offline_record
from llmgw.agent.fabric_test import run_perftest
from llmgw.agent.node import Command, NodeAgent
from llmgw.agent.slurm import without_secrets
from llmgw.errors import AgentRefused, UsageError
from llmgw.wire import agent_message, pb

log = logging.getLogger("llmgw.agent")


async def agent_settings(agent: NodeAgent, command: Command) -> None:
    """AgentSettings: replace the agent's config (`AgentConfig.with_settings`), wake the timers waiting on an
    interval, follow the tracing target, keep the settings for the next agent (without their secrets), swap its
    firewall table (`FirewallKeeper`: a table nft refuses, or one rolled back before, is the answer's error and the
    previous table stays), answer, then apply its part in Slurm (a task). When `ignore_gpus` changed, the session ends after the answer and the
    agent registers again with the GPUs it now offers. A checkpoint."""
    settings: pb.AgentSettings = command.body
    before = agent.config
    agent.config = agent.config.with_settings(settings)
    log.info("agent settings changed: heartbeat every %g s, readings every %g s%s",
             agent.config.heartbeat_interval, agent.config.telemetry_interval,
             f", GPUs left alone: {', '.join(agent.config.ignore_gpus)}" if agent.config.ignore_gpus else "")
    agent.settings_changed.set()
    agent.settings_changed = trio.Event()
    await agent.retrace()  # before the next message of this link is handled: it is traced by these settings
    try:  # kept for the next agent, which applies them before it can reach the control plane
        await trio.to_thread.run_sync(save_agent_settings, agent.config.state_dir, without_secrets(settings))
        await trio.to_thread.run_sync(save_offline_record, agent.config.state_dir,
                                      agent.config.mirrors if agent.config.offline_only else None)
    except OSError as exc:
        log.warning("could not keep the agent settings in %s for the next start: %s", agent.config.state_dir, exc)
    table = settings.firewall  # applied before the answer: a table nft refuses is this command's failure
    firewall = await agent.firewall.apply(table.text, table.digest, table.rollback_after or 60.0,
                                          list(agent.config.control_planes))
    agent.result(command.id, firewall.error if firewall.digest != table.digest else "")
    agent.nursery.start_soon(agent.slurm.apply, settings.slurm)  # its part in Slurm, or none
    if agent.config.ignore_gpus != before.ignore_gpus:  # after the answer: the session ends once it is out
        log.info("ignore_gpus changed: registering again with the GPUs this node now offers")
        agent.register_again.set()


async def request_logs(agent: NodeAgent, command: Command) -> None:
    """RequestLogs: the last `lines` lines (all kept when 0) of a shard's engine, or of the agent's own log when
    it names no shard, as LogLines; then the CommandResult when it has an id (not ok for an unknown shard, whose
    LogLines are empty). Not a checkpoint."""
    request: pb.RequestLogs = command.body
    count = request.lines or None
    error = ""
    if request.shard_id:
        try:
            lines = agent.supervisor.logs(request.shard_id, count)
        except UsageError as exc:
            lines, error = [], str(exc)
    else:
        lines = agent.ring.tail(count)
    agent.emit(agent_message(log_lines=pb.LogLines(request_id=request.request_id, shard_id=request.shard_id,
                                                   lines=lines)))
    if command.id:
        agent.result(command.id, error)


async def fabric_test(agent: NodeAgent, command: Command) -> None:
    """FabricTest: run perftest's ib_write_bw (`llmgw.agent.fabric_test`) in a task and send its FabricTestOutput
    (the tool's failures are its `error`); no CommandResult. Not a checkpoint."""
    agent.nursery.start_soon(_fabric_test, agent, command.body)


async def _fabric_test(agent: NodeAgent, request: pb.FabricTest) -> None:
    if request.client and not request.server:  # the server: its firewall lets the client in for the test
        refused = await agent.firewall.let_in(request.client, request.port, request.timeout_seconds or 60.0)
        if refused:
            log.warning("fabric test on port %d: %s", request.port, refused)
    agent.emit(agent_message(fabric_test_output=await run_perftest(request, agent.nursery)))


async def restart(agent: NodeAgent, command: Command) -> None:
    """Restart: answer ok on the command's own connection (before the session ends), then ask the runtime to
    restart the agent; its engines keep running and the next agent adopts them. A checkpoint."""
    log.info("the control plane asked this agent to restart; engines keep running")
    await command.link.send(agent_message(command_result=pb.CommandResult(command_id=command.id, ok=True)))
    agent.restart_requested.set()


async def registered(agent: NodeAgent, command: Command) -> None:
    """Registered (a notice, not answered): logged with the node id the control plane knows this node by; an
    upgrade to this version that waited for it is confirmed (`llmgw.agent.upgrading.confirm`). With a `refusal`
    (this agent is newer than the control plane, `llmgw.control.versions`): the sentence is logged and raised as
    AgentRefused, which ends the agent (`llmgw agent` exits 1 with it; engines keep running unless
    `--stop-shards-on-exit`), instead of reconnecting to be refused again; a pending upgrade is then not confirmed
    (its watcher rolls the node back)."""
    if command.body.refusal:
        log.error("the control plane (llmgw %s) refused this agent: %s", command.body.control_plane_version,
                  command.body.refusal)
        raise AgentRefused(f"the control plane (llmgw {command.body.control_plane_version or 'unknown'}) refused this "
                           f"agent: {command.body.refusal}")
    log.info("registered with the control plane as %s", command.body.node_id)
    if await trio.to_thread.run_sync(upgrading.confirm, agent.config.state_dir, __version__):
        log.info("the upgrade to llmgw %s is confirmed: this agent registered", __version__)


async def slurm_jobs_recorded(agent: NodeAgent, command: Command) -> None:
    """SlurmJobsRecorded (a notice, not answered): the control plane stored the ended Slurm jobs up to `until`, so
    the next read of sacct starts there (`SlurmKeeper.recorded`)."""
    agent.slurm.recorded(command.body.until)


async def certificate_renewed(agent: NodeAgent, command: Command) -> None:
    """CertificateRenewed (a notice, not answered): the control plane's answer to RenewCertificate, checked and
    installed by the agent's `CertificateRenewer` (`llmgw.agent.renewal`); ignored by an agent without TLS."""
    if agent.renewer is not None:
        agent.renewer.accept(command.body)


async def trust_certificates(agent: NodeAgent, command: Command) -> None:
    """TrustCertificates (a notice, not answered): the CAs to trust from now on and the one that signs, taken by the
    agent's `CertificateRenewer` (a CA rotation: `llmgw.agent.renewal`); ignored by an agent without TLS."""
    if agent.renewer is not None:
        agent.renewer.trust(command.body)
