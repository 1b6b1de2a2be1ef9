"""The agent's main loop: adopt what runs, connect, register, heartbeat, obey, and reconnect when the link drops.

On every connection the agent sends Register first (inventory, the GPUs it offers, engines installed and
installable, features, every shard running or adopted), then a Heartbeat at once and every `heartbeat_interval`
seconds (the full shard list each beat, and the latest reading of `llmgw.agent.readings`, taken every
`telemetry_interval`: GPU telemetry, node CPU and memory, each shard's CPU cores and resident memory), plus a
ShardStatus whenever a shard changes. GPU health and fabrics (`llmgw.agent.health`) are read before each
Register (which carries them) and every minute after; each beat carries the latest, with the InfiniBand ports read
again. Shards keep running while the control plane is unreachable; the agent
reconnects to each control plane on its own, with a jittered backoff (`reconnect_delay`: 0.5 s doubling to
`reconnect_backoff_max`, default 5 s, each wait drawn between half and all of that), so a control plane started
again finds its agents back within seconds and several agents do not knock in step. GPUs of `ignore_gpus` are neither reported,
read nor offered (`llmgw.agent.ignoring`); when AgentSettings change `ignore_gpus`, the agent registers again at
once.

Restart (the ControlMessage `restart`): the agent answers, then `run_agent` returns `RESTART` with every engine
left serving (even with `stop_shards_on_exit`); the next agent (`llmgw agent` re-executes itself; an in-process
owner calls `run_agent` again, see `run_agent_restarting`) adopts them with their pids.
"""

from __future__ import annotations

import fcntl
import functools
import logging
import os
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from contextlib import AbstractAsyncContextManager
from typing import Any

import trio

from llmgw.agent import commands, reporting, upgrading
from llmgw.agent.firewall import report_message as firewall_report
from llmgw.agent.bandwidth import bandwidth_this_boot
from llmgw.agent.config import AgentConfig, load_agent_settings, save_engine_binaries, save_offline_record
from llmgw.agent.discovery import discover_node, load_nvml
from llmgw.agent.engine_load import read_engine_loads
from llmgw.agent.health import HealthReader, HealthWatch, report_message
from llmgw.agent.ignoring import ignored_cards, offered_gpus
from llmgw.engines.builds import NodeFacts
from llmgw.agent.inventory import free_bytes_under
from llmgw.agent.kv_forwarding import ShardBlocks, kv_messages
from llmgw.agent.readings import Readings
from llmgw.agent.telemetry import open_gpu_telemetry
from llmgw.agent.logs import LogRing, RingHandler
from llmgw.agent.node import NodeAgent
from llmgw.agent.shards import next_backoff
from llmgw.agent.supervisor import Supervisor
from llmgw.agent.tracing import open_agent_tracing
from llmgw.errors import UsageError, WireError
from llmgw.groups import expect_leaves
from llmgw.wire import agent_message, pb

log = logging.getLogger("llmgw.agent")

Connect = Callable[[], AbstractAsyncContextManager]
"""`connect()` returns an async context manager yielding a Link (AgentMessage out, ControlMessage in)."""

_LINK_ERRORS = (WireError, trio.EndOfChannel, trio.BrokenResourceError, trio.ClosedResourceError, OSError)
FOREIGN_SCAN_INTERVAL = 60.0
KV_BATCH_INTERVAL = 0.1
"""Seconds the agent gathers KV-cache events before sending their net change (one message per shard at most)."""
RESTART = "restart"
"""What `run_agent` returns when the control plane asked the agent to restart (its engines keep serving)."""
WIPED = "wiped"
"""What `run_agent` returns once it wiped its host (WipeNode, `llmgw.agent.wiping`): it must not run again."""
_LOAD = object()
RECONNECT_INITIAL = 0.5
"""Seconds before the first attempt to reconnect to a control plane (then doubling up to the agent's cap)."""


def reconnect_delay(previous: float, maximum: float, fraction: float) -> tuple[float, float]:
    """The next reconnect wait, pure: (the backoff step, the wait drawn from it), in seconds.

    `previous` is the last backoff step (0 after a connection that worked); the step is `RECONNECT_INITIAL`, then
    doubles, never above `maximum`. The wait is between half the step and the whole of it (`fraction` in [0, 1),
    e.g. `random.random()`): "equal jitter", https://aws.amazon.com/blogs/architecture/exponential-backoff-and-jitter/.
    """
    step = next_backoff(previous, min(RECONNECT_INITIAL, maximum), maximum)
    return step, step * (0.5 + 0.5 * fraction)


