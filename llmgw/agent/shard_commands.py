"""The agent's StartShard and StopShard handlers (`llmgw.agent.commands`).

Starting a shard (fetch its weights, lay them out, build the engine's command line, spawn it, wait for it to be
ready and read its start-up log) runs as a task of the agent's own nursery, so it goes on while the connection is
down. Until the supervisor runs it, the shard is reported from `NodeAgent.pending` (pending, fetching, failed).
The StartShard is answered once the engine is spawned, or with why it could not be; a start stopped by a StopShard
is answered with that.
"""

from __future__ import annotations

import logging
import math
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import trio

from llmgw.agent import kv_sockets, weights_tree
from llmgw.agent.config import engine_binary
from llmgw.agent.kv_sockets import kv_socket_dir
from llmgw.agent.draining import drain_engine
from llmgw.agent.node import Command, NodeAgent
from llmgw.agent.shards import ShardSpec, ShardView
from llmgw.agent.tracing import NO_TRACE
from llmgw.agent.weights_layout import engine_model_path, lay_out_adapters
from llmgw.engines import ENGINE_HOST, Launch, get_engine, listen_overrides, vllm
from llmgw.engines.relay import relay_command
from llmgw.errors import EngineError, LlmgwError, WeightsError
from llmgw.groups import expect_leaves
from llmgw.identity import ShardState, engine_key
from llmgw.wire import pb

log = logging.getLogger("llmgw.agent")


async def fetch_weights(files: list[pb.WeightsFile], weights_dir: Path, mirrors: tuple[str, ...], *,
                        allow_pickle: bool, offline: bool = False,
                        progress: Callable[[float, str], None]) -> tuple[list[Path], list[str], list[str | None]]:
    """Fetch a shard's weights with `llmgw.agent.weights_tree.fetch_all` into `<weights_dir>/sha256/<digest>`,
    directory sources expanded into their files.

    Returns the local paths, their sources and their names in the model's directory (None: named by their source),
    in the order of `files` with a directory's files in its place. The token sent to the Hub is the first `secret_value` set.
    Raises WeightsError (the fetcher's first, when several files failed at once).
    """
    token = next((f.secret_value for f in files if f.secret_value), None)
    try:
        return await weights_tree.fetch_all(files, weights_dir, [Path(m) for m in mirrors],
                                            allow_pickle=allow_pickle, token=token, progress=progress,
                                            offline=offline)
    except BaseExceptionGroup as group:
        raise expect_leaves(group, LlmgwError)[0] from group


async def start_shard(agent: NodeAgent, command: Command) -> None:
    """StartShard: answered ok at once when the shard is on its way already or runs with the same fingerprint;
    else started by a task of the agent's nursery (`_start`), which answers it once the engine is spawned (or with
    why it could not be). Not a checkpoint: the next command is handled after the shard is known to be starting."""
    command_id, body = command.id, command.body
    running = agent.supervisor.get(body.shard_id)
    if body.shard_id in agent.starting:
        agent.result(command_id)  # already on its way; the shard's status says how far
        return
    if running is not None and running.spec and running.spec.fingerprint == body.fingerprint:
        agent.result(command_id)  # idempotent: the same shard runs already
        return
    scope = trio.CancelScope()
    agent.starting[body.shard_id] = scope
    agent.nursery.start_soon(_start, agent, command_id, body, scope)


