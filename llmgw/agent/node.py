"""The agent's state between connections (`NodeAgent`) and each connection's queue of messages (`Outbox`).

`NodeAgent` holds what the commands of `llmgw.agent.commands` act on (each handler gets it and a `Command`): the
config (replaced by AgentSettings), the supervisor, the shards not yet running, the engine installs under way, the
fence, Slurm's keeper, the KV-cache watch and the tracing. What it reports goes through `NodeAgent.emit` to every
open connection's outbox (dropped when none takes it: heartbeats carry the full state anyway).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import trio
from google.protobuf.message import Message

from llmgw.agent import reporting, upgrading
from llmgw.agent.config import AgentConfig, installed_engines
from llmgw.agent.engine_checks import EngineChecks
from llmgw.agent.fencing import Fence, load_token
from llmgw.agent.node_secret import load_or_create_secret
from llmgw.agent.renewal import CertificateRenewer
from llmgw.agent.kv_watch import KvWatch
from llmgw.agent.logs import LogRing
from llmgw.agent.shards import ShardView
from llmgw.agent.firewall import FirewallKeeper
from llmgw.agent.slurm import SlurmKeeper, SlurmLayout
from llmgw.agent.supervisor import Supervisor
from llmgw.agent.tracing import AgentTracing, open_agent_tracing
from llmgw.engines.builds import NodeFacts
from llmgw.tools.memory_bandwidth import MemoryBandwidth
from llmgw.identity import EngineState
from llmgw.wire import AgentLink, agent_message, pb

log = logging.getLogger("llmgw.agent")

OUTBOX_MESSAGES = 512


@dataclass(frozen=True)
class Command:
    """One ControlMessage as its handler (`llmgw.agent.commands.COMMANDS`) gets it: `kind` the name of its body
    (the `body` oneof's field, e.g. "start_shard"; None for a body this agent does not know), `body` that message
    (None with it), `id` its `command_id` ("" for a notice, which is not answered), `link` the connection it came
    on (answers go through `NodeAgent.emit`, to every connection; only Restart answers on `link` itself)."""

    kind: str | None
    body: Message | None
    id: str
    link: AgentLink


CommandHandler = Callable[["NodeAgent", Command], Awaitable[None]]
"""Acts on one command: answers it (a CommandResult when it has an id, see `NodeAgent.result`) or starts a task
of `NodeAgent.nursery` that answers it later. A failure of the command is a sentence in its answer, never raised;
only Restart, which answers on its link, raises what `link.send` raises (the connection is gone)."""


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
        self.training: dict[str, trio.CancelScope] = {}  # training jobs under way, by job id (training_commands)
        self.restart_requested = trio.Event()
        self.wiped = False  # WipeNode took llmgw off the host: the agent stops instead of restarting
        # Set when AgentSettings change what Register says (ignore_gpus): the session ends and the agent connects
        # again at once, so the control plane offers only the GPUs it may. Replaced by the runtime once acted on.
        self.register_again = trio.Event()
        # Set (and replaced) on every AgentSettings, so timers waiting on an interval pick up a new one at once.
        self.settings_changed = trio.Event()
        self.engine_checks = EngineChecks()
        self.fence = Fence(load_token(config.state_dir))  # the newest leader-lease token seen (llmgw.agent.fencing)
        self.node_secret = load_or_create_secret(config.state_dir)  # proves this node at Register (node_secret.py)
        # renews the node certificate over a stream before it expires (llmgw.agent.renewal); None without TLS
        self.renewer = CertificateRenewer(config.tls_dir, config.node_id,
                                          lambda: self.config.certificate_renew_fraction,
                                          lambda: self.node_secret) if config.tls_dir is not None else None
        self.slurm = SlurmKeeper(SlurmLayout(Path(config.state_dir) / "slurm", users_prefix=config.slurm_users_prefix),
                                 nursery, programs=dict(config.slurm_programs) or None)  # Slurm's daemons (issue 15)
        self.firewall = FirewallKeeper(nursery)  # llmgw's nftables table (issue 29)
        self.kv_watch = KvWatch(nursery)  # each vLLM shard's KV-cache events (llmgw.agent.kv_watch)
        # The GPUs and driver discovery found (set at each Register); the build of vLLM and SGLang is chosen from
        # them (llmgw.engines.builds). None until then: Python engines install as engines.yaml names them.
        self.node_facts: NodeFacts | None = None
        self.memory_bandwidth: MemoryBandwidth | None = None  # the probe's, once per boot (llmgw.agent.bandwidth)
        self.transfer: upgrading.Transfer | None = None  # a release being received (llmgw.agent.upgrade_command)
        # where releases are installed (None: not a release install, UpgradeAgent is refused); tests replace it
        self.upgrade_layout: Callable[[], upgrading.InstallLayout | None] = upgrading.running_layout

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

    def set_pending(self, view: ShardView) -> None:
        """Keep `view` as a shard the supervisor does not run (being prepared, failed before it ran) and report it."""
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
            status = pb.EngineStatus(engine=key, state=EngineState.FAILED.value, error=reason)
            self.emit(agent_message(engine_status=status))

    async def check_engines_periodically(self) -> None:
        """`check_engines` every `config.engine_check_interval` seconds (read each time: AgentSettings may change
        the engines directory). The first check is the caller's, at start."""
        while True:
            await trio.sleep(self.config.engine_check_interval)
            await self.check_engines()

    def result(self, command_id: str, error: str = "") -> None:
        """Emit the CommandResult of `command_id`: ok when `error` is "", else not ok with that sentence."""
        self.emit(agent_message(command_result=pb.CommandResult(command_id=command_id, ok=not error, error=error)))

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