async def _keep_connected(agent: NodeAgent, session: _Session, connect: Connect, backoff_max: float) -> None:
    """Serve one control plane's connection, reconnecting with backoff (`reconnect_delay`), until the agent is
    asked to restart."""
    delay = 0.0
    while not agent.restart_requested.is_set():
        again = agent.register_again
        try:
            async with connect() as link:
                delay = 0.0
                await session.serve(link)
        except _LINK_ERRORS as exc:
            log.warning("the link to the control plane failed: %s", exc)
        except BaseExceptionGroup as group:
            failure = expect_leaves(group, _LINK_ERRORS)[0]
            log.warning("the link to the control plane failed: %s", failure)
        if agent.restart_requested.is_set():
            break
        if again.is_set():
            if agent.register_again is again:
                agent.register_again = trio.Event()
            continue  # at once: the settings changed what this node offers
        delay, wait = reconnect_delay(delay, backoff_max, random.random())
        log.info("reconnecting to the control plane in %.1f s", wait)
        await trio.sleep(wait)


async def _follow_control_planes(agent: NodeAgent, start: Callable[[str], None]) -> None:
    """Call `start(address)` for every address of `agent.config.control_planes`, now and whenever AgentSettings add
    one, until a restart is asked."""
    while not agent.restart_requested.is_set():
        changed = agent.settings_changed
        for address in agent.config.control_planes:
            start(address)
        async with trio.open_nursery() as waiting:
            async def fire(event: trio.Event) -> None:
                await event.wait()
                waiting.cancel_scope.cancel()
            waiting.start_soon(fire, changed)
            waiting.start_soon(fire, agent.restart_requested)


