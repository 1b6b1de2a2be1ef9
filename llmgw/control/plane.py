"""`ControlPlane`: the settings watcher, the reconciler, the agents' service, the admin API and the gateway, in
one trio nursery.

    plane = ControlPlane(ControlConfig(repo=".state/settings.git", state_dir=Path(".state")))
    async with trio.open_nursery() as nursery:
        await nursery.start(plane.run)            # returns once every listener is bound
        await nursery.start(run_agent, agent_config, plane.local_connector())   # an in-process agent (`llmgw up`)
        print(plane.gateway_url, plane.admin_url, plane.admin_token)

The pieces talk through plain calls on one trio thread: an agent's message updates the registry and kicks the
reconciler; a new settings commit kicks it too; every pass rebuilds the routing table and queues an audit commit
when something changed.
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from llmgw import __version__
from llmgw.control.agents import AgentHub
from llmgw.control.applying import apply
from llmgw.control.audit import AuditWriter, audit_message, audit_snapshot, state_changes, status_document
from llmgw.control.commands import install_engine, platform_of, start_shard, stop_shard
from llmgw.control.keys import (
    REPLICA_KEY_SECRET, WEBHOOK_SECRET, SecretResolver, replica_key,
)
from llmgw.control.reconciling import PassRecord, Reconciler
from llmgw.control.registry import FleetRegistry
from llmgw.control.reports import fleet_for
from llmgw.control.routing import build_route_table
from llmgw.control.watching import SettingsWatcher
from llmgw.errors import EngineError, UsageError
from llmgw.gateway import Gateway
from llmgw.plan.types import Action, ActionKind, Fleet, Plan
from llmgw.routes import RouteTable
from llmgw.settings import NOTIFY_URL_KEY
from llmgw.settings.model import Listener, Settings
from llmgw.store import open_store
from llmgw.wire import serve_agents

ADMIN_TOKEN_FILE = "admin-token"
ADMIN_URL_FILE = "admin-url"



@dataclass(frozen=True)
class ControlConfig:
    """How to run a control plane.

    `repo`: the settings repository, a local path (bare or not) or a URL (fetched into
    `<state_dir>/settings-mirror.git`). `state_dir`: where the control plane keeps its files (created).
    `store`: a Store, a store URL/path, or None for `<state_dir>/llmgw.sqlite3`. `admin_token`: the token the
    admin API accepts besides the store's admin tokens (None: read `<state_dir>/admin-token`, creating it from
    the store the first time). `secrets_dir`: named secrets (None: `<state_dir>/secrets`). Listener overrides
    replace llmgw.yaml's (port 0 picks a free port; the bound ports are on the ControlPlane). Interval
    overrides (seconds) replace llmgw.yaml's `poll_interval`, `reconcile_interval`, `node_lost_after`.
    `lease_seconds`: how long the leader lease in the store lasts (renewed every third of it); only the control
    plane holding it sends commands and writes audit commits, so several can share one store.
    `tls`: True serves agents with mutual TLS under the CA in `<state_dir>/ca` (created), with a server certificate
    for `tls_hostnames` (default: the agents' listener host, localhost, 127.0.0.1), and answers Join on `join_port`
    (0: a free port) so nodes get certificates with one-time tokens (`create_join_token`). `agent_tls`: a
    `llmgw.wire.ServerTls` of your own instead (no Join). `gateway`: False runs no gateway.
    """

    repo: str
    state_dir: Path
    branch: str = "main"
    store: Any = None
    admin_token: str | None = None
    secrets_dir: Path | None = None
    gateway_listener: Listener | None = None
    admin_listener: Listener | None = None
    agents_listener: Listener | None = None
    poll_interval: float | None = None
    reconcile_interval: float | None = None
    node_lost_after: float | None = None
    agent_tls: Any = None
    tls: bool = False
    tls_hostnames: tuple[str, ...] = ()
    join_port: int = 0
    gateway: bool = True
    set_notify_url: bool = True
    lease_seconds: float = 15.0


def check_listeners_free(listeners: dict[str, Listener]) -> None:
    """Refuse to start when a listener's address is taken, before anything is started.

    Binds each (host, port) once with SO_REUSEADDR, as hypercorn and gRPC do, and closes it again; port 0 is
    skipped. Raises UsageError naming the listener, the address and how to pick another.
    """
    import errno
    import socket

    for name, where in listeners.items():
        if where.port == 0:
            continue
        family = socket.AF_INET6 if ":" in where.host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((where.host, where.port))
            except OSError as exc:
                why = "is in use (another llmgw?)" if exc.errno == errno.EADDRINUSE else f"cannot be used: {exc.strerror}"
                raise UsageError(
                    f"the {name} listener {where.host}:{where.port} {why}; stop what holds it, or choose another "
                    f"address with --{name} HOST:PORT or listeners.{name} in llmgw.yaml (port 0 picks a free one)."
                ) from exc


class ControlPlane:
    """One control plane. Build it, then `await nursery.start(plane.run)`; attributes filled once started:
    `admin_url`, `admin_port`, `gateway_url`, `gateway_port`, `agents_port`, `admin_token`, `store`, `gateway`.
    """

    def __init__(self, config: ControlConfig):
        self.config = config
        self.state_dir = Path(config.state_dir)
        self.secrets = SecretResolver(config.secrets_dir or self.state_dir / "secrets")
        self.registry = FleetRegistry(lost_after=config.node_lost_after or 30.0)
        self.watcher = SettingsWatcher(
            config.repo, config.branch, self.state_dir / "settings-mirror.git", on_change=self._settings_changed,
            on_rejected=lambda: self.reconciler.kick("settings head rejected"),
        )
        self.agents = AgentHub(self.registry, self._settings, self._changed,
                               lambda reason: self.reconciler.kick(reason))
        self.reconciler = Reconciler(
            self._settings, self._fleet, self._execute, self._after_pass, allow_empty=self._allow_empty,
            may_act=self._may_act,
        )
        self.audit = AuditWriter(self.watcher.repo_path)
        self.passes: deque[PassRecord] = deque(maxlen=100)
        self.apply_lock = trio.Lock()
        self.apply_holder: str | None = None
        self.store: Any = None
        self.gateway: Gateway | None = None
        self.table = RouteTable()
        self.admin_token = ""
        self.admin_url = self.gateway_url = ""
        self.admin_port = self.gateway_port = self.agents_port = 0
        self.join_port: int | None = None
        self.ca: Any = None
        self._engine_secret = b""
        self.allow_empty_commit: str | None = None
        self._last_snapshot: dict | None = None
        self._nursery: trio.Nursery | None = None
        self.started_at = time.time()
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self.leader = False
        self.leader_holder: str | None = None

    # -- running ------------------------------------------------------------------------------------------

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Run every part until cancelled. `task_status.started(self)` once all listeners are bound.

        Raises: StoreError when the store cannot be opened; WireError / OSError when a port cannot be bound.
        """
        from llmgw.control.admin import serve_admin

        self.state_dir.mkdir(parents=True, exist_ok=True)
        store = self.config.store
        if store is None or isinstance(store, (str, Path)):
            store = open_store(store or self.state_dir / "llmgw.sqlite3")
        self.store = store
        self._replica_secret = store.get_or_create_secret(REPLICA_KEY_SECRET)
        self.admin_token = self._load_admin_token()
        await self.watcher.poll()
        settings = self.watcher.state.settings
        cluster = settings.cluster if settings else None
        self._apply_intervals(settings)

        def listener(override: Listener | None, name: str, default: Listener) -> Listener:
            return override or (getattr(cluster, name) if cluster else default)

        agents = listener(self.config.agents_listener, "agents", Listener(port=8082))
        admin = listener(self.config.admin_listener, "admin", Listener(port=8081))
        gateway = listener(self.config.gateway_listener, "gateway", Listener(port=8080))
        check_listeners_free(
            {"agents": agents, "admin": admin, **({"gateway": gateway} if self.config.gateway else {})}
        )
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = self.agents.nursery = nursery
                tls, join = self.config.agent_tls, None
                if self.config.tls and tls is None:
                    from llmgw.wire import CertificateAuthority

                    self.ca = join = CertificateAuthority.load_or_create(self.state_dir / "ca")
                    names = self.config.tls_hostnames or tuple(dict.fromkeys((agents.host, "localhost", "127.0.0.1")))
                    tls = self.ca.server_tls(list(names))
                bound = await nursery.start(
                    lambda task_status: serve_agents(
                        self.accept_agent, agents.host, agents.port, tls=tls, join=join, join_port=self.config.join_port,
                        task_status=task_status,
                    )
                )
                self.agents_port = int(bound)
                self.join_port = getattr(bound, "join_port", None)
                self.admin_port = await nursery.start(serve_admin, self, admin.host, admin.port)
                self.admin_url = f"http://{_url_host(admin.host)}:{self.admin_port}"
                if self.config.gateway:
                    self.gateway = Gateway(store, self.table)
                    self.gateway_port = await nursery.start(self.gateway.serve, gateway.host, gateway.port)
                    self.gateway_url = f"http://{_url_host(gateway.host)}:{self.gateway_port}"
                self._write_state_files()
                await self._renew_lease()
                nursery.start_soon(self._hold_lease)
                await nursery.start(self.audit.run)
                await nursery.start(self.reconciler.run, self._reconcile_interval)
                nursery.start_soon(self.watcher.run, self._poll_interval)
                nursery.start_soon(self._expire_nodes)
                self._rebuild_table()
                self.reconciler.kick("start")
                task_status.started(self)
        finally:
            with trio.move_on_after(3.0, shield=True):
                await self.audit.write_pending()
            if self.leader:
                store.release_lease("llmgw-reconciler", self.holder)
            if self.config.store is None or isinstance(self.config.store, (str, Path)):
                store.close()

    def _load_admin_token(self) -> str:
        if self.config.admin_token:
            return self.config.admin_token
        path = self.state_dir / ADMIN_TOKEN_FILE
        if path.is_file() and path.read_text().strip():
            return path.read_text().strip()
        token = self.store.create_admin_token()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(token + "\n")
        return token

    def _write_state_files(self) -> None:
        (self.state_dir / ADMIN_URL_FILE).write_text(self.admin_url + "\n")
        if self.config.set_notify_url and not self.watcher.remote:
            import pygit2

            try:
                repo = pygit2.Repository(str(self.watcher.repo_path))
                repo.config[NOTIFY_URL_KEY] = f"{self.admin_url}/api/v1/hooks/git"
            except pygit2.GitError:
                pass  # not a repository yet: the watcher reports it; the hook keeps polling instead

    def _apply_intervals(self, settings: Settings | None) -> None:
        if self.config.node_lost_after is None and settings is not None:
            self.registry.lost_after = settings.cluster.node_lost_after

    def _poll_interval(self) -> float:
        settings = self.watcher.state.settings
        return self.config.poll_interval or (settings.cluster.poll_interval if settings else 2.0)

    def _reconcile_interval(self) -> float:
        settings = self.watcher.state.settings
        return self.config.reconcile_interval or (settings.cluster.reconcile_interval if settings else 10.0)

    async def _renew_lease(self) -> None:
        lease = self.config.lease_seconds
        held = await trio.to_thread.run_sync(self.store.acquire_lease, "llmgw-reconciler", self.holder, lease)
        holder = self.holder if held else await trio.to_thread.run_sync(self.store.lease_holder, "llmgw-reconciler")
        changed = held != self.leader
        self.leader, self.leader_holder = held, holder
        if changed:
            self.reconciler.kick("became leader" if held else "lost the leader lease")

    async def _hold_lease(self) -> None:
        while True:
            await trio.sleep(self.config.lease_seconds / 3)
            await self._renew_lease()

    def _may_act(self) -> str | None:
        if self.leader:
            return None
        return (f"another control plane ({self.leader_holder or 'unknown'}) holds the leader lease; "
                "this one plans and reports but sends nothing")

    async def _expire_nodes(self) -> None:
        while True:
            await trio.sleep(min(1.0, max(0.05, self.registry.lost_after / 4)))
            lost = self.registry.expire(trio.current_time())
            if lost:
                self._changed(f"node {', '.join(lost)} lost")

    # -- state as the parts see it -----------------------------------------------------------------------

    def _settings(self) -> Settings | None:
        return self.watcher.state.settings

    def _fleet(self) -> Fleet:
        return fleet_for(self.registry.fleet(), self.watcher.state.settings)

    def _allow_empty(self) -> bool:
        settings = self.watcher.state.settings
        return settings is not None and settings.commit is not None and settings.commit == self.allow_empty_commit

    def replica_key(self, replica_id: str) -> str:
        """The replica key of `replica_id` (HMAC-SHA256 of it under the store's "engine-key" secret, hex)."""
        return replica_key(self._replica_secret, replica_id)

    def webhook_secret(self) -> bytes | None:
        """The forge webhook secret (named secret "webhook"), or None when none is configured."""
        value = self.secrets.get(WEBHOOK_SECRET)
        return value.encode() if value else None

    def _rebuild_table(self) -> None:
        table = build_route_table(self.watcher.state.settings, self._fleet(), self.replica_key, self.secrets.get)
        if table != self.table:
            self.table = table
            if self.gateway is not None:
                self.gateway.set_table(table)

    def _changed(self, reason: str) -> None:
        self._rebuild_table()
        self.reconciler.kick(reason)

    def _settings_changed(self) -> None:
        settings = self.watcher.state.settings
        self._apply_intervals(settings)
        self._changed(f"settings {settings.commit[:12] if settings and settings.commit else ''}")
        if settings is not None:
            self.agents.push_settings(settings)

    # -- agents -------------------------------------------------------------------------------------------

    async def accept_agent(self, link, peer: str) -> None:
        """Serve one agent's stream until it ends (see `AgentHub.accept`); `llmgw.wire.serve_agents` calls it.

        Raises: WireError when the first message is not Register within 30 s, or the node id is not the one
        its certificate names.
        """
        await self.agents.accept(link, peer)

    def local_connector(self):
        """A `connect()` factory for `llmgw.agent.run_agent` linking an in-process agent to this control plane
        over `memory_link_pair()` (used by `llmgw up`). The plane must be running."""
        return self.agents.local_connector()

    @property
    def sessions(self):
        """The connected agents' sessions by node id."""
        return self.agents.sessions

    # -- the reconciler's hooks --------------------------------------------------------------------------

    async def _execute(self, action: Action, settings: Settings) -> None:
        timeout = settings.cluster.action_timeout
        if action.kind in (ActionKind.START, ActionKind.RESTART):
            body = {"start_shard": start_shard(action, settings, self.replica_key, self.secrets.require)}
        elif action.kind is ActionKind.STOP:
            body = {"stop_shard": stop_shard(action, settings)}
        elif action.kind is ActionKind.INSTALL:
            record = self.registry.get(action.node_id)
            body = {"install_engine": install_engine(action, settings, platform_of(record.os, record.arch)
                                                     if record else "linux-x86_64")}
        else:
            return
        outcome = await self.agents.command(action.node_id, timeout, **body)
        if not outcome.ok:
            raise EngineError(f"node {action.node_id} refused to {action.kind.value} "
                              f"{action.shard_id or action.replica_id or action.engine}: {outcome.error}")

    def _after_pass(self, record: PassRecord, plan: Plan, fleet: Fleet) -> None:
        self.passes.append(record)
        self._rebuild_table()
        doc = self.status()
        snapshot = audit_snapshot(doc)
        if not self.leader:
            return
        if record.sent or snapshot != self._last_snapshot:
            changes = state_changes(self._last_snapshot, snapshot)
            self._last_snapshot = snapshot
            audit_doc = {k: v for k, v in doc.items() if k != "control_plane"}
            self.audit.queue_audit(audit_doc, audit_message(record, changes))
        if record.converged and record.settings_commit:
            self.audit.queue_applied(record.settings_commit)

    # -- what the admin API offers ------------------------------------------------------------------------

    def failures(self) -> list[dict[str, Any]]:
        """Actions that failed and wait to be retried: kind, node, subject, attempts, error, retry_at (unix s)."""
        return [
            {"kind": f.kind, "node": f.node_id, "subject": f.subject, "attempts": f.attempts, "error": f.error,
             "retry_at": f.retry_at_unix}
            for f in self.reconciler.failures.values()
        ]

    def status(self) -> dict[str, Any]:
        """The status document (see `llmgw.control.audit.status_document`) plus the control plane's own state."""
        doc = status_document(
            self.watcher.state, self.registry.records(), self.reconciler.last_pass, self.reconciler.last_plan,
            self.failures(),
        )
        plan = self.reconciler.last_plan
        if plan is not None and plan.notes:
            doc["notes"] = list(plan.notes)
        doc["control_plane"] = {
            "version": __version__,
            "repository": self.config.repo,
            "branch": self.config.branch,
            "admin_url": self.admin_url,
            "gateway_url": self.gateway_url,
            "agents_port": self.agents_port,
            "join_port": self.join_port,
            "audit_pending": self.audit.pending(),
            "audit_error": self.audit.last_error,
            "applied": self.audit.applied,
            "apply_running": self.apply_holder,
            "leader": self.leader,
            "leader_holder": self.leader_holder,
        }
        return doc

    async def apply(
        self, emit: Callable[[dict[str, Any]], Awaitable[None]], *, wait: bool = True,
        allow_empty: bool = False, timeout: float = 600.0, who: str = "admin API",
    ) -> bool:
        """Converge to the branch head now, reporting progress to `emit` (see `llmgw.control.applying.apply`)."""
        return await apply(self, emit, wait=wait, allow_empty=allow_empty, timeout=timeout, who=who)

    async def preview(self, rev: str | None) -> Plan:
        """The plan `rev` (None: the branch head) would run against the live fleet. Raises SettingsError."""
        from llmgw.plan import make_plan
        from llmgw.settings import load_commit

        if self.watcher.remote:
            await self.watcher.poll()
        target = rev or f"refs/heads/{self.config.branch}"
        settings = await trio.to_thread.run_sync(load_commit, str(self.watcher.repo_path), target)
        return make_plan(settings, fleet_for(self.registry.fleet(), settings))

    async def set_stopped(self, stopped: bool, author_name: str, author_email: str) -> str:
        """Commit `serving.stopped: <stopped>` to the settings branch as the operator; returns the commit id.

        Raises: UsageError when the settings repository is remote (commit it there instead).
        """
        from llmgw.settings import set_serving_stopped

        if self.watcher.remote:
            raise UsageError(
                f"the settings live at {self.config.repo}; commit serving.stopped: "
                f"{'true' if stopped else 'false'} in llmgw.yaml there and push it."
            )
        commit = await trio.to_thread.run_sync(
            set_serving_stopped, str(self.watcher.repo_path), stopped, author_name, author_email,
        )
        await self.watcher.poll()
        return commit

    def create_join_token(self, ttl_seconds: float = 3600.0) -> dict[str, Any]:
        """A one-time join token for a new node: {"token", "join_port", "ca_pem", "expires_in"}.

        Raises: UsageError when the control plane does not serve agents with mutual TLS (`tls=True`).
        """
        if self.ca is None or self.join_port is None:
            raise UsageError("this control plane serves agents without TLS, so nodes need no join token; "
                             "start `llmgw server --tls` for mutual TLS with join tokens.")
        return {"token": self.ca.create_join_token(ttl_seconds), "join_port": self.join_port,
                "ca_pem": self.ca.certificate_pem.decode(), "expires_in": ttl_seconds}

    async def logs(self, node_id: str, shard_id: str, lines: int) -> list[str]:
        """The last `lines` log lines of `shard_id` ("" for the agent's own) on `node_id`.

        Raises: UsageError for an unknown or disconnected node; TemporaryError when it does not answer.
        """
        return await self.agents.logs(node_id, shard_id, lines)


def _url_host(host: str) -> str:
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host
