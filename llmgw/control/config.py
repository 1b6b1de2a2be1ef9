"""How a control plane is run: `ControlConfig`, and the listeners it serves on (`listening_on`,
`check_listeners_free`, `url_host`), and the store URL its gateway worker processes open (`worker_store_url`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmgw.control.recovering import DEFAULT_GRACE
from llmgw.errors import UsageError
from llmgw.settings.model import Listener


@dataclass(frozen=True)
class ControlConfig:
    """How to run a control plane.

    `repo`: the settings repository, a local path (bare or not) or a URL (fetched into
    `<state_dir>/settings-mirror.git`; `repo_ssh_key`: the private key file an ssh URL is fetched with, its host key
    checked against ~/.ssh/known_hosts). `state_dir`: where the control plane keeps its files (created).
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
    for `tls_hostnames` (default: the agents' listener host, or on a wildcard address this machine's name and
    non-loopback addresses (llmgw.control.tls_names), then localhost, 127.0.0.1), and answers Join on `join_port`
    (0: a free port) so nodes get certificates with one-time tokens (`create_join_token`). `agent_tls`: a
    `llmgw.wire.ServerTls` of your own instead (no Join). `insecure_agents`: allow a plain-text agents listener
    on an address other machines reach (refused otherwise, see `llmgw.wire.check_agents_listener`).
    `admin_tls`: the admin listener serves TLS: True with a certificate of the agents' CA (`<state_dir>/ca`,
    created; written to `<state_dir>/admin-tls/`), or a `llmgw.control.admin_listener.AdminTls` of your own; None
    serves plain HTTP, refused on an address other machines reach unless `insecure_admin`
    (`llmgw.control.admin_listener.check_admin_listener`). `trusted_proxies`: addresses or networks of
    TLS-terminating proxies in front of the admin listener whose X-Forwarded-Proto/-For are believed.
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
    repo_ssh_key: Path | None = None
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
    admin_tls: Any = None
    insecure_admin: bool = False
    trusted_proxies: tuple[str, ...] = ()
    gateway: bool = True
    set_notify_url: bool = True
    lease_seconds: float = 6.0
    recovery_grace: float = DEFAULT_GRACE
    otlp_endpoint: str | None = None
    tracer_provider: Any = None
    request_sample_ratio: float | None = None
    gateway_workers: int | str | None = None
    admin_mounts: tuple = ()  # `llmgw.control.admin.MountFactory`s: apps beside the admin API (the CLI's console)


def worker_store_url(config_store: Any, store: Any, cluster: Any, state_dir: Path, secrets_get) -> str:
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
    `gateway_workers` overrides that), so moving the gateway to another port keeps its worker processes (and its
    `drain_timeout`)."""
    return (dataclasses.replace(override, workers=configured.workers, drain_timeout=configured.drain_timeout)
            if override else configured)


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


def poll_interval(config: ControlConfig, settings: Any) -> float:
    """Seconds between two polls of the settings: the command line's, else those of `settings` (None: 2 s)."""
    return config.poll_interval or (settings.cluster.poll_interval if settings else 2.0)


def reconcile_interval(config: ControlConfig, settings: Any) -> float:
    """Seconds between two passes when nothing wakes one: the command line's, else those of `settings` (None: 10)."""
    return config.reconcile_interval or (settings.cluster.reconcile_interval if settings else 10.0)


def url_host(host: str) -> str:
    """The host to put in a URL for a listener bound to `host`: a wildcard becomes loopback, IPv6 is bracketed."""
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host
