"""`open_wiring(plane)`: the control plane's wiring, as one async context manager (`open_control_plane` in
`llmgw.control.plane` builds the plane and opens it here).

    async with open_control_plane(ControlConfig(repo=..., state_dir=...)) as plane:   # every listener bound
        print(plane.gateway_url, plane.admin_url)          # plane: the read-only view (llmgw.control.view)

In order: the first poll of the settings, the store, tracing, the effect handlers (llmgw.control.handlers) and the
loop's initial recovery (a transition, folded before the loop reports started), the agents' listener, the admin API,
the gateway (its routing table built from the settings just read, before any request) with its batch runner
(`llmgw.control.batching`: it works while this control plane leads), the control loop, the lease keeper, the audit
writer and the watcher. Leaving it stops them all, writes what the audit still holds, and gives
the lease back. Nothing calls back into the plane: every part feeds the loop's channel or handles its effects.
This module is the only writer of the plane's slots that exist once it runs (store, tracing, ports, URLs, ...).
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, get_args

import trio

from llmgw.control.autoscaling import held_changed
from llmgw.control.admin_listener import (
    ADMIN_TLS_DIR, AdminTls, check_admin_listener, trusted_proxies, write_admin_tls,
)
from llmgw.control.batching import run_batches
from llmgw.control.ca_rotation import keep_ca
from llmgw.control.config import (
    ControlConfig, check_listeners_free, listening_on, poll_interval, url_host, worker_store_url,
)
from llmgw.control.effects import Effect
from llmgw.control.handlers import EffectContext, register_handlers
from llmgw.control.keys import REPLICA_KEY_SECRET
from llmgw.control.tls_names import LOCAL, WILDCARDS, certificate_names, machine_names
from llmgw.control.leading import LEASE_NAME, LeaseKeeper
from llmgw.control.node_identity import NodeIdentities
from llmgw.control.recovering import KNOWN_NODES_KEY, decode_known
from llmgw.control.events import settings_published, watch_reason
from llmgw.control.restart_only import command_line_keys, restart_notes
from llmgw.control.speeds import merged_speeds, metrics_speeds, speeds_from_benches
from llmgw.control.state import WatchState
from llmgw.control.status import Endpoints
from llmgw.control.tracing import open_tracing
from llmgw.errors import SettingsError, StoreError, TemporaryError
from llmgw.routes import ReplicaSpeed
from llmgw.gateway import Gateway, GatewayWorkers, drain_spools, open_gateway_tracing, worker_count, worker_spools
from llmgw.settings import NOTIFY_CA_KEY, NOTIFY_URL_KEY, hook_token, set_config_value
from llmgw.settings.model import ClusterSettings, Listener, Tracing
from llmgw.store import open_store_from_settings, store_record, write_store_record
from llmgw.wire import check_agents_listener, serve_agents

log = logging.getLogger("llmgw.control")

SPEEDS_INTERVAL = 60.0
"""Seconds between two reads of the bench results into the routing table (`read_speeds`)."""
SPEEDS_MERGE_INTERVAL = 5.0
"""Seconds between two merges of the engines' measured speeds (the fleet state) into the routing table."""
SPEEDS_BENCHES = 10000
"""The latest bench runs read each time (the latest per replica counts)."""
ADMIN_TOKEN_FILE = "admin-token"
ADMIN_URL_FILE = "admin-url"


class SettingsNews:
    """The settings watcher's `publish`: each `WatchState` becomes a `settings_published` transition on the loop's
    channel (`update`); the notes of settings only a restart applies are logged once each. `started_with`: what the
    control plane started with (llmgw.control.restart_only), set once opened."""

    def __init__(self, update: Any, node_lost_after: float | None):
        self.update, self.node_lost_after = update, node_lost_after
        self.started_with: tuple[ClusterSettings, frozenset[str]] | None = None
        self._logged: tuple[str, ...] = ()

    def __call__(self, watch: WatchState) -> None:
        settings = watch.settings
        if self.started_with is not None and settings is not None:
            notes = restart_notes(*self.started_with, settings.cluster)
            for note in notes:
                if note not in self._logged:  # a log line, once; the notes themselves are in the state
                    log.warning("%s", note)
            self._logged = notes
        self.update(settings_published(watch, self.node_lost_after, self.started_with), watch_reason(watch))


