"""The connected agents: each one's stream served from Register on, its messages turned into registry updates,
and the commands and log requests sent to it.

`AgentHub.accept(link, peer)` serves one stream (a gRPC stream from `llmgw.wire.serve_agents`, or an in-process
memory link from `local_connector()`); `command(node, timeout, **body)` sends one command and waits for its
answer. Registry changes call `changed(reason)`, so the control plane rebuilds routes and kicks the reconciler.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import asynccontextmanager

import trio

from llmgw import __version__
from llmgw.control.commands import agent_settings
from llmgw.control.registry import FleetRegistry
from llmgw.control.reports import convert_shards, node_from_register
from llmgw.control.sessions import AgentSession, CommandOutcome
from llmgw.errors import TemporaryError, UsageError, WireError
from llmgw.settings.model import Settings
from llmgw.wire import control_message, memory_link_pair, pb

REGISTER_TIMEOUT = 30.0


class AgentHub:
    """Every connected agent, by node id (`sessions`), feeding `registry`.

    `settings()` is the settings in force (None before any), sent to each agent as AgentSettings; `changed(reason)`
    is called when the registry changed in a way planning or routing depends on; `disconnected(reason)` when a
    stream ended. `nursery` must be set (by the control plane's run) before `local_connector` or `push_settings`.
    """

    def __init__(self, registry: FleetRegistry, settings: Callable[[], Settings | None],
                 changed: Callable[[str], None], disconnected: Callable[[str], None]):
        self.registry = registry
        self.sessions: dict[str, AgentSession] = {}
        self.nursery: trio.Nursery | None = None
        self._settings = settings
        self._changed = changed
        self._disconnected = disconnected

    def push_settings(self, settings: Settings) -> None:
        """Send every connected agent its AgentSettings of `settings` (in the background)."""
        if self.nursery is None:
            return
        for session in list(self.sessions.values()):
            self.nursery.start_soon(self._send_agent_settings, session, settings)

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

    async def _send_agent_settings(self, session: AgentSession, settings: Settings) -> None:
        try:
            await session.send(control_message(agent_settings=agent_settings(settings, session.node_id)))
        except TemporaryError:
            pass  # the node is gone; it gets its settings when it registers again

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
        node = node_from_register(register, _peer_host(peer))
        _shards, details = convert_shards(register.shards)
        now = trio.current_time()
        self.registry.register(
            node, now, details=details, os=register.os, arch=register.arch,
            agent_version=register.agent_version, warnings=register.warnings,
        )
        session = AgentSession(link, node.node_id, peer)
        old = self.sessions.get(node.node_id)
        if old is not None:
            old.close()
        self.sessions[node.node_id] = session
        try:
            await session.send(control_message(
                registered=pb.Registered(node_id=node.node_id, control_plane_version=__version__)))
            settings = self._settings()
            if settings is not None:
                await session.send(control_message(agent_settings=agent_settings(settings, node.node_id)))
            self._changed(f"node {node.node_id} registered")
            async for message in link:
                self._on_message(node.node_id, session, message)
        except TemporaryError:
            pass  # the stream broke while sending; handled as a disconnect below
        finally:
            session.close()
            if self.sessions.get(node.node_id) is session:
                del self.sessions[node.node_id]
                self.registry.disconnect(node.node_id, trio.current_time())
                self._disconnected(f"node {node.node_id} disconnected")

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
            plane.nursery.start_soon(plane._accept_local, control_end)
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
        kind = message.WhichOneof("body")
        now = trio.current_time()
        changed = False
        if kind == "heartbeat":
            beat = message.heartbeat
            shards, details = convert_shards(beat.shard_states)
            changed = self.registry.heartbeat(
                node_id, now, shards=shards, details=details,
                engines_installed=beat.engines_installed, engines_installing=beat.engines_installing,
            )
        elif kind == "shard_status":
            shards, details = convert_shards([message.shard_status])
            changed = self.registry.shard_status(node_id, shards[0], now, details[shards[0].shard_id])
        elif kind == "engine_status":
            status = message.engine_status
            changed = self.registry.engine_status(node_id, status.engine, status.state, status.error, now)
        elif kind == "command_result":
            session.deliver_result(message.command_result)
        elif kind == "log_lines":
            session.deliver_logs(message.log_lines)
        elif kind == "register":
            register = message.register
            changed = self.registry.register(
                node_from_register(register, _peer_host(session.peer)), now,
                details=convert_shards(register.shards)[1], os=register.os, arch=register.arch,
                agent_version=register.agent_version, warnings=register.warnings,
            )
        if changed:
            self._changed(f"{kind} from {node_id}")


def _peer_host(peer: str) -> str:
    """"ipv4:10.0.0.5:51234" -> "10.0.0.5"; "ipv6:[::1]:5" -> "::1"; anything else -> "127.0.0.1"."""
    if peer.startswith("ipv4:"):
        return peer[5:].rsplit(":", 1)[0]
    if peer.startswith("ipv6:"):
        return peer[5:].rsplit(":", 1)[0].strip("[]")
    return "127.0.0.1"
