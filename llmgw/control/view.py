"""`ControlView`: the typed interface through which the admin API, `llmgw apply`, `llmgw restart`, the console and
the CLI reach a running control plane. `ControlPlane` implements it; nothing else of the plane is read from outside.

Reads return values that cannot change under the reader (`snapshot()` is the immutable `ControlState`; `status()`
a fresh document). Writes are requests: they become events of the control loop or commits to the settings branch.

This module is also all of the control plane that `llmgw.console` may import (an import contract in
pyproject.toml): the value types a snapshot is made of (`ControlState`, `PassRecord`, `WatchState`, `NodeRecord`,
`NodeReadings`, `GpuSample`), `state_document(state)`, the status document of a snapshot, and `upgrade_document`, the
`llmgw upgrade` rollout's part of it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from llmgw.control.audit import status_document
from llmgw.control.readings import GpuSample, NodeReadings
from llmgw.control.recovering import Recovery
from llmgw.control.registry import NodeRecord
from llmgw.control.sessions import CommandOutcome
from llmgw.control.speeds import metrics_speeds, speed_document
from llmgw.control.state import ControlState, PassRecord, WatchState
from llmgw.control.upgrades import upgrade_document
from llmgw.plan.forecasting import ModelForecast, RecordedLoad
from llmgw.plan.reviewed import ReviewedPlan
from llmgw.plan.cpu_speed import ExpectedSpeed
from llmgw.plan.types import Plan

__all__ = [
    "ControlState", "ControlView", "Emit", "GpuSample", "NodeReadings", "NodeRecord", "PassRecord", "WatchState",
    "failure_documents", "state_document", "upgrade_document",
]

Emit = Callable[[dict[str, Any]], Awaitable[None]]
"""Where a long request reports its progress, one JSON-ready dict per step."""


@runtime_checkable
class ControlView(Protocol):
    """What the control plane offers its readers and operators. Times in seconds."""

    store: Any
    speeds: Mapping[str, Any]  # each replica's measured speed routing uses (`llmgw.routes.ReplicaSpeed`), by id
    admin_token: str
    hook_token: str          # the post-receive hook's token ("" when the settings repository is not local)
    watcher_repo_path: Path
    apply_lock: Any          # a trio.Lock: one `llmgw apply` at a time
    apply_holder: str | None  # who runs the apply in progress, for the status document
    upgrades: Any            # the `llmgw upgrade` rollout (`llmgw.control.upgrade_run.UpgradeRunner`): pause, resume

    # -- reading
    def snapshot(self) -> ControlState:
        """The state now: settings in force and rejected head, fleet with readings, leadership, last pass."""

    def status(self, state: ControlState | None = None, *, readings: bool = True,
               now: float | None = None) -> dict[str, Any]:
        """The status document of `state` (default: now), readings aged at `now` (trio's clock; default: now).
        Given both, it may be called from a worker thread."""

    def webhook_secret(self) -> bytes | None:
        """The forge webhook secret (named secret "webhook"), or None."""

    def secret(self, name: str) -> str | None:
        """The named secret (the secrets directory, else $LLMGW_SECRET_<NAME>), or None when there is none."""

    def gateway_registry(self) -> Any:
        """The Prometheus registry of this control plane's gateway counters, or None when it runs no gateway."""

    def is_connected(self, node_id: str) -> bool:
        """True while `node_id`'s agent has a stream open to this control plane."""

    def recovery(self) -> Recovery:
        """Whether this control plane has its fleet back since it started (`llmgw.control.recovering`)."""

    async def wait_pass(self) -> PassRecord:
        """The record of the next reconcile pass, once it ran. A checkpoint."""

    async def preview(self, rev: str | None, load: RecordedLoad | None = None
                      ) -> tuple[Plan, tuple[ModelForecast, ...]]:
        """The plan `rev` (None: the branch head) would run against the live fleet, and, given the fleet's recent
        `load`, the forecast of each model it changes (`llmgw.plan.forecasting`; () without `load`)."""

    async def preview_with_estimates(self, rev: str | None, load: RecordedLoad | None = None
                                     ) -> tuple[Plan, tuple[ModelForecast, ...], tuple[ExpectedSpeed, ...]]:
        """`preview`'s plan and forecasts, and the decode speed expected of each replica it places on a probed CPU
        node (`llmgw.plan.cpu_speed`)."""

    async def logs(self, node_id: str, shard_id: str, lines: int) -> list[str]:
        """The last `lines` log lines of `shard_id` ("" for the agent's own) on `node_id`."""

    async def fabric_test(self, a: str, b: str) -> dict[str, Any]:
        """`llmgw fabric-test A B`'s graded rails (`llmgw.control.fabric_test.grades_document`)."""

    def last_fabric_tests(self) -> list[dict[str, Any]]:
        """The last fabric test run between each pair of nodes, by pair: `fabric_test`'s document and "at" (unix
        seconds); in memory, since this control plane started."""

    # -- requests
    def kick(self, reason: str) -> None:
        """Bring the next reconcile pass forward."""

    def wake_watcher(self) -> None:
        """Poll the settings branch now."""

    def allow_empty(self, commit: str) -> None:
        """Let settings commit `commit` empty the catalog."""

    def set_reviewed(self, reviewed: ReviewedPlan) -> None:
        """Compare each pass planning `reviewed.commit` with the plan a review showed (recorded in the audit)."""

    async def reload(self, *, force: bool = False, allow_empty: bool = False) -> WatchState:
        """Poll the settings branch now and return where the watcher stands."""

    async def command(self, node_id: str, timeout: float, **body: Any) -> CommandOutcome:
        """Send one command to `node_id`'s agent and wait for its answer."""

    async def apply(self, emit: Emit, *, wait: bool = True, allow_empty: bool = False, timeout: float = 600.0,
                    who: str = "admin API", expect: str = "", reviewed: ReviewedPlan | None = None) -> bool:
        """Converge to the branch head now (with `expect`, only when the head is that revision), reporting
        progress to `emit`."""

    async def restart(self, emit: Emit, *, control_plane: bool = True) -> bool:
        """Restart every agent over its stream, then (with `control_plane`) this control plane."""

    def request_restart(self) -> None:
        """Ask whoever runs this control plane to restart it."""

    async def upgrade(self, tar: Path, *, max_unavailable: int = 1, paused: bool = False,
                      confirm_seconds: float | None = None, ready_timeout: float = 300.0) -> Any:
        """Start `llmgw upgrade` with the release tar at `tar` (`llmgw.control.upgrade_run`); the rollout planned."""

    async def edit_settings(self, edit: Any, author_name: str, author_email: str, *, expect: str = "",
                            preview: bool = False) -> Any:
        """Commit `edit` (a `llmgw.control.effects.SettingsEdit`: stop/start, a node verb, SSH keys, a model's
        replicas or adapters) to the settings branch as the person, only onto head `expect` when given; with `preview`,
        commit nothing and return the diff it would make (`llmgw.settings.EditCommit`)."""

    async def slurm_users(self) -> dict[str, Any]:
        """The Linux users of slurm.yaml `users: llmgw`: {"users": [...]}."""

    async def wipe_node(self, node_id: str, *, keep_weights: bool = False) -> dict[str, Any]:
        """Have a connected node's agent wipe its machine from its install journal and stop (`llmgw node remove`):
        {"node", "report"}, what it removed, one line each."""

    async def forget_node(self, node_id: str) -> dict[str, Any]:
        """Revoke a stopped node's certificates, forget its node secret and its fleet record (`llmgw node remove`):
        {"node", "known", "certificates_revoked", "identity_forgotten"}."""

    def create_join_token(self, ttl_seconds: float = 3600.0) -> dict[str, Any]:
        """A one-time join token for a new node."""

    async def submit_training(self, body: dict[str, Any]) -> dict[str, Any]:
        """Queue a training job (`llmgw.control.training_requests.submit`): its status."""

    def training_jobs(self) -> dict[str, Any]:
        """{"jobs": [...]}: every training job's status."""

    def training_job(self, job_id: str) -> dict[str, Any]:
        """One training job's status."""

    async def cancel_training(self, job_id: str) -> dict[str, Any]:
        """Cancel a training job: its status."""

    async def training_adapter(self, job_id: str) -> dict[str, Any]:
        """A finished training job's adapter: {"job", "name", "size", "sha256", "data_base64"}."""


def failure_documents(state: ControlState) -> list[dict[str, Any]]:
    """The failed actions of `state` waiting to be retried, as the status document lists them: kind, node,
    subject, attempts, error, retry_at (unix seconds)."""
    return [
        {"kind": f.kind, "node": f.node_id, "subject": f.subject, "attempts": f.attempts, "error": f.error,
         "retry_at": f.retry_at_unix}
        for f in state.failures.values()
    ]


def measured_speeds(state: ControlState, wall: float) -> dict[str, dict[str, Any]]:
    """Each replica's speed from its engine's own counters (`llmgw.control.speeds.metrics_speeds`), by replica id,
    as the status document shows it (`speed_document`, its age at `wall`, unix seconds); a replica never measured is
    absent. Pure. (The status adds `llmgw bench` results, which the gateway's feed reads from the store.)"""
    return {rid: speed_document(speed, wall) for rid, speed in metrics_speeds(state.fleet.records()).items()}


def state_document(state: ControlState) -> dict[str, Any]:
    """The status document of `state` (`llmgw.control.audit.status_document`) without readings and without the
    control plane's own section (`ControlView.status` adds both). Pure."""
    return status_document(state.watch, state.fleet.records(), state.last_pass, state.last_plan,
                           failure_documents(state))