@asynccontextmanager
async def open_wiring(plane: Any) -> AsyncIterator[Any]:
    """Open `plane` (a `llmgw.control.plane.ControlPlane` not yet opened, built of its `config`) and yield it once
    every listener is bound (`llmgw.control.plane.open_control_plane` is the public way in). Raises: StoreError when
    the store cannot be opened; UsageError / WireError / OSError when a listener's address cannot be used."""
    from llmgw.control.admin import serve_admin

    config: ControlConfig = plane.config
    plane.state_dir.mkdir(parents=True, exist_ok=True)
    watched = await plane.watcher.poll()  # its news reaches the loop as a transition; this is the wiring's copy
    cluster = watched.settings.cluster if watched.settings else None
    owned = config.store is None or isinstance(config.store, (str, Path))
    store = plane.store = await trio.to_thread.run_sync(functools.partial(
        open_store_from_settings, cluster.store if cluster else None, plane.state_dir, plane.secrets.get,
        override_url=config.store)) if owned else config.store
    if owned:  # which store this is, for `llmgw keys/token/usage/store --state DIR` (no password in it)
        write_store_record(plane.state_dir, store_record(cluster.store if cluster else None, plane.state_dir,
                                                         override_url=config.store, secrets_dir=config.secrets_dir))
    request_tracing, trace_endpoint, trace_requests = _open_tracing(plane, config, cluster)
    plane.keys.secret = store.get_or_create_secret(REPLICA_KEY_SECRET)
    plane.agents.identities = NodeIdentities(store)  # node secrets' hashes, shared by every control plane
    plane.loop.tracing = plane.tracing
    register_handlers(plane.handlers, EffectContext(
        agents=plane.agents, secret=plane.secrets.require, replica_key=plane.replica_key, audit=plane.audit,
        status=lambda state: plane.status(state, readings=False), update=plane.loop.update, store=store,
        tracing=plane.tracing, speeds=lambda: plane.speeds))
    unhandled = [kind.__name__ for kind in get_args(Effect) if kind not in plane.handlers.kinds()]
    assert not unhandled, f"effects without a handler would be dropped: {unhandled}"  # a bug of llmgw, not input
    plane.audit.fence = functools.partial(_audit_fence, store, plane.holder)
    known, began, grace = decode_known(store.get(KNOWN_NODES_KEY)), trio.current_time(), config.recovery_grace
    plane.loop.update(lambda state: (state.recovering_from(known, began, grace), False))
    plane.admin_token = _admin_token(config, plane.state_dir, store)

    def listener(override: Listener | None, name: str, default: Listener) -> Listener:
        return listening_on(override, getattr(cluster, name) if cluster else default)

    agents = listener(config.agents_listener, "agents", Listener(port=8082))
    check_agents_listener(agents.host, agents.port, tls=config.tls or config.agent_tls is not None,
                          insecure=config.insecure_agents)
    admin = listener(config.admin_listener, "admin", Listener(port=8081))
    check_admin_listener(admin.host, admin.port, tls=bool(config.admin_tls), insecure=config.insecure_admin)
    proxies = trusted_proxies(config.trusted_proxies)
    gateway = listener(config.gateway_listener, "gateway", Listener(port=8080))
    check_listeners_free({"agents": agents, "admin": admin, **({"gateway": gateway} if config.gateway else {})})
    started = cluster or ClusterSettings(name="")
    workers = worker_count(config.gateway_workers if config.gateway_workers is not None else gateway.workers)
    plane.news.started_with = (replace(started, gateway=replace(started.gateway, workers=workers)),
                               command_line_keys(config))
    try:
        async with trio.open_nursery() as nursery:
            plane.agents.nursery = plane.feed.nursery = nursery
            tls, join, agents_tls = config.agent_tls, None, None
            if config.tls and tls is None:
                from llmgw.wire import AgentsTls, CertificateAuthority

                plane.ca = join = plane.agents.ca = CertificateAuthority.load_or_create(plane.state_dir / "ca")
                names = config.tls_hostnames or certificate_names(agents.host, machine_names())
                agents_tls = AgentsTls(plane.ca, names)  # follows `llmgw ca rotate` (llmgw.control.ca_rotation)
                tls = agents_tls.server_tls()
            bound = await nursery.start(lambda task_status: serve_agents(
                plane.accept_agent, agents.host, agents.port, tls=tls, join=join, join_port=config.join_port,
                task_status=task_status))
            where = Endpoints(agents_port=int(bound), join_port=getattr(bound, "join_port", None))
            admin_tls = _admin_tls(plane, config, admin)
            if agents_tls is not None:
                await nursery.start(functools.partial(
                    keep_ca, plane.agents, agents_tls,
                    on_change=functools.partial(_reissue_admin_tls, plane, config, admin, admin_tls)))
            admin_port = await nursery.start(functools.partial(
                serve_admin, plane, admin.host, admin.port, mounts=config.admin_mounts, tls=admin_tls,
                proxies=proxies))
            scheme = "https" if admin_tls else "http"
            plane.endpoints = where = replace(where, admin_url=f"{scheme}://{url_host(admin.host)}:{admin_port}",
                                              admin_port=admin_port)
            if config.gateway:
                # the table of the settings read (the watcher's news reaches the loop's state only once the
                # loop runs), before any request: workers started on an empty table and answered 403
                # project_unknown until the first rebuild reached them
                plane.feed.publish_now(replace(plane.loop.state, watch=watched))
                port = await _start_gateway(plane, config, nursery, cluster, gateway, request_tracing,
                                            trace_endpoint, trace_requests)
                plane.endpoints = replace(where, gateway_url=f"http://{url_host(gateway.host)}:{port}", gateway_port=port)
                nursery.start_soon(read_speeds, plane, store)
            _write_state_files(plane, config)
            await nursery.start(plane.loop.run)
            plane.lease = LeaseKeeper(
                lambda: trio.to_thread.run_sync(_acquire, store, plane.holder, config.lease_seconds,
                                                abandon_on_cancel=True),
                plane.loop.update, ttl=config.lease_seconds, holder=plane.holder,
                acquire_sync=lambda: _acquire(store, plane.holder, config.lease_seconds))
            await nursery.start(plane.lease.run)
            await nursery.start(plane.audit.run)
            nursery.start_soon(plane.watcher.run, lambda: poll_interval(config, plane.loop.state.settings))
            plane.feed.publish_now(plane.loop.state)
            plane.loop.kick("start")
            yield plane
            nursery.cancel_scope.cancel()
    finally:
        with trio.move_on_after(3.0, shield=True):
            await plane.audit.write_pending()
        if plane.tracing is not None:  # sends the spans buffered (also those of the last 5 s) on any stop
            with trio.CancelScope(shield=True):  # bounded by the exporter's own timeout (10 s)
                await trio.to_thread.run_sync(plane.tracing.shutdown)
        if plane.leader:
            store.release_lease(LEASE_NAME, plane.holder)
        if owned:
            store.close()