async def _start(agent: NodeAgent, command_id: str, command: pb.StartShard, scope: trio.CancelScope) -> None:
    """Prepare and spawn the shard of `command`, answer `command_id`, then wait for the engine to be ready (a
    failure then is the shard's status, and the span's). Cancelling `scope` (StopShard) ends it, answered."""
    shard_id = command.shard_id
    info = ShardSpec(
        shard_id=shard_id, argv=(), port=0, engine=engine_key(command.engine, command.engine_version),
        replica_id=command.replica_id, model=command.model, fingerprint=command.fingerprint,
        settings_commit=command.settings_commit, devices=tuple(command.devices),
        cpu_cores=command.cpu_cores, memory_bytes=command.memory_bytes, rank=command.rank, group=command.group,
    )
    view = ShardView(shard_id=shard_id, state=ShardState.PENDING, spec=info)
    agent.set_pending(view)
    trace = agent.tracing.begin(command) if agent.tracing is not None else NO_TRACE
    outcome = ""
    try:
        with scope:
            with trace.step("weights fetch", weights_files=len(command.weights)):
                spec = await _prepare(agent, command, info, view)
            with trace.step("engine launch"):
                if agent.supervisor.get(shard_id) is not None:  # a different fingerprint: replace it
                    await agent.supervisor.stop(shard_id, agent.config.shard_stop_grace)
                with trio.CancelScope(shield=True):  # spawning is quick; never leave a process half-registered
                    await agent.supervisor.start(spec)
            agent.pending.pop(shard_id, None)
            agent.result(command_id)
            with trace.step("engine ready wait") as fail:
                outcome = await _check_startup(agent, command, spec)
                if outcome:
                    fail(outcome)
        if scope.cancelled_caught:
            outcome = f"shard {shard_id} was stopped before it started"
            agent.result(command_id, outcome)
    except (LlmgwError, OSError) as exc:
        outcome = str(exc)
        log.warning("shard %s failed to start: %s", shard_id, outcome)
        agent.set_pending(view.with_state(ShardState.FAILED, error=outcome, progress=None, progress_text=""))
        agent.result(command_id, outcome)
    finally:
        trace.end(outcome)
        if agent.starting.get(shard_id) is scope:
            del agent.starting[shard_id]


async def _prepare(agent: NodeAgent, command: pb.StartShard, info: ShardSpec, view: ShardView) -> ShardSpec:
    """Fetch the weights (reporting progress as the shard's "fetching" view) and make the engine's spec: `info`
    with its command line, port and health path. Raises EngineError (engine not installed), WeightsError."""
    module = get_engine(command.engine)
    key = engine_key(command.engine, command.engine_version)
    binary = engine_binary(agent.config, module.NAME, command.engine_version)
    if binary is None:
        raise EngineError(
            f"engine {key} is not installed on node {agent.config.node_id}; "
            "it is installed with InstallEngine (engines.yaml) before shards can use it"
        )
    if command.weights:
        last = [-1.0]

        def progress(fraction: float, text: str) -> None:
            if abs(fraction - last[0]) >= 0.01 or fraction >= 1.0:
                last[0] = fraction
                agent.set_pending(view.with_state(ShardState.FETCHING, progress=max(0.0, min(1.0, fraction)),
                                                  progress_text=text))

        agent.set_pending(view.with_state(ShardState.FETCHING, progress=0.0, progress_text="looking for the weights"))
        if any(weights_tree.is_directory_source(f.source) for a in command.adapters for f in a.weights):
            raise WeightsError(f"shard {command.shard_id}: an adapter names a directory source; adapters list "
                               "their files one by one (llmgw validate refuses this)")
        # the adapters' files come with the model's, in one fetch (one progress, the same cache and checks)
        files = [*command.weights, *(f for a in command.adapters for f in a.weights)]
        paths, sources, names = await fetch_weights(files, agent.config.weights_path, agent.config.mirrors,
                                                    allow_pickle=command.allow_pickle, progress=progress,
                                                    offline=agent.config.offline_only)
        # several files: laid out under their names; a directory source became its files (adapters list theirs)
        count = len(paths) - sum(len(a.weights) for a in command.adapters)
        model_path = await trio.to_thread.run_sync(engine_model_path, module.NAME, sources[:count], paths[:count],
                                                   agent.config.weights_path, names[:count])
        adapters = await trio.to_thread.run_sync(lay_out_adapters, module.NAME, list(command.adapters),
                                                 paths[count:], agent.config.weights_path)
    else:
        raise WeightsError(f"shard {command.shard_id} names no weights; the catalog entry needs a weights source")
    overrides = listen_overrides(command.engine_args)
    if overrides:
        raise EngineError(f"shard {command.shard_id}: engine_args set {', '.join(overrides)}; the agent chooses "
                          "where an engine listens (127.0.0.1, behind its relay on the node's address): remove them")
    host = ENGINE_HOST
    port = agent.supervisor.free_port(host)
    relay_host, relay_port = "", 0
    if command.rank == 0:  # rank 0 serves HTTP: through the relay, on the node's address (advertised)
        relay_host = agent.config.listen_host
        relay_port = agent.supervisor.free_port(relay_host, avoid={port})
    kv_endpoint = ""
    if module is vllm and vllm.KV_EVENTS_FLAG not in command.engine_args:  # precise prefix routing
        directory = await trio.to_thread.run_sync(kv_socket_dir, agent.config.state_dir)
        kv_endpoint = kv_sockets.kv_endpoint(directory, command.shard_id)
    threads = math.ceil(command.cpu_cores) if command.cpu_cores > 0 else None
    launch = Launch(
        binary=binary, model_path=model_path, host=host, port=port, threads=threads,
        context_size=command.context_size or None, devices=tuple(command.devices),
        engine_args=tuple(command.engine_args), served_name=command.served_name or command.model,
        api_key=command.replica_key, tensor_parallel=command.tensor_parallel or 1,
        pipeline_parallel=command.pipeline_parallel or 1, rank=command.rank, nodes=command.nodes or 1,
        rendezvous=command.rendezvous, extra_env=dict(command.env),
        kv_events_endpoint=kv_endpoint,
        allow_pickle=command.allow_pickle, adapters=adapters,
    )
    argv, env = module.command_line(launch)
    if relay_port:  # the engine runs as the child of its relay (llmgw.engines.relay), its only door
        argv = relay_command(sys.executable, relay_host, relay_port, port, module.API_KEY_ENV, argv)
    # Ranks above 0 of a replica spread over nodes serve no HTTP (vLLM --headless): ready while they run.
    health_path = module.HEALTH_PATH if command.rank == 0 else ""
    return replace(info, argv=tuple(argv), env=env, port=port, host=host, health_path=health_path,
                   threads=threads or 0, grace_seconds=agent.config.shard_stop_grace, kv_events_endpoint=kv_endpoint,
                   relay_host=relay_host, relay_port=relay_port, key_env=module.API_KEY_ENV)


