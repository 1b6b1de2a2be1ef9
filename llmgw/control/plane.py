"""`ControlPlane`: a running control plane's read-only view (`llmgw.control.view.ControlView`) over the parts
`open_control_plane` below opens (the wiring: `llmgw.control.opening`) (or `await nursery.start(ControlPlane(config).run)`).

No part calls back into the plane: every event is a pure transition on the one `ControlLoop`, whose passes return
effects (llmgw.control.effects) carried out by the handlers registered in `handlers`. Each request of the view is
one line handing over to the module of its concept (status, operating, node_requests, applying, restarting).
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import trio

from llmgw.control import node_requests, training_requests
from llmgw.control.agents import AgentHub
from llmgw.control.kv_blocks import KV_BLOCKS_PER_REPLICA
from llmgw.control.applying import apply
from llmgw.control.audit import AuditWriter
from llmgw.control.config import ControlConfig, check_listeners_free, listening_on, reconcile_interval
from llmgw.control.effects import CommitSettings, PublishRoutingTable, WipeNode
from llmgw.control.feeding import GatewayFeed
from llmgw.control.handling import Handlers
from llmgw.control.keys import WEBHOOK_SECRET, ReplicaKeys, SecretResolver
from llmgw.control.looping import ControlLoop
from llmgw.control.opening import SettingsNews, open_wiring
from llmgw.control.node_wiping import NodeWipes
from llmgw.control.operating import SettingsDesk
from llmgw.control.recovering import Recovery
from llmgw.control.registry import FleetRegistry
from llmgw.control.state import ControlState, PassRecord, WatchState
from llmgw.control.status import Endpoints, StatusReporter, health_details
from llmgw.control.tracing import StartTracing
from llmgw.control.upgrade_run import UpgradeRunner, node_seen, publish_into
from llmgw.control.view import Emit
from llmgw.control.watching import SettingsWatcher
from llmgw.plan.forecasting import ModelForecast, RecordedLoad
from llmgw.plan.reviewed import ReviewedPlan
from llmgw.plan.cpu_speed import ExpectedSpeed
from llmgw.plan.types import Plan

__all__ = ["ControlConfig", "ControlPlane", "check_listeners_free", "listening_on"]

PASS_CONCURRENCY = 64
"""Commands awaiting their node's answer at once (8 made a 1,500-replica roll-out to 250 nodes start ~2/s)."""
PASS_COALESCE = 0.25
"""Seconds from one pass's end to the next: events arriving meanwhile make one batch and one pass."""
AUDIT_MIN_GAP = 1.0
"""Seconds between two audit commits: the passes in between are written as one."""