async def run_agent(config: AgentConfig, connect: Connect | Sequence[Connect] = (), *, nvml: Any = _LOAD,
                    connect_to: Callable[[str], Connect] | None = None, health: HealthReader | None = None,
                    keep_engines: Callable[[], bool] | None = None, task_status=trio.TASK_STATUS_IGNORED) -> str:
    """Run the node agent until cancelled or told to restart; returns `RESTART` ("restart") in that case, with
    every engine left running (also with `config.stop_shards_on_exit`) for the next agent to adopt; returns `WIPED`
    ("wiped") once it wiped its host (WipeNode: `llmgw.agent.wiping`), its engines stopped: nothing may run it again.

    `connect()` must give an async context manager yielding a Link: `llmgw agent` passes
    `lambda: llmgw.wire.connect(address, tls=...)`, `llmgw up` a factory over `memory_link_pair()`. A sequence of
    them connects to every control plane at once (each registers the node; only the leader commands, see
    `llmgw.agent.fencing`), each connection reconnecting on its own. With `connect_to(address)` (a Connect for a
    "host:port"), the agent also connects to every address of `config.control_planes`, and to each one AgentSettings
    add later (llmgw.yaml `control_planes:`, told by the control plane), once each.
    Engines keep running when this returns or is cancelled (unless `config.stop_shards_on_exit`): the next agent
    adopts them. `keep_engines()` True when it is cancelled leaves them running despite `config.stop_shards_on_exit`
    (`llmgw up` restarting itself: the agent of the re-executed process adopts them, same pids).
    `task_status.started(agent)` is called with the NodeAgent once earlier shards are adopted.
    Connection failures (WireError, end of stream) are logged and retried; they never end the agent. A control plane
    that refuses it (this agent newer than that control plane) ends it: AgentRefused, the sentence saying what to do.
    `nvml` is the NVML module discovery and telemetry use (default: the installed `pynvml`, see
    `llmgw.agent.discovery.load_nvml`; None: no NVML, GPUs from nvidia-smi if any; tests pass a stand-in).
    `health` reads GPU health and fabrics (`llmgw.agent.health`; default: the real tools; tests inject runners).
    The AgentSettings the control plane last sent (kept under the state directory) are applied at start.
    Installed engines are re-verified at start and every `config.engine_check_interval` seconds.
    Raises UsageError when another agent already runs with the same state directory.
    """
    if not connect and connect_to is None:
        raise UsageError("the agent needs a control plane to connect to (llmgw agent --control-plane HOST:PORT).")
    lock = _lock_state_dir(config.state_dir)
    save_engine_binaries(config.state_dir, config.engine_binaries)  # for `llmgw node doctor` (and removed when none)
    save_offline_record(config.state_dir, config.mirrors if config.offline else None)  # the same
    if nvml is _LOAD:
        nvml = load_nvml()
    config, saved_slurm = _with_saved_settings(config)
    save_offline_record(config.state_dir, config.mirrors if config.offline_only else None)  # for `node doctor`
    ring = LogRing()
    handler = RingHandler(ring)
    root = logging.getLogger("llmgw")
    root.addHandler(handler)
    if root.level == logging.NOTSET or root.level > logging.INFO:
        root.setLevel(logging.INFO)
    target = config.trace_target  # command line, else agents/ tracing: the control plane last sent
    tracing = open_agent_tracing(target, config.node_id)
    agent: NodeAgent | None = None
    try:
        async with Supervisor(
            config.state_dir, backoff_initial=config.restart_backoff_initial,
            backoff_max=config.restart_backoff_max,
        ) as supervisor, trio.open_nursery() as nursery:
            agent = NodeAgent(config, supervisor, nursery, ring, tracing)
            supervisor.on_change = agent.on_shard_change
            adopted = await supervisor.adopt()
            for view in adopted:  # an adopted vLLM engine publishes to the port in its record
                agent.kv_watch.follow(view)
            if adopted:
                log.info("found %d shard(s) from an earlier agent: %s", len(adopted),
                         ", ".join(f"{v.shard_id} pid {v.pid}" for v in adopted))
            task_status.started(agent)
            if config.bandwidth_probe_seconds > 0:
                nursery.start_soon(_measure_bandwidth, agent)
            telemetry = await trio.to_thread.run_sync(open_gpu_telemetry, nvml)
            try:
                await agent.check_engines()
                nursery.start_soon(agent.check_engines_periodically)
                readings = Readings(telemetry, supervisor.process_groups, lambda: agent.config.telemetry_interval,
                                    lambda: agent.settings_changed, lambda: agent.config.ignore_gpus,
                                    engine_loads=lambda: read_engine_loads(supervisor.shards()))
                nursery.start_soon(readings.run)
                watch = HealthWatch(health or HealthReader(nvml=nvml), lambda: readings.skip_cards)
                nursery.start_soon(watch.run)
                nursery.start_soon(agent.slurm.run, config.slurm_check_interval)
                if saved_slurm is not None:  # the part in Slurm kept from the last AgentSettings (its files on disk)
                    nursery.start_soon(agent.slurm.apply, saved_slurm)
                connects = [connect] if callable(connect) else list(connect)
                async with trio.open_nursery() as connections:
                    def start(one: Connect) -> None:
                        connections.start_soon(_keep_connected, agent, _Session(agent, readings, nvml, watch), one,
                                               config.reconnect_backoff_max)

                    for one in connects:
                        start(one)
                    if connect_to is not None:
                        known: set[str] = set()

                        def start_address(address: str) -> None:
                            if address not in known:
                                known.add(address)
                                log.info("connecting to the control plane at %s", address)
                                start(connect_to(address))

                        connections.start_soon(_follow_control_planes, agent, start_address)
                nursery.cancel_scope.cancel()
            finally:
                telemetry.close()  # also when cancelled: every nvmlInit is shut down
        if agent.wiped:
            return WIPED
        return RESTART  # engines keep serving (also with stop_shards_on_exit): the next agent adopts them
    except BaseException:
        if config.stop_shards_on_exit and not (keep_engines is not None and keep_engines()):
            # Cancelled or failed: the supervisor's context has ended, so stop engines by their records.
            with trio.move_on_after(config.shard_stop_grace + 10, shield=True):
                async with Supervisor(config.state_dir) as cleanup:
                    await cleanup.adopt()
                    await cleanup.stop_all()
        raise
    finally:
        if agent is not None:  # AgentSettings may have replaced it (NodeAgent.retrace)
            tracing = agent.tracing
        if tracing is not None:  # send the spans still buffered (the exporter's own timeout bounds it)
            with trio.move_on_after(15, shield=True):
                await trio.to_thread.run_sync(tracing.shutdown)
        root.removeHandler(handler)
        os.close(lock)


async def run_agent_restarting(config: AgentConfig, connect: Connect, *, nvml: Any = _LOAD,
                               keep_engines: Callable[[], bool] | None = None,
                               task_status=trio.TASK_STATUS_IGNORED) -> None:
    """`run_agent` for an in-process owner (`llmgw up`, tests): run it again each time it returns `RESTART`, so a
    restart asked over the stream ends the agent and a new one adopts the engines, which serve throughout.

    `task_status.started(agent)` is called once, with the first NodeAgent. Runs until cancelled, or until the agent
    wiped its host (`WIPED`); raises what
    `run_agent` raises. `keep_engines`: as `run_agent`'s.
    """
    outcome = await run_agent(config, connect, nvml=nvml, keep_engines=keep_engines, task_status=task_status)
    while outcome == RESTART:  # run_agent returns only when asked to restart, or once it wiped its host
        log.info("the agent restarts in this process; its engines keep serving and are adopted again")
        outcome = await run_agent(config, connect, nvml=nvml, keep_engines=keep_engines)


