"""The handlers of the control plane's effects (`llmgw.control.effects`), one small async function per type,
registered by `register_handlers` in the loop's registry (`llmgw.control.handling`).

- commands (`StartShard`, `StopShard`, `InstallEngine`, `ConfigureAgent`) become the wire's command messages
  (`llmgw.control.commands`), sent over the node's stream (`AgentHub.command`); a refusal raises EngineError;
- `WriteAudit` / `SetApplied` queue writes of the audit writer (`llmgw.control.audit.AuditWriter`);
- `RememberNodes` and `RecordSlurmUsage` write the store (in a worker thread);
- `PublishRoutingTable` goes to the gateway feed (`llmgw.control.feeding.GatewayFeed`);
- `MeasureCanary` reads a canary's usage records from the store, `ProposeRevert` writes a revert branch into the
  repository the audit goes to (both in a worker thread; `llmgw.control.canaries`);
- `StartTraining`, `CancelTraining` (commands) and `KeepTrainingPiece` (the store): `llmgw.control.training_handlers`.

What a handler learns goes back to the loop as a transition (`update`); none reads the loop's state.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import trio

from llmgw.control.agents import AgentHub
from llmgw.control.audit import AuditWriter, Planning, audit_message, audit_snapshot, state_changes
from llmgw.control.autoscaling import scale_line, ttft_measured
from llmgw.control.canaries import canary_line, canary_measured, canary_unmeasured, revert_proposed
from llmgw.control.forecast_audit import forecast_lines, forecast_measured, forecast_unmeasured, measure_forecast
from llmgw.control.commands import agent_settings, install_engine, may_take_part_in_slurm, slurm_role, start_shard, stop_shard
from llmgw.control.events import audit_written, nodes_forgotten, slurm_jobs_written
from llmgw.control.effects import (
    ConfigureAgent, InstallEngine, MeasureCanary, MeasureForecast, MeasureTtft, ProposeRevert, RecordSlurmUsage, RememberNodes, SetApplied,
    StartShard, StopShard, WriteAudit,
)
from llmgw.control.handling import Handlers
from llmgw.control.recovering import KNOWN_NODES_KEY, encode_known
from llmgw.control.reports import fleet_for
from llmgw.control.slurm_store import advance_cursor, read_cursor, users_from_store
from llmgw.control.training_handlers import register_training_handlers
from llmgw.errors import EngineError, SettingsError, StoreError, TemporaryError
from llmgw.plan.canary import CanarySample, percentile
from llmgw.plan.reviewed import review_differences
from llmgw.settings import propose_revert
from llmgw.settings.model import Settings
from llmgw.wire import control_message, pb

log = logging.getLogger("llmgw.control")

Update = Callable[..., None]
"""`ControlLoop.update(transition, reason)`."""


@dataclass
class EffectContext:
    """What the handlers reach: the agents' streams, the store (None until opened), named secrets (`secret(name)`
    raises UsageError when missing), replica keys by replica id, the audit writer, the status document of a state
    without readings (`status(state)`), tracing (None: off), the loop's `update` and `speeds()`, the replicas'
    speeds routing uses (replica id -> ReplicaSpeed)."""

    agents: AgentHub
    secret: Callable[[str], str]
    replica_key: Callable[[str], str]
    audit: AuditWriter
    status: Callable[[Any], dict]
    update: Update
    store: Any = None
    tracing: Any = None
    speeds: Callable[[], Any] = dict


def register_handlers(handlers: Handlers, ctx: EffectContext) -> None:
    """Register the handler of every effect type but `PublishRoutingTable` (the gateway feed's) and `CommitSettings`
    (the settings desk's, `llmgw.control.operating`) in `handlers`."""
    handlers.register(StartShard, lambda e: _start(ctx, e))
    handlers.register(StopShard, lambda e: _send(ctx, e, "stop", stop_shard=stop_shard(e.action, e.settings)))
    handlers.register(InstallEngine, lambda e: _install(ctx, e))
    handlers.register(ConfigureAgent, lambda e: _configure(ctx, e))
    handlers.register(WriteAudit, lambda e: _write_audit(ctx, e), lane="audit")
    handlers.register(SetApplied, lambda e: _set_applied(ctx, e), lane="audit")
    handlers.register(RememberNodes, lambda e: _remember(ctx, e))
    lock = trio.Lock()  # one beat's jobs after the other: a cursor never passes a failed job
    handlers.register(RecordSlurmUsage, lambda e: _record_slurm(ctx, e, lock))
    handlers.register(MeasureCanary, lambda e: _measure_canary(ctx, e))
    handlers.register(MeasureTtft, lambda e: _measure_ttft(ctx, e))
    handlers.register(MeasureForecast, lambda e: _measure_forecast(ctx, e))
    handlers.register(ProposeRevert, lambda e: _propose_revert(ctx, e))
    register_training_handlers(handlers, ctx)  # StartTraining, CancelTraining, KeepTrainingPiece


async def _measure_canary(ctx: EffectContext, effect: MeasureCanary) -> None:
    """Read the canary's requests from the usage records and hand them to `canary_measured`."""
    try:
        records = await trio.to_thread.run_sync(ctx.store.usage_of_replica, effect.model, effect.replica,
                                                effect.commit, effect.since_unix)
    except (StoreError, TemporaryError) as exc:
        log.warning("could not read the requests of the canary of %s: %s", effect.model, exc)
        ctx.update(canary_unmeasured(effect.model, effect.commit, str(exc)), f"canary of {effect.model} not measured")
        return
    samples = tuple(CanarySample(r.status, r.ttft_seconds, r.duration_seconds) for r in records)
    ctx.update(canary_measured(effect.model, effect.commit, samples, effect.elapsed),
               f"canary of {effect.model} measured")


async def _measure_ttft(ctx: EffectContext, effect: MeasureTtft) -> None:
    """Read the model's recent TTFTs from the usage records and hand their p90 to `ttft_measured` (a store that
    fails leaves the last p90, which goes stale: the autoscaler then counts no TTFT)."""
    if ctx.store is None:
        return
    try:
        ttfts = await trio.to_thread.run_sync(ctx.store.ttfts_of_model, effect.model, effect.since_unix)
    except (StoreError, TemporaryError) as exc:
        log.warning("could not read the TTFT of %s: %s", effect.model, exc)
        return
    ctx.update(ttft_measured(effect.model, percentile(ttfts, 0.9), effect.asked_at),
               f"TTFT of {effect.model} measured")


async def _measure_forecast(ctx: EffectContext, effect: MeasureForecast) -> None:
    """Read the load recorded since the reviewed change converged and hand its check against the review's forecast
    to `forecast_measured` (`forecast_unmeasured` when the store fails)."""
    if ctx.store is None:
        return
    try:
        usage = await trio.to_thread.run_sync(ctx.store.usage_load, effect.since_unix)
    except (StoreError, TemporaryError) as exc:
        log.warning("could not read the load to check the forecast of %s: %s", effect.commit[:12], exc)
        ctx.update(forecast_unmeasured(effect.commit, str(exc)), f"forecast of {effect.commit[:12]} not measured")
        return
    until = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(effect.until_unix))
    checks, window = measure_forecast(effect.forecast, usage, ctx.speeds(), effect.since_unix, effect.until_unix,
                                      until)
    ctx.update(forecast_measured(effect.commit, checks, window, until), f"forecast of {effect.commit[:12]} measured")


async def _propose_revert(ctx: EffectContext, effect: ProposeRevert) -> None:
    """Push the revert of a failed canary's commit to its branch; the outcome goes to `revert_proposed`."""
    reason = (f"llmgw: the canary of {effect.model} failed: {effect.reason}.\nThe old replicas kept serving; "
              f"merge this revert to bring the settings back to what runs.")
    try:
        await trio.to_thread.run_sync(propose_revert, ctx.audit.repo_path, effect.commit, effect.branch, reason)
    except SettingsError as exc:
        log.warning("could not propose the revert of %s: %s", effect.commit[:12], exc)
        ctx.update(revert_proposed(effect.model, effect.commit, effect.branch, str(exc)),
                   f"revert of {effect.commit[:12]} not proposed")
        return
    ctx.update(revert_proposed(effect.model, effect.commit, effect.branch),
               f"revert of {effect.commit[:12]} proposed on {effect.branch}")


async def _send(ctx: EffectContext, effect, verb: str, **body) -> None:
    """Send one command and wait for its answer. Raises TemporaryError (not connected, no answer in time) or
    EngineError (the node refused)."""
    action = effect.action
    outcome = await ctx.agents.command(action.node_id, effect.settings.cluster.action_timeout,
                                       fencing_token=effect.token, **body)
    if not outcome.ok:
        subject = "its agent settings" if isinstance(effect, ConfigureAgent) else (
            action.shard_id or action.replica_id or action.engine)
        raise EngineError(f"node {action.node_id} refused to {verb} {subject}: {outcome.error}")


async def _start(ctx: EffectContext, effect: StartShard) -> None:
    action = effect.action
    command = start_shard(action, effect.settings, ctx.replica_key, ctx.secret)
    if ctx.tracing is not None:  # the agent's spans continue the replica start's trace
        command.traceparent = ctx.tracing.traceparent(action.node_id, action.shard_id)
    await _send(ctx, effect, action.kind.value, start_shard=command)


async def _install(ctx: EffectContext, effect: InstallEngine) -> None:
    action = effect.action
    command = install_engine(action, effect.settings, effect.platform)
    if ctx.tracing is not None:  # the agent's "engine install" span joins the sending pass's trace
        command.traceparent = ctx.tracing.install_traceparent(action.node_id, action.engine)
    await _send(ctx, effect, "install", install_engine=command)


async def _configure(ctx: EffectContext, effect: ConfigureAgent) -> None:
    settings, node_id = effect.settings, effect.node_id
    role = pb.SlurmRole()  # what slurm_role says for a node without a part
    if may_take_part_in_slurm(settings, node_id):  # the whole fleet only for Slurm's own nodes
        fleet = fleet_for(effect.fleet.fleet(), settings)
        users, since = await _slurm_from_store(ctx.store, settings, node_id)
        role = slurm_role(settings, fleet, node_id, ctx.secret, users, since)
    message = agent_settings(settings, node_id, role)
    message.fingerprint = effect.fingerprint
    table = effect.action.firewall  # as the planner rendered it (llmgw.plan.firewall); None: firewall.yaml off
    if table is not None:
        message.firewall.CopyFrom(pb.FirewallTable(text=table.text, digest=table.digest,
                                                   rollback_after=table.rollback_after_seconds))
    await _send(ctx, effect, "configure", agent_settings=message)


async def _slurm_from_store(store: Any, settings: Settings, node_id: str) -> tuple[tuple, float]:
    """(the Linux users of `users: llmgw`, the sacct cursor) for `node_id`'s part in Slurm, from the store
    (llmgw.control.slurm_store); ((), 0.0) for a node with no part or without a store."""
    slurm = settings.slurm
    if not slurm.enabled or store is None or node_id not in (slurm.controller, *slurm.nodes):
        return (), 0.0
    users = await trio.to_thread.run_sync(users_from_store, store, settings)
    since = (await trio.to_thread.run_sync(read_cursor, store, slurm.cluster_name)
             if node_id == slurm.controller else 0.0)
    return users, since


async def _write_audit(ctx: EffectContext, effect: WriteAudit) -> None:
    """Queue the pass's audit commit when a command was sent or the status changed since the last one queued."""
    state, record = effect.state, effect.record
    doc = ctx.status(state)
    snapshot = audit_snapshot(doc)
    if record.sent or snapshot != state.audit_snapshot:
        changes = state_changes(state.audit_snapshot, snapshot)
        ctx.update(audit_written(snapshot))
        audit_doc = {k: v for k, v in doc.items() if k != "control_plane"}
        basis, plan, reviewed = state.plan_basis, state.last_plan, state.reviewed
        planning = None
        message = audit_message(record, changes)
        message += "".join(f"- {canary_line(c)}\n" for _, c in sorted(state.canaries.items()))
        message += "".join(f"- autoscaler: {scale_line(name, entry)}\n"
                           for name, entry in doc.get("scaling", {}).items())
        if snapshot.get("forecast_check") != (state.audit_snapshot or {}).get("forecast_check"):
            message += "".join(f"{line}\n" for line in forecast_lines(state.forecast_audit))
        if basis is not None and plan is not None:
            review = None
            if reviewed is not None and reviewed.commit == basis.settings.commit:
                differences = tuple(review_differences(reviewed, plan, basis.fleet))
                review = (reviewed, differences)
                message += "".join(f"- differs from the reviewed plan: {d}\n" for d in differences)
            planning = Planning(record.number, basis.settings, basis.allow_empty, basis.fleet, plan, review,
                                basis.holds, basis.replicas)
        ctx.audit.queue_audit(audit_doc, message, token=effect.token, planning=planning)


async def _set_applied(ctx: EffectContext, effect: SetApplied) -> None:
    ctx.audit.queue_applied(effect.commit, token=effect.token)


async def _remember(ctx: EffectContext, effect: RememberNodes) -> None:
    """Keep the connected nodes in the store; on failure the next pass tries again."""
    try:
        await trio.to_thread.run_sync(ctx.store.put, KNOWN_NODES_KEY, encode_known(effect.nodes))
    except (StoreError, TemporaryError) as exc:
        ctx.update(nodes_forgotten)
        log.warning("could not keep the connected nodes in the store: %s", exc)


async def _record_slurm(ctx: EffectContext, effect: RecordSlurmUsage, lock: trio.Lock) -> None:
    """Record each job once into usage; once all are written, move the sacct cursor to `until` in the store and
    tell the agent (SlurmJobsRecorded), so it reads on from there (llmgw.control.slurm_store)."""
    recorded: list[str] = []
    failed: list[str] = []
    moved = False
    async with lock:
        for request_id, record in effect.jobs:
            try:
                await trio.to_thread.run_sync(ctx.store.record_usage_once, record, request_id)
            except StoreError as exc:  # forgotten: the next beat carries the job again
                failed.append(request_id)
                log.warning("could not record Slurm job %s into usage: %s", request_id, exc)
            else:
                recorded.append(request_id)
        still_failed = (effect.failed - set(recorded)) | set(failed)
        if effect.until and not still_failed:
            try:
                await trio.to_thread.run_sync(advance_cursor, ctx.store, effect.cluster, effect.until)
                moved = True
            except StoreError as exc:
                log.warning("could not keep the sacct cursor of Slurm cluster %s: %s", effect.cluster, exc)
    ctx.update(slurm_jobs_written(effect.cluster, tuple(recorded), tuple(failed), moved))
    if not moved:
        return  # the agent keeps reading from the old cursor
    session = ctx.agents.sessions.get(effect.node_id)
    if session is not None:
        try:  # not a command: no answer; a lost one only means the margin is read again
            await session.send(control_message(slurm_jobs_recorded=pb.SlurmJobsRecorded(until=effect.until)))
        except TemporaryError:
            pass
