"""The status document a running control plane serves (`GET /api/v1/status`, `llmgw status`, the audit's
status.yaml): `StatusReporter.status(state, ...)`.

The fleet part is `llmgw.control.audit.status_document` of the state (built in proportion to the change by
`llmgw.control.documents.StatusDocuments`); the "control_plane" part says where this control plane listens, how its
audit writes go, who leads, whether the fleet is back since the start, when the agents' CA expires (`ca_expiry`,
with a warning six months ahead) and how far a CA rotation is (`llmgw ca rotate`), and (with readings) counters of its own work and each replica's measured
speed with its source and age (`replicas.<id>.speed`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import trio

from llmgw import __version__
from llmgw.control.audit import AuditWriter
from llmgw.control.autoscaling import scales_status
from llmgw.control.canaries import canaries_status
from llmgw.control.forecast_audit import forecast_status
from llmgw.control.documents import StatusDocuments
from llmgw.control.feeding import GatewayFeed
from llmgw.control.looping import ControlLoop
from llmgw.control.speeds import metrics_speeds, speed_document
from llmgw.control.upgrades import upgrade_document
from llmgw.control.state import ControlState
from llmgw.settings import redact_url


@dataclass(frozen=True)
class Endpoints:
    """Where a control plane serves: admin and gateway URLs and ports ("" and 0 until bound or without a gateway),
    the agents' port and the join port (None without mutual TLS)."""

    admin_url: str = ""
    gateway_url: str = ""
    agents_port: int = 0
    join_port: int | None = None
    admin_port: int = 0
    gateway_port: int = 0


def failures_of(state: ControlState) -> list[dict[str, Any]]:
    """Actions that failed and wait to be retried: kind, node, subject, attempts, error, retry_at (unix s)."""
    return [{"kind": f.kind, "node": f.node_id, "subject": f.subject, "attempts": f.attempts, "error": f.error,
             "retry_at": f.retry_at_unix} for f in state.failures.values()]


def health_details(state: ControlState, now: float) -> dict[str, Any]:
    """What the gateway's /health adds: leadership, and "status": "recovering" with the fleet's line while the
    fleet known at start is not back at `now` (control-plane clock)."""
    fleet = state.recovery(now)
    return {"leader": state.leadership.leader, **({} if fleet.done else {"status": "recovering", "fleet": fleet.text})}


CA_WARN_DAYS = 180
"""`llmgw status` warns this many days (about six months) before the agents' CA expires."""


def ca_expiry(not_after: float | None, now: float) -> dict[str, Any] | None:
    """The status document's "ca" part: when the agents' CA certificate ends (`not_after`, unix seconds; None: this
    control plane has no CA, so None) and the whole days left at `now` (unix seconds), with a "warning" sentence from
    `CA_WARN_DAYS` days before. Pure."""
    if not_after is None:
        return None
    days = math.floor((not_after - now) / 86400)
    until = time.strftime("%Y-%m-%d", time.gmtime(not_after))
    doc: dict[str, Any] = {"not_after": not_after, "until": until, "days_left": days}
    if days < 0:
        doc["warning"] = (f"the agents' CA expired on {until}: no node can connect over mutual TLS. Make a new CA "
                          "(`llmgw ca rotate`, then `llmgw ca rotate --finish` on the control plane) and have every "
                          "node join again.")
    elif days < CA_WARN_DAYS:
        doc["warning"] = (f"the agents' CA expires on {until}, in {days} days: every node certificate stops working "
                          "with it. Run `llmgw ca rotate` on the control plane before then: agents move onto a new "
                          "CA over their streams, none has to join again.")
    return doc