async def _measure_bandwidth(agent: NodeAgent) -> None:
    """Set `agent.memory_bandwidth` from the probe (once per boot, `bandwidth_this_boot`, in a thread): every
    heartbeat after carries it."""
    config = agent.config
    measured = await trio.to_thread.run_sync(
        functools.partial(bandwidth_this_boot, config.state_dir, config.bandwidth_probe_seconds))
    log.info("memory bandwidth: one core %.1f GB/s, %d cores %.1f GB/s (probe of %.2f s)",
             measured.one_core_bytes_per_second / 1e9, measured.threads, measured.all_cores_bytes_per_second / 1e9,
             measured.seconds)
    agent.memory_bandwidth = measured


def _with_saved_settings(config: AgentConfig) -> tuple[AgentConfig, pb.SlurmRole | None]:
    """`config` changed by the AgentSettings an earlier agent kept (unchanged when there are none or they are
    damaged: logged, and the control plane sends them again on Register), and the Slurm role they held (None:
    none)."""
    try:
        saved = load_agent_settings(config.state_dir)
    except UsageError as exc:
        log.warning("%s", exc)
        return config, None
    if saved is None:
        return config, None
    log.info("applying the agent settings the control plane last sent (kept in %s)", config.state_dir)
    return config.with_settings(saved), (saved.slurm if saved.slurm.daemons else None)