class ControlPlane:
    """One control plane's parts and its view. Slots filled once opened (by `open_control_plane` only): `store`,
    `tracing`, `admin_token`, `endpoints` (`admin_url`, `gateway_url`, `agents_port`, `join_port`), `ca`, `gateway`
    or `gateway_workers`, `lease`, `news.started_with`."""

    def __init__(self, config: ControlConfig):
        self.config = config
        self.state_dir = Path(config.state_dir)
        self.secrets = SecretResolver(config.secrets_dir or self.state_dir / "secrets")
        self.handlers = Handlers()
        self.loop = ControlLoop(ControlState(fleet=FleetRegistry(lost_after=config.node_lost_after or 30.0)),
                                self.handlers, interval=lambda: reconcile_interval(config, self.loop.state.settings),
                                concurrency=PASS_CONCURRENCY, coalesce=PASS_COALESCE)
        self.news = SettingsNews(self.loop.update, config.node_lost_after)  # the watcher feeds the loop's channel
        self.watcher = SettingsWatcher(config.repo, config.branch, self.state_dir / "settings-mirror.git",
                                       publish=self.news, ssh_key=config.repo_ssh_key)
        self.keys = ReplicaKeys()
        self.fabric_tests: dict[tuple[str, str], dict[str, Any]] = {}  # the last of each pair, in memory
        self.feed = GatewayFeed(self.keys.get, self.secrets.get)
        self.handlers.register(PublishRoutingTable, self.feed.publish)
        self.agents = AgentHub(self.loop.update, self.feed.blocks_changed, kv_cap=self._kv_cap)
        self.audit = AuditWriter(self.watcher.repo_path, min_gap=AUDIT_MIN_GAP)
        self.desk = SettingsDesk(self.watcher, config.repo, config.branch, self.loop.update)
        self.handlers.register(CommitSettings, self.desk.commit, lane="settings")
        self.wipes = NodeWipes(self.agents, self.loop.update, self.is_connected)
        self.handlers.register(WipeNode, self.wipes.handle)
        self.reporter = StatusReporter(self.loop, self.audit, self.feed, config.repo, config.branch,
                                       lambda: self.endpoints, lambda: self.gateway_workers,
                                       ca_not_after=lambda: self.ca.not_after if self.ca is not None else None,
                                       ca_rotation=lambda: self.agents.ca_rotation)
        self.apply_lock = trio.Lock()
        self.upgrades = UpgradeRunner(publish_into(self.loop.update), lambda: node_seen(self.loop.state))
        self.restart_requested = trio.Event()
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self.tracing = StartTracing(config.tracer_provider) if config.tracer_provider is not None else None
        self.store: Any = None
        self.admin_token = ""
        self.hook_token = ""  # what the local settings repository's post-receive hook sends (llmgw.settings.hook_token)
        self.endpoints = Endpoints()
        self.ca: Any = None
        self.gateway: Any = None  # the in-process gateway (workers: 1)
        self.gateway_workers: Any = None  # the worker processes (workers > 1)
        self.lease: Any = None

    def _kv_cap(self) -> int:
        """The most prefix-cache block hashes one replica may hold (llmgw.yaml `limits.kv_blocks_per_replica`)."""
        settings = self.loop.state.settings
        return settings.cluster.kv_blocks_per_replica if settings is not None else KV_BLOCKS_PER_REPLICA

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Open this control plane (`open_control_plane`) and serve until cancelled; `task_status.started(self)`
        once every listener is bound. Raises what `open_control_plane` raises."""
        async with open_wiring(self):
            task_status.started(self)
            await trio.sleep_forever()

    def health_details(self) -> dict[str, Any]:
        """What the gateway's /health adds (`llmgw.control.status.health_details` of the state now)."""
        return health_details(self.loop.state, trio.current_time())

    def snapshot(self) -> ControlState:
        """The control plane's state now: an immutable value (settings, fleet with readings, leadership, ...)."""
        return self.loop.state

    registry = property(lambda self: self.loop.state.fleet, doc="The fleet as last reported (in `snapshot()`).")
    leader = property(lambda self: self.loop.state.leadership.leader)
    table = property(lambda self: self.feed.table, doc="The routing table the gateway serves by.")
    speeds = property(lambda self: self.feed.speeds, doc="Each replica's measured speed routing uses, by replica id "
                      "(`llmgw.control.speeds`: `llmgw bench`'s results merged with the engines' counters).")
    passes = property(lambda self: self.loop.state.recent_passes, doc="The latest passes (at most 100).")
    admin_url = property(lambda self: self.endpoints.admin_url)
    gateway_url = property(lambda self: self.endpoints.gateway_url)
    agents_port = property(lambda self: self.endpoints.agents_port)
    join_port = property(lambda self: self.endpoints.join_port)
    admin_port = property(lambda self: self.endpoints.admin_port)
    gateway_port = property(lambda self: self.endpoints.gateway_port)
    watcher_repo_path = property(lambda self: self.watcher.repo_path, doc="The settings repository as read.")

    @property
    def apply_holder(self) -> str | None:
        """Who runs the `llmgw apply` in progress (None: none), as the state says."""
        return self.loop.state.apply_holder

    @apply_holder.setter
    def apply_holder(self, holder: str | None) -> None:
        self.loop.update(lambda s: (replace(s, apply_holder=holder), False))

    def status(self, state: ControlState | None = None, *, readings: bool = True,
               now: float | None = None) -> dict[str, Any]:
        """The status document (see `llmgw.control.status.StatusReporter.status`)."""
        return self.reporter.status(state, readings=readings, now=now)

    def recovery(self) -> Recovery:
        """Whether this control plane has its fleet back since it started (`ControlState.recovery`)."""
        return self.loop.state.recovery(trio.current_time())

    def is_connected(self, node_id: str) -> bool:
        """True while `node_id`'s agent has a stream open to this control plane (the fleet says so)."""
        record = self.loop.state.fleet.get(node_id)
        return record is not None and record.connected

    def gateway_registry(self):
        """The Prometheus registry of this control plane's gateway counters, or None when it runs no gateway."""
        workers, gateway = self.gateway_workers, self.gateway
        return workers.registry if workers is not None else gateway.metrics.registry if gateway is not None else None

    def replica_key(self, replica_id: str) -> str:
        """The replica key of `replica_id` (`llmgw.control.keys.ReplicaKeys`)."""
        return self.keys.get(replica_id)

    def secret(self, name: str) -> str | None:
        """The named secret (`SecretResolver.get`: the secrets directory, else $LLMGW_SECRET_<NAME>), or None."""
        return self.secrets.get(name)

    def webhook_secret(self) -> bytes | None:
        """The forge webhook secret (named secret "webhook"), or None when none is configured."""
        value = self.secrets.get(WEBHOOK_SECRET)
        return value.encode() if value else None

    async def wait_pass(self) -> PassRecord:
        """The record of the next reconcile pass, once it ran. A checkpoint."""
        return await self.loop.wait_pass()

    async def preview(self, rev: str | None, load: RecordedLoad | None = None
                      ) -> tuple[Plan, tuple[ModelForecast, ...]]:
        """The plan `rev` (None: the branch head) would run against the live fleet, and the forecast of the models
        it changes given the fleet's recent `load` (`SettingsDesk.preview`). Raises SettingsError."""
        return await self.desk.preview(rev, self.loop.state, load)

    async def preview_with_estimates(self, rev: str | None, load: RecordedLoad | None = None
                                     ) -> tuple[Plan, tuple[ModelForecast, ...], tuple[ExpectedSpeed, ...]]:
        """`preview`'s plan and forecasts, and the decode speed expected of each replica it places on a probed CPU
        node (`SettingsDesk.preview_with_estimates`). Raises SettingsError."""
        return await self.desk.preview_with_estimates(rev, self.loop.state, load)

    async def logs(self, node_id: str, shard_id: str, lines: int) -> list[str]:
        """`llmgw.control.node_requests.node_logs` of the fleet now."""
        return await node_requests.node_logs(self.loop.state, self.agents, node_id, shard_id, lines)

    async def fabric_test(self, a: str, b: str) -> dict[str, Any]:
        """`llmgw.control.node_requests.fabric_test` of the fleet now; the document is also kept, with the unix
        time it ended (`at`), as the pair's last test (`last_fabric_tests`)."""
        document = await node_requests.fabric_test(self.loop.state, self.agents, a, b)
        self.fabric_tests[(a, b)] = {**document, "at": time.time()}
        return document

    def last_fabric_tests(self) -> list[dict[str, Any]]:
        """The last fabric test this control plane ran between each pair of nodes (client `a`, server `b`), by
        pair: `grades_document`'s {"a", "b", "ok_fraction", "rails"} and "at", unix seconds. Kept in memory: a
        restart, or another control plane taking the lead, starts without any."""
        return [self.fabric_tests[pair] for pair in sorted(self.fabric_tests)]

    async def wipe_node(self, node_id: str, *, keep_weights: bool = False) -> dict[str, Any]:
        """Have `node_id`'s agent take llmgw off its machine and stop (`NodeWipes.wipe`): {"node", "report"}."""
        outcome = await self.wipes.wipe(node_id, keep_weights=keep_weights)
        return {"node": node_id, "report": list(outcome.report)}

    async def forget_node(self, node_id: str) -> dict[str, Any]:
        """Forget a node whose agent is stopped (`llmgw node remove`): its certificates revoked, its node secret
        forgotten (`llmgw.control.node_requests.forget_node`), then its record dropped from the fleet."""
        done = await node_requests.forget_node(self.loop.state, self.ca, self.agents.identities, node_id)

        def dropped(state: ControlState) -> tuple[ControlState, bool]:
            fleet, changed = state.fleet.without(node_id)
            return state.with_fleet(fleet), changed

        self.loop.update(dropped, f"node {node_id} forgotten")
        await self.loop.folded_all()
        return done

    async def slurm_users(self) -> dict[str, Any]:
        """`llmgw slurm users` (`llmgw.control.node_requests.slurm_users`)."""
        return await node_requests.slurm_users(self.loop.state, self.store)

    async def submit_training(self, body: dict[str, Any]) -> dict[str, Any]:
        """Queue a training job (`llmgw.control.training_requests.submit`)."""
        return await training_requests.submit(self.loop, body)

    def training_jobs(self) -> dict[str, Any]:
        """Every training job's status (`llmgw.control.training_requests.jobs`)."""
        return training_requests.jobs(self.loop)

    def training_job(self, job_id: str) -> dict[str, Any]:
        """One training job's status. Raises UsageError for an unknown job."""
        return training_requests.job_status(self.loop, job_id)

    async def cancel_training(self, job_id: str) -> dict[str, Any]:
        """Cancel a training job (`llmgw.control.training_requests.cancel`)."""
        return await training_requests.cancel(self.loop, job_id)

    async def training_adapter(self, job_id: str) -> dict[str, Any]:
        """A finished training job's adapter from the store (`llmgw.control.training_requests.adapter`)."""
        return await training_requests.adapter(self.store, job_id)

    def kick(self, reason: str) -> None:
        """Bring the next reconcile pass forward."""
        self.loop.kick(reason)

    def wake_watcher(self) -> None:
        """Make the settings watcher poll now (a hook or forge said the branch moved)."""
        self.watcher.wake()

    def set_reviewed(self, reviewed: ReviewedPlan) -> None:
        """Compare each pass planning `reviewed.commit` with the plan a review showed (`llmgw apply --review`)."""
        self.loop.update(lambda s: (replace(s, reviewed=reviewed), True), f"apply --review {reviewed.commit[:12]}")

    def allow_empty(self, commit: str) -> None:
        """Let settings commit `commit` empty the catalog (`llmgw apply --allow-empty`)."""
        self.loop.update(lambda s: (replace(s, allow_empty_commit=commit), True), f"apply --allow-empty {commit[:12]}")

    async def reload(self, *, force: bool = False, allow_empty: bool = False) -> WatchState:
        """Poll the settings branch now (forcing a reload when `force`); returns the watcher's state once the
        control loop's state holds it."""
        watched = await self.watcher.poll(force=force, allow_empty=allow_empty)
        await self.loop.folded_all()
        return watched

    async def command(self, node_id: str, timeout: float, **body: Any):
        """Send one command with this plane's lease token (0 while not leading) and wait for its `CommandOutcome`.
        Raises: TemporaryError when the node is not connected, goes away or does not answer in time."""
        return await self.agents.command(node_id, timeout, fencing_token=self.loop.state.leadership.token, **body)

    async def apply(self, emit: Emit, *, wait: bool = True, allow_empty: bool = False, timeout: float = 600.0,
                    who: str = "admin API", expect: str = "", reviewed: ReviewedPlan | None = None) -> bool:
        """Converge to the branch head now, reporting progress to `emit` (see `llmgw.control.applying.apply`)."""
        return await apply(self, emit, wait=wait, allow_empty=allow_empty, timeout=timeout, who=who, expect=expect,
                           reviewed=reviewed)

    async def restart(self, emit: Emit, *, control_plane: bool = True) -> bool:
        """Restart every agent, engines serving throughout, then this control plane (`restarting.restart_fleet`)."""
        from llmgw.control.restarting import restart_fleet

        return await restart_fleet(self, emit, control_plane=control_plane)

    def request_restart(self) -> None:
        """Ask whoever runs this control plane to restart it: `restart_requested` is set."""
        self.restart_requested.set()

    async def upgrade(self, tar: Path, *, max_unavailable: int = 1, paused: bool = False,
                      confirm_seconds: float | None = None, ready_timeout: float = 300.0) -> Any:
        """Start `llmgw upgrade` with the release tar `tar` (`llmgw.control.upgrade_run`): verified against
        releases.trusted_keys, then rolled out node by node. Returns the `Upgrade` as planned. Raises UsageError
        (not the leader, an agent too old, a release newer than this control plane, one under way, no trusted key)
        or ReleaseError (it does not check)."""
        import llmgw
        from llmgw.control.upgrade_run import (
            CONFIRM_SECONDS, send_release, upgrade_refusal, verify_release_tar, version_refusal,
        )
        from llmgw.errors import UsageError

        state = self.loop.state
        if not state.leadership.leader:
            raise UsageError(f"this control plane does not lead (the leader is {state.leadership.holder or 'unknown'}"
                             "): run `llmgw upgrade` against the leader")
        refusal = upgrade_refusal(state)
        if refusal is not None:
            raise UsageError(refusal)
        keys = tuple(state.settings.cluster.trusted_release_keys) if state.settings is not None else ()
        release = await trio.to_thread.run_sync(verify_release_tar, tar, keys, tar.parent)
        if (newer := version_refusal(release.version, llmgw.__version__)) is not None:
            raise UsageError(newer)
        confirm = confirm_seconds or CONFIRM_SECONDS

        async def send(node_id: str) -> str:
            return await send_release(self.command, node_id, release, confirm)

        return self.upgrades.start(self.agents.nursery, release.version, send, max_unavailable=max_unavailable,
                                   restart_timeout=confirm + 60.0, ready_timeout=ready_timeout, paused=paused)

    async def edit_settings(self, edit: Any, author_name: str, author_email: str, *, expect: str = "",
                            preview: bool = False) -> Any:
        """Commit a person's settings edit as them, or preview its diff (`llmgw.control.operating.SettingsDesk.edit`)."""
        return await self.desk.edit(edit, author_name, author_email, expect=expect, preview=preview)

    def create_join_token(self, ttl_seconds: float = 3600.0) -> dict[str, Any]:
        """A one-time join token for a new node (`llmgw.control.node_requests.join_token`)."""
        return node_requests.join_token(self.ca, self.join_port, ttl_seconds)

    async def accept_agent(self, link, peer: str) -> None:
        """Serve one agent's stream until it ends (`AgentHub.accept`); `llmgw.wire.serve_agents` calls it."""
        await self.agents.accept(link, peer)

    def local_connector(self):
        """A `connect()` factory linking an in-process agent (`llmgw up`) to this running plane (`AgentHub`)."""
        return self.agents.local_connector()


@asynccontextmanager
async def open_control_plane(config: ControlConfig) -> AsyncIterator[ControlPlane]:
    """Build a control plane of `config`, open it (`llmgw.control.opening.open_wiring`) and yield it, the read-only
    view (`llmgw.control.view.ControlView`), once every listener is bound; leaving the block stops it. Raises what
    `open_wiring` raises."""
    async with open_wiring(ControlPlane(config)) as plane:
        yield plane