async def read_speeds(plane: Any, store: Any, interval: float = SPEEDS_INTERVAL,
                      every: float = SPEEDS_MERGE_INTERVAL) -> None:
    """Every `every` seconds (the first time at once), hand the gateway feed each replica's measured speed: the
    bench results in `store`, read every `interval` seconds, merged with the speeds the engines' counters gave in
    the fleet state now (`llmgw.control.speeds.merged_speeds`). A store that cannot be read is tried again
    `interval` seconds later (a warning), the last bench speeds read standing meanwhile. Runs until cancelled."""
    benches: dict[str, ReplicaSpeed] = {}
    read_at = trio.current_time()
    while True:
        if trio.current_time() >= read_at:
            read_at = trio.current_time() + interval
            try:
                records = await trio.to_thread.run_sync(store.benches, None, SPEEDS_BENCHES, abandon_on_cancel=True)
            except (StoreError, TemporaryError) as exc:
                log.warning("cannot read the bench results for routing by expected time: %s", exc)
            else:
                benches = speeds_from_benches(records)
        state = plane.loop.state
        plane.feed.set_speeds(merged_speeds(benches, metrics_speeds(state.fleet.records())), state)
        await trio.sleep(every)


def _open_tracing(plane: Any, config: ControlConfig, cluster: Any) -> tuple[Any, str | None, float]:
    """Open the control plane's tracing (unless given) and the in-process gateway's: (request tracing or None,
    endpoint, share of requests traced)."""
    traced = cluster.tracing if cluster else Tracing()
    endpoint = config.otlp_endpoint or traced.endpoint
    requests = (config.request_sample_ratio if config.request_sample_ratio is not None
                else cluster.trace_requests if cluster else 0.0)
    try:
        if plane.tracing is None:
            plane.tracing = open_tracing(endpoint, sample_ratio=traced.sample_ratio)
        return (open_gateway_tracing(endpoint, requests) if config.gateway else None), endpoint, requests
    except ImportError as exc:  # tracing asked for, the extra not installed: serve untraced, and say so
        log.warning("cannot send traces to %s: %s; install the tracing extra (pip install 'llmgw[tracing]')",
                    endpoint, exc)
        return None, endpoint, requests