def _lock_state_dir(state_dir) -> int:
    """Hold an exclusive lock on `<state_dir>/agent.lock` for the agent's life (released by the kernel when the
    process dies, even by SIGKILL; engines do not inherit it). Raises UsageError when another agent holds it."""
    path = Path(state_dir) / "agent.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
        os.close(fd)
        raise UsageError(
            f"another agent (pid {holder or 'unknown'}) already runs with state directory {state_dir}; "
            "stop it first, or give this one its own --state-dir"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd


class _Session:
    """One connection's tasks: send the queued messages, beat, and read commands."""

    def __init__(self, agent: NodeAgent, readings: Readings, nvml: Any, health: HealthWatch):
        self.agent = agent
        self.readings = readings
        self.health = health
        self.nvml = nvml
        self._outbox: Any = None  # this connection's Outbox (NodeAgent.open_outbox)
        self._foreign: list = []
        self._foreign_at = -FOREIGN_SCAN_INTERVAL

    def _foreign_engines(self) -> list:
        now = trio.current_time()
        if now - self._foreign_at >= FOREIGN_SCAN_INTERVAL:
            self._foreign = self.agent.supervisor.foreign_engines()
            self._foreign_at = now
        return self._foreign

    async def register(self) -> pb.AgentMessage:
        """Discover the node (in a thread: NVML and nvidia-smi block) and build the Register."""
        agent = self.agent
        config = agent.config
        ours = agent.supervisor.managed_pids()
        discovery = await trio.to_thread.run_sync(
            functools.partial(discover_node, config.weights_path, ours, nvml=self.nvml))
        gpus = offered_gpus(discovery.gpus, config.ignore_gpus)
        agent.node_facts = NodeFacts.from_report(gpus)  # what the build of Python engine installs is chosen from
        skip = ignored_cards(discovery.gpus, config.ignore_gpus)
        # Health goes with Register, so no card a finding takes out is offered bare: read the first time, judged
        # again with the ignored cards after that (no tools run, so the readings' timer does not run on meanwhile).
        health = self.health.judged(skip) if self.health.latest is not None else await self.health.take(skip)
        self.readings.discovered(discovery.gpus.source, skip, config.ignore_gpus)
        self._foreign_at = -FOREIGN_SCAN_INTERVAL
        ignore_warnings = gpus.warnings[len(discovery.gpus.warnings):]
        release_key, release_warnings = await trio.to_thread.run_sync(reporting.release_record)
        rolled_back = await trio.to_thread.run_sync(upgrading.rolled_back_warning, config.state_dir)
        release_warnings = (*release_warnings, *([rolled_back] if rolled_back else []))
        message = agent_message(register=reporting.register_message(
            config.node_id, config.address or "127.0.0.1", discovery.inventory, agent.engines_installed(),
            agent.shard_statuses(self._foreign_engines()), config.labels,
            [*discovery.warnings, *ignore_warnings, *self.readings.telemetry.warnings, *agent.supervisor.warnings,
             *release_warnings],
            gpus=[pb.Gpu(**gpu.pb_fields()) for gpu in gpus.gpus], release_key_id=release_key,
        ))
        message.register.health.CopyFrom(report_message(health))
        message.register.node_secret = agent.node_secret
        return message

    async def heartbeat(self) -> pb.AgentMessage:
        """A Heartbeat with the full shard list and the latest reading (`sampled_at` when it was taken)."""
        agent = self.agent
        reading = await self.readings.current()
        beat = reporting.heartbeat_message(
            reading.samples, agent.shard_statuses(self._foreign_engines()), agent.engines_installed(),
            sorted(agent.installing), gpus=[pb.GpuSample(**g.pb_fields()) for g in reading.gpus],
            engines=reading.engines, sensors=reading.sensors,
        )
        beat.sampled_at = min(beat.time, reading.unix_time)
        beat.training_jobs.extend(sorted(agent.training))  # built and queued with no checkpoint between
        disk = free_bytes_under(agent.config.weights_path)
        if disk is not None:
            beat.disk_free_bytes = disk
        if self.readings.telemetry.available:  # the shared-card verdict is judged on every beat, not every reading
            held = self.readings.telemetry.foreign_pids(agent.supervisor.managed_pids(), self.readings.skip_cards)
            for gpu in beat.gpus:
                del gpu.foreign_pids[:]
                gpu.foreign_pids.extend(held.get(gpu.index, ()))
        health = self.health.report()
        if health is not None:
            beat.health.CopyFrom(report_message(health))
        slurm = agent.slurm.report()
        if slurm is not None:
            beat.slurm.CopyFrom(slurm)
        firewall = firewall_report(agent.firewall.state)
        if firewall is not None:
            beat.firewall.CopyFrom(firewall)
        if agent.memory_bandwidth is not None:
            beat.memory_bandwidth.CopyFrom(pb.MemoryBandwidth(**agent.memory_bandwidth.to_json()))
        return agent_message(heartbeat=beat)

    async def serve(self, link) -> None:
        """Register on `link`, then beat and obey until the link ends (raises WireError) or a restart is asked.
        Messages emitted before this connection are not sent on it: Register and heartbeats carry the state."""
        agent = self.agent
        self._outbox = outbox = agent.open_outbox()
        try:
            await link.send(await self.register())
            log.info("sent Register to the control plane as %s", agent.config.node_id)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(outbox.pump, link)
                nursery.start_soon(self._beat)
                nursery.start_soon(self._wait_restart, nursery.cancel_scope)
                nursery.start_soon(self._wait_register_again, nursery.cancel_scope)
                nursery.start_soon(self._forward_kv_blocks)
                if agent.renewer is not None:  # the node certificate, renewed over this stream when it is due
                    nursery.start_soon(agent.renewer.run, outbox.put)
                async for message in link:
                    await commands.handle(agent, message, link)
                raise WireError("the control plane closed the stream")
        except BaseExceptionGroup as group:
            raise WireError(str(expect_leaves(group, _LINK_ERRORS)[0])) from group
        finally:
            agent.close_outbox(outbox)

    async def _beat(self) -> None:
        while True:
            self._outbox.put(await self.heartbeat())  # to this connection only: each control plane its own beats
            await trio.sleep(self.agent.config.heartbeat_interval)

    async def _forward_kv_blocks(self) -> None:
        """Send this connection the net change of every vLLM shard's blocks (`kv_messages`), at most every
        `KV_BATCH_INTERVAL` seconds: a full copy first, then what changed. A message the outbox drops makes the next
        one for that shard a full copy."""
        watch = self.agent.kv_watch
        sent: dict[str, ShardBlocks] = {}
        while True:
            changed, seen = watch.changed, watch.generation
            messages, after = kv_messages(watch.current(), sent)
            sent = after
            for message in messages:
                if not self._outbox.put(agent_message(kv_blocks=message)):
                    sent.pop(message.shard_id, None)
            if watch.generation == seen:
                await changed.wait()
            await trio.sleep(KV_BATCH_INTERVAL)

    async def _wait_restart(self, scope: trio.CancelScope) -> None:
        await self.agent.restart_requested.wait()
        await self._drain()
        scope.cancel()

    async def _wait_register_again(self, scope: trio.CancelScope) -> None:
        await self.agent.register_again.wait()
        await self._drain()
        scope.cancel()

    async def _drain(self) -> None:
        with trio.move_on_after(2):  # let queued results go out first (the one being sent included)
            while not self._outbox.empty():
                await trio.sleep(0.05)