class StatusReporter:
    """Builds status documents of the states of `loop`, with what `audit`, `feed` and the gateway workers (a
    callable giving them, None without) say; `repository` and `branch` as configured; `endpoints()` once bound."""

    def __init__(self, loop: ControlLoop, audit: AuditWriter, feed: GatewayFeed, repository: str, branch: str,
                 endpoints: Callable[[], Endpoints], workers: Callable[[], Any],
                 ca_not_after: Callable[[], float | None] = lambda: None,
                 ca_rotation: Callable[[], dict[str, Any] | None] = lambda: None):
        self._loop, self._audit, self._feed = loop, audit, feed
        self._repository, self._branch = redact_url(repository), branch
        self._endpoints, self._workers = endpoints, workers
        self._ca_not_after = ca_not_after
        self._ca_rotation = ca_rotation
        self._documents = StatusDocuments()  # the status document, rebuilt in proportion to the change

    def status(self, state: ControlState | None = None, *, readings: bool = True,
               now: float | None = None) -> dict[str, Any]:
        """The status document (see `llmgw.control.audit.status_document`) of `state` (default: now) plus the
        control plane's own state; with `readings`, each node's last readings and their age at `now` (trio's clock;
        default: now) (absent when older than 60 s). Given `state` and `now`, it may run in a worker thread (the
        admin API builds a fleet's readings there, off the trio loop)."""
        state = state or self._loop.state
        now = trio.current_time() if now is None else now
        doc = self._documents.build(state.watch, state.fleet, state.last_pass, state.last_plan, failures_of(state))
        if readings:  # the node entries are shared with earlier documents (llmgw.control.documents): copied here
            nodes = doc["nodes"]
            doc["nodes"] = {
                record.node_id: {**nodes[record.node_id],
                                 "readings": record.readings.to_json(now) if record.readings else None,
                                 **({"memory_bandwidth": record.state.memory_bandwidth.to_json()}
                                    if record.state.memory_bandwidth is not None else {})}
                for record in state.fleet.records() if record.node_id in nodes}
            doc["replicas"] = self._with_speeds(state, doc["replicas"])
        plan = state.last_plan
        notes = [*(plan.notes if plan is not None else ()), *state.restart_notes]
        if notes:
            doc["notes"] = notes
        if state.canaries:
            doc["canaries"] = canaries_status(state.canaries)
        if state.forecast_audit is not None:
            doc["forecast_check"] = forecast_status(state.forecast_audit)
        if state.scales:
            doc["scaling"] = scales_status(state, now)
        if state.upgrade is not None:
            doc["upgrade"] = upgrade_document(state.upgrade, time.time() - now)
        where = self._endpoints()
        doc["control_plane"] = {
            "version": __version__, "repository": self._repository, "branch": self._branch,
            "admin_url": where.admin_url, "gateway_url": where.gateway_url, "agents_port": where.agents_port,
            "join_port": where.join_port, "audit_pending": self._audit.pending(), "audit_error": self._audit.last_error,
            "applied": self._audit.applied, "apply_running": state.apply_holder, "leader": state.leadership.leader,
            "leader_holder": state.leadership.holder, "leader_token": state.leadership.token,
            "fleet": state.recovery(now).text,
        }
        ca = ca_expiry(self._ca_not_after(), time.time())
        if ca is not None:
            doc["control_plane"]["ca"] = ca
        rotation = self._ca_rotation()
        if rotation is not None:
            doc["control_plane"]["ca_rotation"] = rotation
        workers = self._workers()
        if workers is not None:
            doc["control_plane"]["gateway_workers"] = workers.statistics()
        if readings:
            doc["control_plane"]["load"] = self.load_figures()
        return doc

    def _with_speeds(self, state: ControlState, replicas: dict[str, Any]) -> dict[str, Any]:
        """`replicas` (entries copied where changed) with each measured replica's `speed`: what the gateway routes
        by (`GatewayFeed.speeds`: bench results and the engines' counters merged), else, without a gateway, what
        the engines' counters gave (`llmgw.control.speeds.metrics_speeds`)."""
        speeds = {**metrics_speeds(state.fleet.records()), **self._feed.speeds}
        wall = time.time()
        return {rid: {**entry, "speed": speed_document(speeds[rid], wall)} if rid in speeds else entry
                for rid, entry in replicas.items()}

    def load_figures(self) -> dict[str, Any]:
        """Counters of the control plane's own work (bench/fleet_scale.py reads them): transitions folded, routing
        tables built, passes, and heartbeat latency p50/p99 in seconds (agent send -> fold; latest 4,096)."""
        loop = self._loop
        lags = sorted(loop.fold_latencies)

        def quantile(q: float) -> float | None:
            return lags[min(len(lags) - 1, int(q * len(lags)))] if lags else None

        return {"folded": loop.folded, "table_rebuilds": self._feed.rebuilds, "passes": loop.state.passes,
                "heartbeat_latency_p50": quantile(0.5), "heartbeat_latency_p99": quantile(0.99),
                "heartbeat_latency_samples": len(lags)}