def _report_held(loop: Any, model: str, count: int) -> None:
    """The gateway's word that `count` requests wait for `model` to wake, on the loop's channel."""
    loop.update(held_changed(model, count), f"{count} requests held for {model}")


async def _start_gateway(plane: Any, config: ControlConfig, nursery: trio.Nursery, cluster: Any, gateway: Listener,
                         tracing: Any, trace_endpoint: str | None, trace_requests: float) -> int:
    """Serve the gateway: in this process (`workers` 1, traced by `tracing`, None: untraced) or as worker
    processes (each opens its own tracing to `trace_endpoint` for the share `trace_requests` of requests);
    returns the bound port."""
    count = worker_count(config.gateway_workers if config.gateway_workers is not None else gateway.workers)
    spools = plane.state_dir / "usage-spool"
    store = plane.store
    if count <= 1:
        served = plane.gateway = Gateway(store, plane.table, spool_dir=spools, tracing=tracing,
                                         drain_timeout=gateway.drain_timeout)
        served.health_details = plane.health_details
        served.holding.on_change = functools.partial(_report_held, plane.loop)
        plane.feed.attach(served)
        nursery.start_soon(drain_spools, store, worker_spools(spools, 0))
        port = await nursery.start(served.serve, gateway.host, gateway.port)
        nursery.start_soon(run_batches, plane, served)
        return port
    url = worker_store_url(config.store, store, cluster, plane.state_dir, plane.secrets.get)
    if "://" not in url or url.startswith("sqlite:"):
        log.warning("%d gateway workers share the SQLite store %s: each reservation and settlement takes its one "
                    "write lock, which processes wait for by polling; under load run them with PostgreSQL "
                    "(docs/gateway.md, worker processes).", count, url)
    workers = plane.gateway_workers = GatewayWorkers(
        count, gateway.host, gateway.port, store_url=url, spool_root=spools,
        metrics_dir=plane.state_dir / "gateway-metrics", otlp_endpoint=trace_endpoint,
        request_sample_ratio=trace_requests if trace_endpoint else 0.0, drain_timeout=gateway.drain_timeout)
    workers.health_details = plane.health_details
    workers.on_held = functools.partial(_report_held, plane.loop)
    plane.feed.attach(workers)
    # what an in-process gateway (an earlier `workers: 1`) or more workers than now left in their spools
    nursery.start_soon(drain_spools, store, [spools, *worker_spools(spools, count)])
    port = await nursery.start(workers.serve)
    nursery.start_soon(run_batches, plane, None, workers)
    return port


