"""`ControlPlane`: the settings watcher, the reconciler, the agents' service, the admin API and the gateway, in
one trio nursery.

    plane = ControlPlane(ControlConfig(repo=".state/settings.git", state_dir=Path(".state")))
    async with trio.open_nursery() as nursery:
        await nursery.start(plane.run)            # returns once every listener is bound
        await nursery.start(run_agent, agent_config, plane.local_connector())   # an in-process agent (`llmgw up`)
        print(plane.gateway_url, plane.admin_url, plane.admin_token)

The pieces never call back into the plane nor read its state: every event (a settings commit, an agent's
message, a lease renewal, an action's outcome, an admin request) is a pure transition sent to the one
`ControlLoop` (llmgw.control.looping), which builds the next `ControlState`, runs `decide` and then the I/O.
After each change the routing table is rebuilt once when the change was placement-relevant; after each pass
the leader queues an audit commit when something changed. Readers get `plane.snapshot()`, an immutable value.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import secrets
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import trio

from llmgw import __version__
from llmgw.control.agents import AgentHub
from llmgw.control.applying import apply
from llmgw.control.audit import AuditWriter
from llmgw.control.documents import StatusDocuments
from llmgw.control.effects import PublishRoutingTable
from llmgw.control.fabric_test import check_nodes, grades_document, run_fabric_test
from llmgw.control.feeding import GatewayFeed
from llmgw.control.handlers import EffectContext, register_handlers
from llmgw.control.handling import Handlers
from llmgw.control.keys import (
    REPLICA_KEY_SECRET, WEBHOOK_SECRET, SecretResolver, replica_key,
)
from llmgw.control.leading import LEASE_NAME, LeaseKeeper
from llmgw.control.looping import ControlLoop
from llmgw.control.recovering import DEFAULT_GRACE, KNOWN_NODES_KEY, Recovery, decode_known
from llmgw.control.registry import FleetRegistry
from llmgw.control.events import settings_published
from llmgw.control.restart_only import command_line_keys, restart_notes
from llmgw.control.reports import fleet_for
from llmgw.control.tracing import StartTracing, open_tracing
from llmgw.control.watching import SettingsWatcher
from llmgw.control.slurm_store import users_from_store
from llmgw.control.state import ControlState, PassRecord, WatchState
from llmgw.errors import SettingsError, UsageError
from llmgw.gateway import Gateway, GatewayWorkers, drain_spools, open_gateway_tracing, worker_count, worker_spools
from llmgw.plan.types import Plan
from llmgw.routes import RouteTable
from llmgw.settings import NOTIFY_URL_KEY, redact_url, set_config_value
from llmgw.settings.model import ClusterSettings, Listener, Tracing
from llmgw.settings.node_commits import NodeVerbCommit, commit_node_verb, commit_ssh_key
from llmgw.store import open_store_from_settings
from llmgw.wire import check_agents_listener, serve_agents

log = logging.getLogger("llmgw.control")

ADMIN_TOKEN_FILE = "admin-token"
ADMIN_URL_FILE = "admin-url"
PASS_CONCURRENCY = 64
"""Commands awaiting their node's answer at once (8 made a 1,500-replica roll-out to 250 nodes start ~2/s)."""
PASS_COALESCE = 0.25
"""Seconds from one pass's end to the next: events arriving meanwhile make one batch and one pass."""
AUDIT_MIN_GAP = 1.0
"""Seconds between two audit commits: the passes in between are written as one."""



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
    `recovery_grace`: seconds at most that a control plane started again says it is recovering (gateway `/health`
    503) while the nodes connected to the leader before have not all reconnected (llmgw.control.recovering).
    `tls`: True serves agents with mutual TLS under the CA in `<state_dir>/ca` (created), with a server certificate
    for `tls_hostnames` (default: the agents' listener host, localhost, 127.0.0.1), and answers Join on `join_port`
    (0: a free port) so nodes get certificates with one-time tokens (`create_join_token`). `agent_tls`: a
    `llmgw.wire.ServerTls` of your own instead (no Join). `insecure_agents`: allow a plain-text agents listener
    on an address other machines reach (refused otherwise, see `llmgw.wire.check_agents_listener`).
    `gateway`: False runs no gateway. `gateway_workers`: how many processes serve the gateway (an int or "auto";
    None: llmgw.yaml's `listeners.gateway.workers`); 1 serves it in this process (`Gateway`), more start
    `llmgw.gateway.GatewayWorkers`. `otlp_endpoint`: an OTLP/HTTP collector ("http://host:4318") that receives
    traces of passes and replica starts (None: llmgw.yaml's `tracing.endpoint`, and off without one; see
    llmgw.control.tracing); `tracer_provider`: an opentelemetry-sdk TracerProvider of your own instead.
    `request_sample_ratio`: the share (0..1) of gateway requests traced (None: llmgw.yaml's
    `tracing.sample_requests`, default 0; see llmgw.gateway.tracing). Both are read once, at start.
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
    insecure_agents: bool = False
    gateway: bool = True
    set_notify_url: bool = True
    lease_seconds: float = 6.0
    recovery_grace: float = DEFAULT_GRACE
    otlp_endpoint: str | None = None
    tracer_provider: Any = None
    request_sample_ratio: float | None = None
    gateway_workers: int | str | None = None


def _store_url(config_store: Any, store: Any, cluster: Any, state_dir: Path, secrets_get) -> str:
    """The URL gateway worker processes open the store by: `config_store` when it is a URL or path, else the one
    llmgw.yaml names (with its password), else the SQLite file of a Store object given. Raises UsageError for a
    PostgreSQL Store object given without its URL (its password is not kept readable)."""
    from llmgw.store import STORE_FILE_NAME, store_url_from_settings

    if isinstance(config_store, (str, Path)):
        return str(config_store)
    if config_store is None:
        if cluster is None:
            return str(state_dir / STORE_FILE_NAME)
        return store_url_from_settings(cluster.store, state_dir, secrets_get)
    if getattr(store, "path", None) is not None:
        return str(store.path)
    raise UsageError("gateway worker processes open the store themselves: give the control plane the store's URL "
                     "(--store or llmgw.yaml store:) rather than an opened store, or run listeners.gateway.workers: 1.")


def listening_on(override: Listener | None, configured: Listener) -> Listener:
    """The listener to serve: `configured` (llmgw.yaml's, or the default), at `override`'s address when one is given
    (`--gateway HOST:PORT`). How many processes serve it stays the configured `workers` (the control plane's
    `gateway_workers` overrides that), so moving the gateway to another port keeps its worker processes."""
    return dataclasses.replace(override, workers=configured.workers) if override else configured


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
        self.handlers = Handlers()
        self.loop = ControlLoop(
            ControlState(fleet=FleetRegistry(lost_after=config.node_lost_after or 30.0)), self.handlers,
            interval=self._reconcile_interval, concurrency=PASS_CONCURRENCY, coalesce=PASS_COALESCE,
        )
        self.watcher = SettingsWatcher(
            config.repo, config.branch, self.state_dir / "settings-mirror.git", publish=self._publish_watch,
        )
        self.feed = GatewayFeed(self.replica_key, self.secrets.get)
        self.handlers.register(PublishRoutingTable, self.feed.publish)
        self.agents = AgentHub(self.loop.update, self.feed.blocks_changed)
        self.audit = AuditWriter(self.watcher.repo_path, min_gap=AUDIT_MIN_GAP, fence=self._audit_fence)
        self.apply_lock = trio.Lock()
        self.store: Any = None
        self.gateway: Gateway | None = None  # the in-process gateway (workers: 1)
        self.gateway_workers: GatewayWorkers | None = None  # the worker processes (workers > 1)
        self.admin_token = ""
        self.admin_url = self.gateway_url = ""
        self.admin_port = self.gateway_port = self.agents_port = 0
        self.join_port: int | None = None
        self.ca: Any = None
        self._replica_secret = b""
        self._replica_keys: dict[str, str] = {}
        self._documents = StatusDocuments()  # the status document, rebuilt in proportion to the change
        self._nursery: trio.Nursery | None = None
        self.started_at = time.time()
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self.restart_requested = trio.Event()
        # what `run` started with that only a start changes (cluster settings, keys given on the command line), and
        # the notes of the settings that differ from it (llmgw.control.restart_only)
        self._started: tuple[ClusterSettings, frozenset[str]] | None = None
        # opened by `run` once llmgw.yaml's `tracing:` is read (the command line's endpoint overrides it)
        self.tracing = StartTracing(config.tracer_provider) if config.tracer_provider is not None else None
        self.lease: LeaseKeeper | None = None

    # -- the state, as readers see it ---------------------------------------------------------------------

    def snapshot(self) -> ControlState:
        """The control plane's state now: an immutable value (settings, fleet with readings, leadership, ...)."""
        return self.loop.state

    @property
    def registry(self) -> FleetRegistry:
        """The fleet as last reported (part of `snapshot()`)."""
        return self.loop.state.fleet

    @property
    def leader(self) -> bool:
        return self.loop.state.leadership.leader

    @property
    def leader_holder(self) -> str | None:
        return self.loop.state.leadership.holder

    @property
    def table(self) -> RouteTable:
        """The routing table the gateway serves by."""
        return self.feed.table

    @property
    def passes(self) -> tuple[PassRecord, ...]:
        """The latest reconcile passes (at most 100), oldest first."""
        return self.loop.state.recent_passes

    @property
    def apply_holder(self) -> str | None:
        """Who runs the `llmgw apply` in progress (None: none)."""
        return self.loop.state.apply_holder

    @apply_holder.setter
    def apply_holder(self, holder: str | None) -> None:
        self.loop.update(lambda s: (replace(s, apply_holder=holder), False))

    def kick(self, reason: str) -> None:
        """Bring the next reconcile pass forward."""
        self.loop.kick(reason)

    async def wait_pass(self) -> PassRecord:
        """Wait for the next reconcile pass to finish and return its record. A checkpoint."""
        return await self.loop.wait_pass()

    def allow_empty(self, commit: str) -> None:
        """Let settings commit `commit` empty the catalog (`llmgw apply --allow-empty`)."""
        self.loop.update(lambda s: (replace(s, allow_empty_commit=commit), True), f"apply --allow-empty {commit[:12]}")

    async def reload(self, *, force: bool = False, allow_empty: bool = False) -> WatchState:
        """Poll the settings branch now (forcing a reload when `force`); returns the watcher's state."""
        return await self.watcher.poll(force=force, allow_empty=allow_empty)

    @property
    def watcher_repo_path(self) -> Path:
        """The settings repository as read (the mirror of a remote one)."""
        return self.watcher.repo_path

    def gateway_registry(self):
        """The Prometheus registry of this control plane's gateway counters, or None when it runs no gateway."""
        if self.gateway_workers is not None:
            return self.gateway_workers.registry
        return self.gateway.metrics.registry if self.gateway is not None else None

    def recovery(self) -> Recovery:
        """Whether this control plane has its fleet back since it started (`ControlState.recovery`, see
        `llmgw.control.recovering`)."""
        return self.loop.state.recovery(trio.current_time())

    def _health_details(self) -> dict[str, Any]:
        """What the gateway's /health adds: leadership, and "status": "recovering" with the fleet's line."""
        fleet = self.recovery()
        return {"leader": self.leader, **({} if fleet.done else {"status": "recovering", "fleet": fleet.text})}

    def is_connected(self, node_id: str) -> bool:
        """True while `node_id`'s agent has a stream open to this control plane."""
        record = self.loop.state.fleet.get(node_id)  # the fleet holds connections; the hub only the streams
        return record is not None and record.connected

    async def command(self, node_id: str, timeout: float, **body: Any):
        """Send one command to `node_id`'s agent and wait up to `timeout` seconds for its `CommandOutcome`.

        Carries this control plane's leader-lease token (0 while it does not lead: an agent that has seen a token
        refuses it, see llmgw.agent.fencing).
        Raises: TemporaryError when the node is not connected, goes away or does not answer in time.
        """
        return await self.agents.command(node_id, timeout, fencing_token=self.loop.state.leadership.token, **body)

    def wake_watcher(self) -> None:
        """Make the settings watcher poll now (a hook or forge said the branch moved)."""
        self.watcher.wake()

    # -- running ------------------------------------------------------------------------------------------

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Run every part until cancelled. `task_status.started(self)` once all listeners are bound.

        Raises: StoreError when the store cannot be opened; WireError / OSError when a port cannot be bound.
        """
        from llmgw.control.admin import serve_admin

        self.state_dir.mkdir(parents=True, exist_ok=True)
        watched = await self.watcher.poll()  # its news reaches the loop as a transition; this is the wiring's copy
        settings = watched.settings
        cluster = settings.cluster if settings else None
        store = self.config.store
        if store is None or isinstance(store, (str, Path)):
            store = await trio.to_thread.run_sync(functools.partial(
                open_store_from_settings, cluster.store if cluster else None, self.state_dir, self.secrets.get,
                override_url=store))
        self.store = store
        traced = cluster.tracing if cluster else Tracing()
        trace_endpoint = self.config.otlp_endpoint or traced.endpoint
        trace_requests = (self.config.request_sample_ratio if self.config.request_sample_ratio is not None
                          else cluster.trace_requests if cluster else 0.0)
        try:
            if self.tracing is None:
                self.tracing = open_tracing(trace_endpoint, sample_ratio=traced.sample_ratio)
            request_tracing = open_gateway_tracing(trace_endpoint, trace_requests) if self.config.gateway else None
        except ImportError as exc:  # tracing asked for, the extra not installed: serve untraced, and say so
            log.warning("cannot send traces to %s: %s; install the tracing extra (pip install 'llmgw[tracing]')",
                        trace_endpoint, exc)
            request_tracing = None
        self._replica_secret = store.get_or_create_secret(REPLICA_KEY_SECRET)
        self.loop.tracing = self.tracing
        register_handlers(self.handlers, EffectContext(
            agents=self.agents, secret=self.secrets.require, replica_key=self.replica_key, audit=self.audit,
            status=lambda state: self.status(state, readings=False), update=self.loop.update, store=store,
            tracing=self.tracing))
        # part of the loop's initial state: nothing runs yet (the agents' service and the loop start below)
        known, began, grace = decode_known(store.get(KNOWN_NODES_KEY)), trio.current_time(), self.config.recovery_grace
        self.loop.update(lambda state: (state.recovering_from(known, began, grace), False))
        self.admin_token = self._load_admin_token()

        def listener(override: Listener | None, name: str, default: Listener) -> Listener:
            return listening_on(override, getattr(cluster, name) if cluster else default)

        agents = listener(self.config.agents_listener, "agents", Listener(port=8082))
        check_agents_listener(agents.host, agents.port, tls=self.config.tls or self.config.agent_tls is not None,
                              insecure=self.config.insecure_agents)
        admin = listener(self.config.admin_listener, "admin", Listener(port=8081))
        gateway = listener(self.config.gateway_listener, "gateway", Listener(port=8080))
        check_listeners_free(
            {"agents": agents, "admin": admin, **({"gateway": gateway} if self.config.gateway else {})}
        )
        started = cluster or ClusterSettings(name="")
        workers = worker_count(self.config.gateway_workers if self.config.gateway_workers is not None
                               else gateway.workers)
        self._started = (replace(started, gateway=replace(started.gateway, workers=workers)),
                         command_line_keys(self.config))
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = self.agents.nursery = self.feed.nursery = nursery
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
                    # the table of the settings read (the watcher's news reaches the loop's state only once the
                    # loop runs), before any request: workers started on an empty table and answered 403
                    # project_unknown until the first rebuild reached them
                    self.feed.publish_now(replace(self.loop.state, watch=watched))
                    self.gateway_port = await self._start_gateway(nursery, store, cluster, gateway, request_tracing,
                                                                  trace_endpoint, trace_requests)
                    self.gateway_url = f"http://{_url_host(gateway.host)}:{self.gateway_port}"
                self._write_state_files()
                await nursery.start(self.loop.run)
                self.lease = LeaseKeeper(self._acquire_lease, self.loop.update, ttl=self.config.lease_seconds,
                                         holder=self.holder, acquire_sync=self._acquire_lease_sync)
                await nursery.start(self.lease.run)
                await nursery.start(self.audit.run)
                nursery.start_soon(self.watcher.run, self._poll_interval)
                self.feed.publish_now(self.loop.state)
                self.loop.kick("start")
                task_status.started(self)
        finally:
            with trio.move_on_after(3.0, shield=True):
                await self.audit.write_pending()
            if self.tracing is not None:  # sends the spans buffered (also those of the last 5 s) on any stop
                with trio.CancelScope(shield=True):  # bounded by the exporter's own timeout (10 s)
                    await trio.to_thread.run_sync(self.tracing.shutdown)
            if self.leader:
                store.release_lease(LEASE_NAME, self.holder)
            if self.config.store is None or isinstance(self.config.store, (str, Path)):
                store.close()

    async def _start_gateway(self, nursery: trio.Nursery, store: Any, cluster: Any, gateway: Listener,
                             tracing: Any, trace_endpoint: str | None, trace_requests: float) -> int:
        """Serve the gateway: in this process (`workers` 1, traced by `tracing`, None: untraced) or as worker
        processes (each opens its own tracing to `trace_endpoint` for the share `trace_requests` of requests);
        returns the bound port."""
        count = worker_count(self.config.gateway_workers if self.config.gateway_workers is not None
                             else gateway.workers)
        spools = self.state_dir / "usage-spool"
        if count <= 1:
            self.gateway = Gateway(store, self.table, spool_dir=spools, tracing=tracing)
            self.gateway.health_details = self._health_details
            self.feed.attach(self.gateway)
            nursery.start_soon(drain_spools, store, worker_spools(spools, 0))
            return await nursery.start(self.gateway.serve, gateway.host, gateway.port)
        url = _store_url(self.config.store, store, cluster, self.state_dir, self.secrets.get)
        if "://" not in url or url.startswith("sqlite:"):
            log.warning("%d gateway workers share the SQLite store %s: each reservation and settlement takes its one "
                        "write lock, which processes wait for by polling; under load run them with PostgreSQL "
                        "(docs/gateway.md, worker processes).", count, url)
        workers = self.gateway_workers = GatewayWorkers(
            count, gateway.host, gateway.port, store_url=url, spool_root=spools,
            metrics_dir=self.state_dir / "gateway-metrics", otlp_endpoint=trace_endpoint,
            request_sample_ratio=trace_requests if trace_endpoint else 0.0)
        workers.health_details = self._health_details
        self.feed.attach(workers)
        # what an in-process gateway (an earlier `workers: 1`) or more workers than now left in their spools
        nursery.start_soon(drain_spools, store, [spools, *worker_spools(spools, count)])
        return await nursery.start(workers.serve)

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
            try:
                set_config_value(self.watcher.repo_path, NOTIFY_URL_KEY, f"{self.admin_url}/api/v1/hooks/git")
            except SettingsError:
                pass  # not a repository yet: the watcher reports it; the hook keeps polling instead

    def _publish_watch(self, watch: WatchState) -> None:
        """The watcher's news, sent to the loop as a transition (`llmgw.control.events.settings_published`)."""
        settings = watch.settings
        if self._started is not None and settings is not None:
            logged = self.loop.state.restart_notes
            for note in restart_notes(*self._started, settings.cluster):
                if note not in logged:
                    log.warning("%s", note)
        commit = settings.commit[:12] if settings and settings.commit else "none"
        rejected = watch.bad or watch.held
        reason = f"settings {commit}" + (f" (head {rejected.commit[:12]} rejected)" if rejected else "")
        self.loop.update(settings_published(watch, self.config.node_lost_after, self._started), reason)

    def _poll_interval(self) -> float:
        settings = self.loop.state.settings
        return self.config.poll_interval or (settings.cluster.poll_interval if settings else 2.0)

    def _reconcile_interval(self) -> float:
        settings = self.loop.state.settings
        return self.config.reconcile_interval or (settings.cluster.reconcile_interval if settings else 10.0)

    async def _acquire_lease(self) -> tuple[int, str | None]:
        """Take or renew the leader lease (see `llmgw.control.leading.LeaseKeeper`): (token or 0, holder)."""
        return await trio.to_thread.run_sync(self._acquire_lease_sync, abandon_on_cancel=True)

    def _acquire_lease_sync(self) -> tuple[int, str | None]:
        """`_acquire_lease`, blocking (the lease keeper's renewal thread calls it; the store is thread-safe)."""
        token = self.store.acquire_lease(LEASE_NAME, self.holder, self.config.lease_seconds)
        if token:
            return token, self.holder
        return 0, self.store.lease_holder(LEASE_NAME)

    async def _audit_fence(self) -> int | None:
        """The fencing token this control plane holds the leader lease with, as the store's lease row says; 0 when
        another control plane holds it; None when nobody does (this one's lapsed: see `llmgw.control.audit.Fence`).
        The audit writer checks it before each write."""
        lease = await trio.to_thread.run_sync(self.store.lease, LEASE_NAME, abandon_on_cancel=True)
        if lease is None:
            return None
        return lease.token if lease.holder == self.holder else 0

    def replica_key(self, replica_id: str) -> str:
        """The replica key of `replica_id` (HMAC-SHA256 of it under the store's "engine-key" secret, hex); kept
        once computed (every routing-table build asks for every ready replica's)."""
        key = self._replica_keys.get(replica_id)
        if key is None:
            key = self._replica_keys[replica_id] = replica_key(self._replica_secret, replica_id)
        return key

    def webhook_secret(self) -> bytes | None:
        """The forge webhook secret (named secret "webhook"), or None when none is configured."""
        value = self.secrets.get(WEBHOOK_SECRET)
        return value.encode() if value else None

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

    # -- what the admin API offers ------------------------------------------------------------------------

    def failures(self, state: ControlState | None = None) -> list[dict[str, Any]]:
        """Actions that failed and wait to be retried: kind, node, subject, attempts, error, retry_at (unix s)."""
        state = state or self.loop.state
        return [
            {"kind": f.kind, "node": f.node_id, "subject": f.subject, "attempts": f.attempts, "error": f.error,
             "retry_at": f.retry_at_unix}
            for f in state.failures.values()
        ]

    def status(self, state: ControlState | None = None, *, readings: bool = True,
               now: float | None = None) -> dict[str, Any]:
        """The status document (see `llmgw.control.audit.status_document`) of `state` (default: now) plus the
        control plane's own state; with `readings`, each node's last readings and their age at `now` (trio's clock;
        default: now) (absent when older than 60 s). Given `state` and `now`, it may run in a worker thread (the
        admin API builds a fleet's readings there, off the trio loop)."""
        state = state or self.loop.state
        now = trio.current_time() if now is None else now
        doc = self._documents.build(state.watch, state.fleet, state.last_pass, state.last_plan, self.failures(state))
        if readings:  # the node entries are shared with earlier documents (llmgw.control.documents): copied here
            nodes = doc["nodes"]
            doc["nodes"] = {
                record.node_id: {**nodes[record.node_id],
                                 "readings": record.readings.to_json(now) if record.readings else None}
                for record in state.fleet.records() if record.node_id in nodes}
        plan = state.last_plan
        notes = [*(plan.notes if plan is not None else ()), *state.restart_notes]
        if notes:
            doc["notes"] = notes
        doc["control_plane"] = {
            "version": __version__,
            "repository": redact_url(self.config.repo),
            "branch": self.config.branch,
            "admin_url": self.admin_url,
            "gateway_url": self.gateway_url,
            "agents_port": self.agents_port,
            "join_port": self.join_port,
            "audit_pending": self.audit.pending(),
            "audit_error": self.audit.last_error,
            "applied": self.audit.applied,
            "apply_running": self.apply_holder,
            "leader": state.leadership.leader,
            "leader_holder": state.leadership.holder,
            "leader_token": state.leadership.token,
            "fleet": state.recovery(now).text,
        }
        if self.gateway_workers is not None:
            doc["control_plane"]["gateway_workers"] = self.gateway_workers.statistics()
        if readings:
            doc["control_plane"]["load"] = self._load_figures()
        return doc

    def _load_figures(self) -> dict[str, Any]:
        """Counters of the control plane's own work (bench/fleet_scale.py reads them): transitions folded, routing
        tables built, passes, and heartbeat latency p50/p99 in seconds (agent send -> fold; latest 4,096)."""
        lags = sorted(self.loop.fold_latencies)

        def quantile(q: float) -> float | None:
            return lags[min(len(lags) - 1, int(q * len(lags)))] if lags else None

        return {"folded": self.loop.folded, "table_rebuilds": self.feed.rebuilds, "passes": self.loop.state.passes,
                "heartbeat_latency_p50": quantile(0.5), "heartbeat_latency_p99": quantile(0.99),
                "heartbeat_latency_samples": len(lags)}

    async def apply(
        self, emit: Callable[[dict[str, Any]], Awaitable[None]], *, wait: bool = True,
        allow_empty: bool = False, timeout: float = 600.0, who: str = "admin API",
    ) -> bool:
        """Converge to the branch head now, reporting progress to `emit` (see `llmgw.control.applying.apply`)."""
        return await apply(self, emit, wait=wait, allow_empty=allow_empty, timeout=timeout, who=who)

    async def restart(self, emit: Callable[[dict[str, Any]], Awaitable[None]], *, control_plane: bool = True) -> bool:
        """Restart every agent over its stream, engines serving throughout, then this control plane
        (see `llmgw.control.restarting.restart_fleet`)."""
        from llmgw.control.restarting import restart_fleet

        return await restart_fleet(self, emit, control_plane=control_plane)

    def request_restart(self) -> None:
        """Ask whoever runs this control plane to restart it: `restart_requested` is set (`llmgw server`
        re-executes itself; an embedding program decides for itself)."""
        self.restart_requested.set()

    async def preview(self, rev: str | None) -> Plan:
        """The plan `rev` (None: the branch head) would run against the live fleet. Raises SettingsError."""
        from llmgw.plan import make_plan
        from llmgw.settings import load_commit

        if self.watcher.remote:
            await self.watcher.poll()
        target = rev or f"refs/heads/{self.config.branch}"
        settings = await trio.to_thread.run_sync(load_commit, str(self.watcher.repo_path), target)
        return make_plan(settings, fleet_for(self.loop.state.fleet.fleet(), settings))

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
            functools.partial(set_serving_stopped, str(self.watcher.repo_path), stopped, author_name, author_email,
                              branch=self.config.branch),
        )
        await self.watcher.poll()
        return commit

    async def node_verb(self, verb: str, node: str, author_name: str, author_email: str) -> NodeVerbCommit:
        """Commit `llmgw node cordon|uncordon|drain` or `llmgw slurm lend|reclaim` for `node` as the operator
        (llmgw.settings.node_commits); returns the branch head and whether a commit was made.
        Raises: UsageError when the settings are remote."""
        if self.watcher.remote:
            raise UsageError(f"the settings live at {self.config.repo}; make the change ({verb} {node}) there and "
                             "push it.")
        commit = await trio.to_thread.run_sync(
            functools.partial(commit_node_verb, str(self.watcher.repo_path), verb, node, author_name, author_email,
                              branch=self.config.branch),
        )
        await self.watcher.poll()
        return commit

    async def ssh_keys(self, action: str, email: str, keys: tuple[str, ...], author_name: str,
                       author_email: str) -> NodeVerbCommit:
        """Commit `llmgw slurm users keys add|remove` (llmgw.settings.node_commits.commit_ssh_key) as the operator.
        Raises: UsageError when the settings are remote; SettingsError when the result does not validate."""
        if self.watcher.remote:
            raise UsageError(f"the settings live at {self.config.repo}; change ssh_keys in slurm.yaml there and "
                             "push it.")
        commit = await trio.to_thread.run_sync(
            functools.partial(commit_ssh_key, str(self.watcher.repo_path), action, email, keys, author_name,
                              author_email, branch=self.config.branch))
        await self.watcher.poll()
        return commit

    async def slurm_users(self) -> dict[str, Any]:
        """`llmgw slurm users`: {"users": [{"email", "login", "uid", "home", "member", "keys"}]}: every member the
        store ever gave a login and UID (by UID; `member` False for one who left, whose UID stays theirs), with the
        home and SSH keys the settings in force give them; members not given one yet are assigned now."""
        settings = self.loop.state.settings
        if settings is None or self.store is None:
            return {"users": []}
        wanted = {user.email: user for user in await trio.to_thread.run_sync(users_from_store, self.store, settings)}
        rows = await trio.to_thread.run_sync(self.store.slurm_users)
        return {"users": [{"email": row.email, "login": row.login, "uid": row.uid,
                           "home": wanted[row.email].home if row.email in wanted else "",
                           "member": row.email in wanted,
                           "keys": list(wanted[row.email].keys) if row.email in wanted else []} for row in rows]}

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

        Raises: UsageError for an unknown or disconnected node, or a shard the node does not report;
        TemporaryError when it does not answer.
        """
        record = self.snapshot().fleet.get(node_id)
        if shard_id and record is not None and shard_id not in {s.shard_id for s in record.state.shards}:
            known = ", ".join(sorted(s.shard_id for s in record.state.shards)) or "none"
            raise UsageError(f"node {node_id!r} reports no shard {shard_id!r} (its shards: {known}); leave out "
                             "--shard for the agent's own log.")
        return await self.agents.logs(node_id, shard_id, lines)

    async def fabric_test(self, a: str, b: str) -> dict[str, Any]:
        """Run perftest's ib_write_bw from node `a` (client) to node `b` (server), rail by rail, and grade each
        (`llmgw.control.fabric_test`). A checkpoint; takes a few seconds per rail.

        Raises: UsageError for an unknown, disconnected or unfit node (or a == b); TemporaryError when one goes
        away or does not answer.
        """
        if a == b:
            raise UsageError("a fabric test needs two different nodes: llmgw fabric-test A B.")
        fleet = self.snapshot().fleet
        records = fleet.get(a), fleet.get(b)
        check_nodes(*records, names=(a, b), connected=self.loop.state.connected())
        grades = await run_fabric_test(self.agents.sessions, *records)  # type: ignore[arg-type]
        return grades_document(a, b, grades)


def _url_host(host: str) -> str:
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host
