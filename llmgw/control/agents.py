"""The connected agents: each one's stream served from Register on, its messages turned into registry updates,
and the commands and log requests sent to it.

`AgentHub.accept(link, peer)` serves one stream (a gRPC stream from `llmgw.wire.serve_agents`, or an in-process
memory link from `local_connector()`); `command(node, timeout, **body)` sends one command and waits for its
answer. Every message becomes a pure transition of the `ControlState`'s fleet, sent to the control loop with
`update(transition, reason)`; the hub keeps only the open sessions, and the prefix-cache blocks the agents' vLLM
shards hold (`blocks`, a `BlockSnapshot` replaced on each `KvBlocks` message and on a disconnect, see
`llmgw.control.kv_blocks`), handed to `blocks_changed(snapshot)`: they change many times a second and feed only
the gateway's router, so they do not go through the control loop.

Who may speak (issue 25): a Register proves its node id (its node secret, `llmgw.control.node_identity`, or its
client certificate) before it displaces any session; every later message of the stream speaks for that node id
only: a Register again under another id ends the stream, prefix-cache blocks are taken only for replicas the node's
own shards run, and ended Slurm jobs only from the cluster's controller within bounds
(`llmgw.control.report_scope`).

Mixed versions (issue 30): an agent newer than this control plane is refused at Register with a sentence
(`llmgw.control.versions`), sent in `Registered.refusal` before the stream ends; an older one is sent only what its
Register lists it can do (`AgentSession.send`, `llmgw.control.capabilities`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import asynccontextmanager
from types import MappingProxyType
from typing import Any

import trio

from llmgw import __version__
from llmgw.control.ca_rotation import trust_message
from llmgw.control.certificate_renewal import answer_renewal
from llmgw.control.deciding import node_connected
from llmgw.control.events import slurm_jobs_reported
from llmgw.control.health import health_from_message
from llmgw.control.kv_blocks import KV_BLOCKS_PER_REPLICA, BlocksUpdate, apply_block_updates, forget_node
from llmgw.control.node_identity import NodeIdentities
from llmgw.control.report_scope import blocks_problem, slurm_report_problem
from llmgw.control.reports import (
    bandwidth_from_heartbeat, check_register, convert_shards, node_from_register, readings_from_heartbeat,
)
from llmgw.control.sessions import AgentSession, CommandOutcome
from llmgw.control.slurm_usage import slurm_usage
from llmgw.control.state import ControlState
from llmgw.control.training import (
    KeepTrainingPiece, Report, training_piece_received, training_reported, training_seen,
)
from llmgw.control.versions import newer_agent_refusal
from llmgw.errors import TemporaryError, UsageError, WireError
from llmgw.identity import EngineState
from llmgw.routes import BlockSnapshot
from llmgw.wire import PROTOCOL_VERSION, control_message, memory_link_pair, pb

log = logging.getLogger("llmgw.control")

REGISTER_TIMEOUT = 30.0


Update = Callable[..., None]
"""`ControlLoop.update(transition, reason, origin_unix=None)`."""


def blocks_update(message: pb.KvBlocks) -> BlocksUpdate:
    """An agent's `KvBlocks` message as the control plane's `BlocksUpdate` (llmgw.control.kv_blocks). Pure."""
    return BlocksUpdate(replica_id=message.replica_id, full=message.full, stored=tuple(message.stored),
                        removed=tuple(message.removed), block_size=message.block_size,
                        hash_algorithm=message.hash_algorithm, hash_seed=message.hash_seed)


def _registered(register, peer_host: str, now: float):
    """The transition of a Register: the node recorded as connected, its earlier acknowledgements forgotten."""
    node = node_from_register(register, peer_host)
    details = convert_shards(register.shards)[1]
    health = health_from_message(register.health) if register.HasField("health") else None

    def transition(state: ControlState) -> tuple[ControlState, bool]:
        fleet, _ = state.fleet.register(
            node, now, details=details, os=register.os, arch=register.arch, agent_version=register.agent_version,
            warnings=register.warnings, engines_installable=register.engines_installable, features=register.features,
            health=health, release_key=register.release_key_id,
        )
        return node_connected(state.with_fleet(fleet), node.node_id), True

    return transition


class AgentHub:
    """Every connected agent, by node id (`sessions`); what they say goes to `update(transition, reason)`.

    `nursery` must be set (by the control plane's run) before `local_connector`. `identities` proves each
    Register (`llmgw.control.node_identity.NodeIdentities`; the control plane's opening gives it the store, the
    default keeps them in memory). `kv_cap()` is the most block hashes one replica may hold now (llmgw.yaml
    `limits.kv_blocks_per_replica`).
    """

    def __init__(self, update: Update, blocks_changed: Callable[[BlockSnapshot], None] = lambda snapshot: None,
                 identities: NodeIdentities | None = None, kv_cap: Callable[[], int] = lambda: KV_BLOCKS_PER_REPLICA):
        self.sessions: dict[str, AgentSession] = {}
        self.nursery: trio.Nursery | None = None
        self._update = update
        self.blocks = BlockSnapshot()
        self.blocks_changed = blocks_changed
        self.identities = identities if identities is not None else NodeIdentities()
        self.kv_cap = kv_cap
        self._refusals: dict[tuple[str, str], None] = {}
        self.ca: Any = None  # the agents' CA (`llmgw.wire.CertificateAuthority`) under --tls: renews certificates
        self.ca_rotation: dict[str, Any] | None = None  # a CA rotation's progress (`llmgw.control.ca_rotation`)

    def refused(self, node_id: str, sentence: str) -> None:
        """Log a report of `node_id` that was left out (`sentence`), once per node and sentence (most recent
        1,000 remembered): an agent repeats a report every beat."""
        key = (node_id, sentence)
        if key in self._refusals:
            return
        self._refusals[key] = None
        if len(self._refusals) > 1000:
            del self._refusals[next(iter(self._refusals))]
        log.warning("%s", sentence)

    def _set_blocks(self, snapshot: BlockSnapshot) -> None:
        if snapshot is not self.blocks:
            self.blocks = snapshot
            self.blocks_changed(snapshot)

    async def command(self, node_id: str, timeout: float, **body) -> CommandOutcome:
        """Send one command to `node_id` and wait up to `timeout` seconds for its answer.

        Raises: TemporaryError when the node is not connected, goes away or does not answer in time.
        """
        session = self.sessions.get(node_id)
        if session is None:
            raise TemporaryError(f"node {node_id} is not connected.")
        return await session.command(timeout, **body)

    async def logs(self, node_id: str, shard_id: str, lines: int) -> list[str]:
        """The last `lines` log lines of `shard_id` ("" for the agent's own) on `node_id`.

        Raises: UsageError for an unknown or disconnected node; TemporaryError when it does not answer.
        """
        session = self.sessions.get(node_id)
        if session is None:
            known = ", ".join(sorted(self.sessions)) or "none"
            raise UsageError(f"node {node_id!r} is not connected (connected nodes: {known}).")
        return await session.request_logs(shard_id, lines)

    async def accept(self, link, peer: str) -> None:
        """Serve one agent's stream until it ends: Register first, then heartbeats, shard states, answers.

        `link` is the control plane's end (`llmgw.wire.memory_link_pair()[1]` for an in-process agent).
        Raises: WireError when the first message is not Register within 30 s.
        """
        first = None
        with trio.move_on_after(REGISTER_TIMEOUT):
            first = await link.receive()
        if first is None or first.WhichOneof("body") != "register":  # type: ignore[union-attr]
            raise WireError("the agent's first message must be Register; closing its stream.")
        register = first.register
        if not register.node_id:
            raise WireError("the agent's Register has no node_id; closing its stream.")
        certified = getattr(link, "peer_certificate_name", None)
        if certified and certified != register.node_id:
            raise WireError(f"the agent registered as {register.node_id!r} but its certificate names {certified!r}; "
                            "a node may only register under the id it joined with.")
        check_register(register, _peer_host(peer))  # before anything: a refused node displaces no session
        refusal = newer_agent_refusal(register.node_id, register.agent_version, first.protocol, __version__,
                                      PROTOCOL_VERSION)
        if refusal is not None:  # told to the agent (its log and its exit say it), then the stream ends
            log.warning("%s", refusal)
            with trio.move_on_after(REGISTER_TIMEOUT):
                await link.send(control_message(registered=pb.Registered(
                    node_id=register.node_id, control_plane_version=__version__, refusal=refusal)))
            raise WireError(refusal)
        await self.identities.prove(register.node_id, register.node_secret, certified=bool(certified))
        node_id = register.node_id
        session = AgentSession(link, node_id, peer, register.features, register.agent_version)
        session.replicas = _replicas_run(register.shards)
        old = self.sessions.get(node_id)
        if old is not None:
            old.close()
        self.sessions[node_id] = session
        try:
            await session.send(control_message(
                registered=pb.Registered(node_id=node_id, control_plane_version=__version__)))
            if certified and self.ca is not None:  # the CAs to trust (a rotation under way: renew at once)
                await session.send(trust_message(self.ca))
            self._update(_registered(register, _peer_host(peer), trio.current_time()), f"node {node_id} registered")
            async for message in link:
                self._on_message(node_id, session, message)
        except TemporaryError:
            pass  # the stream broke while sending; handled as a disconnect below
        finally:
            session.close()
            if self.sessions.get(node_id) is session:
                del self.sessions[node_id]
                self._set_blocks(forget_node(self.blocks, node_id))
                now = trio.current_time()
                self._update(lambda s: (node_connected(s.with_fleet(s.fleet.disconnect(node_id, now)[0]), node_id),
                                        True), f"node {node_id} disconnected")

    def local_connector(self):
        """A `connect()` factory for `llmgw.agent.run_agent` that links an in-process agent to this plane.

        Each call makes a `memory_link_pair()` and serves its control end with `accept` in `nursery`
        (so the control plane must be running). Used by `llmgw up` and in-process tests.
        """
        plane = self

        @asynccontextmanager
        async def connect():
            if plane.nursery is None:
                raise WireError("the control plane is not running yet; start it before its local agent.")
            agent_end, control_end = memory_link_pair()
            try:
                plane.nursery.start_soon(plane._accept_local, control_end)
            except RuntimeError as exc:  # its nursery is closed: that control plane has stopped
                raise WireError("the control plane has stopped; the agent keeps trying.") from exc
            try:
                yield agent_end
            finally:
                with trio.move_on_after(1.0, shield=True):
                    await agent_end.aclose()

        return connect

    async def _accept_local(self, link) -> None:
        try:
            await self.accept(link, "memory")
        except (WireError, trio.EndOfChannel, trio.ClosedResourceError):
            pass  # the local agent went away; it reconnects through the connector
        finally:
            with trio.move_on_after(1.0, shield=True):
                await link.aclose()

    def _on_message(self, node_id: str, session: AgentSession, message) -> None:
        """One message of `node_id`'s stream, handled by the one function its kind has in `MESSAGES` (a kind this
        control plane does not know, from a newer agent, is left alone): an event becomes a transition on the loop's
        channel, an answer goes to the session waiting for it."""
        kind = message.WhichOneof("body")
        handler = MESSAGES.get(kind)
        if handler is None:
            return
        event = handler(self, node_id, session, getattr(message, kind), trio.current_time())
        if event is not None:
            transition, origin = event
            self._update(transition, f"{kind} from {node_id}", origin)


def _replicas_run(statuses) -> frozenset[str]:
    """The replica ids of pb ShardStatus `statuses`, engines llmgw did not start left out."""
    return frozenset(status.replica_id for status in statuses if status.replica_id and not status.foreign)


def _heartbeat(hub: AgentHub, node_id: str, session: AgentSession, beat, now: float):
    shards, details = convert_shards(beat.shard_states)
    session.replicas = _replicas_run(beat.shard_states)
    readings = readings_from_heartbeat(beat, now)
    installed, installing = tuple(beat.engines_installed), tuple(beat.engines_installing)
    origin = float(beat.time) or None  # the agent's send time: the loop keeps the latency to its fold
    health = health_from_message(beat.health) if beat.HasField("health") else None
    steps = beat.slurm.job_steps if beat.HasField("slurm") else 0
    slurm = slurm_summary(beat.slurm) if beat.HasField("slurm") else None
    firewall = (MappingProxyType({"digest": beat.firewall.digest, "error": beat.firewall.error,
                                  "rolled_back": beat.firewall.rolled_back})
                if beat.HasField("firewall") else None)
    bandwidth = bandwidth_from_heartbeat(beat)
    if beat.HasField("slurm") and (beat.slurm.finished_jobs or beat.slurm.finished_until):
        hub._update(_slurm_jobs(node_id, beat.slurm, hub.refused), f"ended Slurm jobs from {node_id}")

    training = frozenset(beat.training_jobs)

    def transition(state: ControlState) -> tuple[ControlState, bool]:
        fleet, changed = state.fleet.heartbeat(
            node_id, now, shards=shards, details=details, engines_installed=installed,
            engines_installing=installing, readings=readings, health=health, slurm_job_steps=steps, slurm=slurm,
            firewall=firewall, memory_bandwidth=bandwidth)
        if state.training.jobs:  # a job its agent no longer runs failed with it
            state = training_seen(state, node_id, training, time.time())
        return state.with_fleet(fleet), changed

    return transition, origin


def _shard_status(hub: AgentHub, node_id: str, session: AgentSession, status, now: float):
    shards, details = convert_shards([status])
    session.replicas = session.replicas | _replicas_run([status])  # a shard starting: its blocks may come first
    shard, detail = shards[0], details[shards[0].shard_id]

    def transition(state: ControlState) -> tuple[ControlState, bool]:
        fleet, changed = state.fleet.shard_status(node_id, shard, now, detail)
        return state.with_fleet(fleet), changed

    return transition, None


def _engine_status(hub: AgentHub, node_id: str, session: AgentSession, status, now: float):
    try:
        engine_state = EngineState(status.state)
    except ValueError:  # a state a newer agent knows: the next heartbeat's engine lists still tell
        log.info("node %s reported engine %s in state %r, which this control plane does not know", node_id,
                 status.engine, status.state)
        return None
    engine, error = status.engine, status.error

    def transition(state: ControlState) -> tuple[ControlState, bool]:
        fleet, changed = state.fleet.engine_status(node_id, engine, engine_state, error, now)
        return state.with_fleet(fleet), changed

    return transition, None


def _kv_blocks(hub: AgentHub, node_id: str, session: AgentSession, blocks, now: float) -> None:
    """Prefix-cache blocks: only for a replica the node's own shards run, capped per replica (`hub.kv_cap()`)."""
    if not blocks.replica_id:
        return
    held = hub.blocks.replicas.get(blocks.replica_id)
    removal = blocks.full and not blocks.stored and not blocks.block_size  # the engine stopped (kv_blocks.py)
    problem = blocks_problem(node_id, blocks.replica_id, session.replicas,
                             removes_its_own=removal and held is not None and held.node_id == node_id)
    if problem is not None:
        hub.refused(node_id, problem)
        return
    cap = hub.kv_cap()
    after = apply_block_updates(hub.blocks, node_id, [blocks_update(blocks)], cap=cap)
    if blocks.stored and blocks.replica_id not in after.replicas:
        hub.refused(node_id, f"node {node_id!r} sent more than {cap} prefix-cache blocks for replica "
                             f"{blocks.replica_id!r} (limits.kv_blocks_per_replica): its map is dropped until a "
                             "full update within the cap")
    hub._set_blocks(after)


def _register_again(hub: AgentHub, node_id: str, session: AgentSession, register, now: float):
    """A Register on a stream that registered already: only for the same node id (it proved that one)."""
    if register.node_id != node_id:
        raise WireError(f"the stream of node {node_id!r} sent a Register as {register.node_id!r}; a stream speaks "
                        "for the node it registered first only. Closing it.")
    session.replicas = _replicas_run(register.shards)
    return _registered(register, _peer_host(session.peer), now), None


def _renew_certificate(hub: AgentHub, node_id: str, session: AgentSession, request, now: float) -> None:
    """RenewCertificate: checked, signed and answered on this stream by a task (`llmgw.control.certificate_renewal`),
    so the stream's other messages are not held up by the signature and the store."""
    if hub.nursery is not None:
        hub.nursery.start_soon(answer_renewal, hub.ca, hub.identities, session, node_id, request)


MESSAGES: dict[str, Callable[..., Any]] = {
    "heartbeat": _heartbeat,
    "shard_status": _shard_status,
    "engine_status": _engine_status,
    "kv_blocks": _kv_blocks,
    "register": _register_again,
    "command_result": lambda hub, node_id, session, result, now: session.deliver_result(result),
    "log_lines": lambda hub, node_id, session, lines, now: session.deliver_logs(lines),
    "fabric_test_output": lambda hub, node_id, session, output, now: session.deliver_fabric_test(output),
    "renew_certificate": _renew_certificate,
    "training_report": lambda hub, node_id, session, report, now: (training_reported(node_id, Report(
        report.job_id, report.state, report.step, report.steps, report.loss, tuple(report.losses),
        report.peak_memory_bytes, report.seconds, report.error), time.time()), None),
    "training_piece": lambda hub, node_id, session, piece, now: (training_piece_received(node_id, KeepTrainingPiece(
        piece.job_id, piece.name, piece.index, piece.count, bytes(piece.data), piece.size, piece.sha256)), None),
}
"""An agent message's kind (the `AgentMessage.body` field set) -> its handler `(hub, node id, session, body, now on
the control plane's clock)`, which returns (the event's transition, the agent's send time in unix seconds or None),
or None when it handled the message without one (an answer to a command goes to the session waiting for it;
prefix-cache blocks go to the gateway feed)."""


def _slurm_jobs(node_id: str, report: pb.SlurmReport, refused: Callable[[str, str], None] = lambda n, s: None):
    """The transition of a heartbeat's ended Slurm jobs (the controller's): each priced into a usage record
    (llmgw.control.slurm_usage) under the settings in force, then `slurm_jobs_reported` (which asks for a
    `RecordSlurmUsage` of those not recorded yet). Nothing before settings are in force, nor when the report is
    not the controller's or out of bounds (`llmgw.control.report_scope.slurm_report_problem`, told to
    `refused(node_id, sentence)`): then no usage is recorded and the cursor stays."""
    jobs, until, cluster_given = tuple(report.finished_jobs), report.finished_until, report.cluster_name
    unix_now = time.time()

    def transition(state: ControlState):
        settings = state.settings
        if settings is None:
            return state, False
        cluster = cluster_given or settings.slurm.cluster_name
        problem = slurm_report_problem(node_id, report, settings.slurm, state.slurm.cursors.get(cluster, 0.0),
                                       unix_now)
        if problem is not None:
            refused(node_id, problem)
            return state, False
        priced = tuple(slurm_usage(job, cluster, node_id, settings.cluster.gpu_hour_cost) for job in jobs)
        return slurm_jobs_reported(state, node_id, cluster, priced, until)

    return transition


def slurm_summary(report: pb.SlurmReport) -> dict[str, Any]:
    """A heartbeat's SlurmReport as the status document shows it: {"daemons": {name: {"state", "pid", "restarts",
    "error"?}}, "version", "node_state", "node_reason", "job_steps", "lent", "users"? (Linux users llmgw made there),
    "warnings"?}; the ended jobs are left out (they go to usage)."""
    daemons = {}
    for daemon in report.daemons:
        entry: dict[str, Any] = {"state": daemon.state, "pid": daemon.pid, "restarts": daemon.restarts}
        if daemon.error:
            entry["error"] = daemon.error
        daemons[daemon.name] = entry
    summary: dict[str, Any] = {"daemons": daemons, "version": report.version, "node_state": report.node_state,
                               "node_reason": report.node_reason, "job_steps": report.job_steps, "lent": report.lent}
    if report.users:
        summary["users"] = report.users
    if report.warnings:
        summary["warnings"] = list(report.warnings)
    return summary


def _peer_host(peer: str) -> str:
    """"ipv4:10.0.0.5:51234" -> "10.0.0.5"; "ipv6:[::1]:5" -> "::1"; anything else -> "127.0.0.1"."""
    if peer.startswith("ipv4:"):
        return peer[5:].rsplit(":", 1)[0]
    if peer.startswith("ipv6:"):
        return peer[5:].rsplit(":", 1)[0].strip("[]")
    return "127.0.0.1"