def _admin_token(config: ControlConfig, state_dir: Path, store: Any) -> str:
    """The admin token: the configured one, else `<state_dir>/admin-token`, created (mode 0600) from the store."""
    if config.admin_token:
        return config.admin_token
    path = state_dir / ADMIN_TOKEN_FILE
    if path.is_file() and path.read_text().strip():
        return path.read_text().strip()
    token = store.create_admin_token()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(token + "\n")
    return token


def _reissue_admin_tls(plane: Any, config: ControlConfig, admin: Listener, served: AdminTls | None) -> None:
    """After the agents' CA changed (`llmgw ca rotate`): a certificate of the agents' CA the admin listener serves
    (`admin_tls` True) is issued again under the CA of now and served to new connections. Blocking."""
    if served is None or config.admin_tls is not True:
        return
    fresh = _admin_tls(plane, config, admin)
    assert fresh is not None and fresh.cert_file == served.cert_file
    served.reload()


def _admin_tls(plane: Any, config: ControlConfig, admin: Listener) -> AdminTls | None:
    """The admin listener's certificate: the one configured, or (`admin_tls` True) one the agents' CA issues for
    `tls_hostnames`, the listener's host (a wildcard: this machine's name and addresses unless `tls_hostnames` are
    given; llmgw.control.tls_names), localhost and 127.0.0.1, written under `<state_dir>/admin-tls/`; None:
    plain HTTP."""
    if not config.admin_tls:
        return None
    if isinstance(config.admin_tls, AdminTls):
        return config.admin_tls
    from llmgw.wire import CertificateAuthority

    ca = plane.ca or CertificateAuthority.load_or_create(plane.state_dir / "ca")  # `plane.ca`: agents' TLS only
    given = config.tls_hostnames and admin.host in WILDCARDS  # the names given stand for the wildcard
    listening = () if given else certificate_names(admin.host, machine_names())
    names = [name for name in (*config.tls_hostnames, *listening, *LOCAL) if name not in WILDCARDS]
    cert, key = ca.issue_server_certificate(list(dict.fromkeys(names)))
    return write_admin_tls(plane.state_dir / ADMIN_TLS_DIR, cert, key)


def _write_state_files(plane: Any, config: ControlConfig) -> None:
    """`<state_dir>/admin-url`, and the local settings repository's notify URL (its push hook wakes the watcher),
    the hook's token (`llmgw.settings.hook_token`) and, for an admin listener under the agents' CA, that CA's file
    (`llmgw.notifyca`)."""
    (plane.state_dir / ADMIN_URL_FILE).write_text(plane.admin_url + "\n")
    if config.set_notify_url and not plane.watcher.remote:
        try:
            plane.hook_token = hook_token(plane.watcher.repo_path)
            set_config_value(plane.watcher.repo_path, NOTIFY_URL_KEY, f"{plane.admin_url}/api/v1/hooks/git")
            if config.admin_tls is True:
                set_config_value(plane.watcher.repo_path, NOTIFY_CA_KEY, str(plane.state_dir / "ca" / "ca.crt"))
        except SettingsError:
            pass  # not a repository yet: the watcher reports it; the hook keeps polling instead


def _acquire(store: Any, holder: str, seconds: float) -> tuple[int, str | None]:
    """Take or renew the leader lease (see `llmgw.control.leading.LeaseKeeper`), blocking: (token or 0, holder).
    The lease keeper's renewal thread calls it too; the store is thread-safe."""
    token = store.acquire_lease(LEASE_NAME, holder, seconds)
    return (token, holder) if token else (0, store.lease_holder(LEASE_NAME))


async def _audit_fence(store: Any, holder: str) -> int | None:
    """The fencing token `holder` holds the leader lease with, as the store's lease row says; 0 when another
    control plane holds it; None when nobody does (see `llmgw.control.audit.Fence`). The audit writer checks it
    before each write."""
    lease = await trio.to_thread.run_sync(store.lease, LEASE_NAME, abandon_on_cancel=True)
    if lease is None:
        return None
    return lease.token if lease.holder == holder else 0