async def _check_startup(agent: NodeAgent, command: pb.StartShard, spec: ShardSpec) -> str:
    """Wait until the engine is ready, then read its start-up log: a GPU shard whose engine found no GPU fails.
    Returns "" when it is ready, else why not (stopped, failed, restarted on the way, or the log's reason)."""
    while True:
        view = agent.supervisor.get(spec.shard_id)
        if view is None:
            return f"shard {spec.shard_id} was stopped before it was ready"
        if view.state is ShardState.FAILED or view.restarts:
            return view.error or f"the engine of shard {spec.shard_id} exited before it was ready"
        if view.state is ShardState.READY:
            break
        await trio.sleep(0.2)
    module = get_engine(command.engine)
    report = module.parse_startup_log(agent.supervisor.logs(spec.shard_id))
    reason = module.startup_failure(report, bool(command.devices))
    if reason:
        lines = tuple(agent.supervisor.logs(spec.shard_id, 20))
        await agent.supervisor.stop(spec.shard_id, spec.grace_seconds)
        agent.set_pending(ShardView(spec.shard_id, ShardState.FAILED, spec=spec, error=reason, last_log_lines=lines))
    return reason or ""


async def stop_shard(agent: NodeAgent, command: Command) -> None:
    """StopShard: a task of the agent's nursery (`_stop`) stops the shard, cancelling its start when it is on its
    way, and answers it. Not a checkpoint."""
    agent.nursery.start_soon(_stop, agent, command.id, command.body)


async def _stop(agent: NodeAgent, command_id: str, command: pb.StopShard) -> None:
    scope = agent.starting.pop(command.shard_id, None)
    if scope is not None:
        scope.cancel()
    grace = command.grace_seconds or agent.config.shard_stop_grace
    drain_timeout = command.drain_seconds or agent.config.shard_drain_timeout

    async def drain(spec: ShardSpec) -> None:  # its requests in flight finish first (llmgw.agent.draining)
        await drain_engine(spec, drain_timeout)

    try:
        if agent.supervisor.get(command.shard_id) is not None:
            await agent.supervisor.stop(command.shard_id, grace, drain if drain_timeout > 0 else None)
        else:
            view = agent.pending.get(command.shard_id)
            if view is not None:
                agent.on_shard_change(view.with_state(ShardState.STOPPED, error=""))
        agent.pending.pop(command.shard_id, None)
        agent.result(command_id)
    except LlmgwError as exc:
        agent.result(command_id, str(exc))
