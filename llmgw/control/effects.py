"""Effects: what the control plane does next, as data. Pure: frozen values, no I/O.

`llmgw.control.deciding.decide` returns them for a pass, and an event's transition may return them too (a heartbeat
with ended Slurm jobs asks for `RecordSlurmUsage`, a placement-relevant change for `PublishRoutingTable`). The control
loop (`llmgw.control.looping`) hands each one to the one async handler its type has in the registry
(`llmgw.control.handlers`); what the handler learns comes back as a transition on the loop's channel. A tagged
union: one class per kind, each field meaning one thing.

Commands to an agent (each answered by the node; the loop turns the answer into `action_answered` /
`action_failed`):
- `StartShard`: a START or RESTART `action` (they share one `key`: a restart is a start again).
- `StopShard`: a STOP `action`.
- `InstallEngine`: an INSTALL `action`, for the node's `platform` ("linux-x86_64").
- `ConfigureAgent`: the agent settings of `node_id` whose fingerprint is `fingerprint`; `fleet` is the fleet the
  node's part in Slurm is worked out from.

Writes of the leader after a pass: `WriteAudit` (an audit commit of the pass when the status changed or a command
was sent), `SetApplied` (refs/llmgw/applied moves to a commit the fleet converged to), `RememberNodes` (the
connected node ids kept in the store, so a control plane started again knows whom to wait for).

Events' effects: `RecordSlurmUsage` (ended Slurm jobs priced into usage, then the sacct cursor moved),
`PublishRoutingTable` (the gateway's routing table rebuilt from `state`) and `CommitSettings` (a person's edit
committed to the settings branch, authored by them: `llmgw stop|start`, node verbs, SSH keys; the only way llmgw
writes desired state).

Canaries (`llmgw.control.canaries`): `MeasureCanary` (read a canary's requests from the usage records; answered
with `canary_measured`) and `ProposeRevert` (a revert of a failed canary's settings commit, pushed to a branch of
its own, never the settings branch; answered with `revert_proposed`).

The forecast's check (`llmgw.control.forecast_audit`): `MeasureForecast` (read the load recorded since a reviewed
change converged and compare it with the review's forecast; answered with `forecast_measured`).

The autoscaler (`llmgw.control.autoscaling`): `MeasureTtft` (read a model's recent TTFT p90 from the usage records,
for its `ttft_p90` target; answered with `ttft_measured`).

Taking a node's host back (`llmgw node remove`): `WipeNode` (its agent wipes the host from its install journal and
stops; answered to the requester by `llmgw.control.node_wiping`).

Every command effect carries `token`, the leader lease's fencing token of the pass that chose it (the agent refuses
an older term's), and `settings`, the settings in force for that pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union

from llmgw.control.registry import FleetRegistry
from llmgw.control.state import ControlState, PassRecord
from llmgw.plan.types import Action, ActionKind
from llmgw.settings.model import Settings
from llmgw.settings.model_commits import ModelServing


@dataclass(frozen=True)
class _PlannedCommand:
    """A command that carries out one planned `action` under the pass's `settings`, with the lease's `token`."""

    action: Action
    settings: Settings
    token: int = 0

    @property
    def node_id(self) -> str:
        return self.action.node_id


@dataclass(frozen=True)
class StartShard(_PlannedCommand):
    """Start (or restart) the shard of `action` (kind START or RESTART) on its node."""


@dataclass(frozen=True)
class StopShard(_PlannedCommand):
    """Stop the shard of `action` (kind STOP) on its node, within the node's `shard_stop_grace`."""


@dataclass(frozen=True)
class InstallEngine(_PlannedCommand):
    """Install the engine version `action.engine` ("llama.cpp@b11434") on its node, the archive for `platform`."""

    platform: str = "linux-x86_64"


@dataclass(frozen=True)
class ConfigureAgent:
    """Send `node_id` its agent settings (with its part in Slurm, worked out from `fleet`); `fingerprint` is what
    the node acknowledges them by (`llmgw.plan.agent_settings_fingerprint`). `action`: the planned CONFIGURE."""

    node_id: str
    fingerprint: str
    action: Action
    settings: Settings
    fleet: FleetRegistry
    token: int = 0


Command = Union[StartShard, StopShard, InstallEngine, ConfigureAgent]
"""The effects that are commands to one node's agent."""


@dataclass(frozen=True)
class WriteAudit:
    """(Leader.) Queue the audit commit of pass `record` over `state` (the state that pass produced), unless
    nothing was sent and the status is what `state.audit_snapshot` holds. `token`: the lease's fencing token."""

    record: PassRecord
    state: ControlState
    token: int = 0


@dataclass(frozen=True)
class SetApplied:
    """(Leader.) Move refs/llmgw/applied to settings commit `commit`: the fleet converged to it."""

    commit: str
    token: int = 0


@dataclass(frozen=True)
class RememberNodes:
    """(Leader.) Keep `nodes`, the connected node ids, in the store (llmgw.control.recovering)."""

    nodes: frozenset[str]


@dataclass(frozen=True)
class RecordSlurmUsage:
    """Record the ended Slurm jobs `jobs` ((request id, usage record) pairs, `llmgw.control.slurm_usage`) reported
    by `node_id` for Slurm cluster `cluster`; then, when `until` (unix seconds) is given and no job failed, move the
    cluster's sacct cursor there and tell the node. `failed`: request ids whose recording failed before."""

    node_id: str
    cluster: str
    jobs: tuple[tuple[str, Any], ...]
    until: float = 0.0
    failed: frozenset[str] = frozenset()


@dataclass(frozen=True)
class PublishRoutingTable:
    """Rebuild the gateway's routing table from `state` and hand it to the gateway: `at_once` (the settings
    changed), or paced by how long a rebuild takes (`llmgw.control.pacing`)."""

    state: ControlState
    at_once: bool = False


@dataclass(frozen=True)
class ServingStopped:
    """The edit of `llmgw stop` (`stopped` True) and `llmgw start`: llmgw.yaml's `serving.stopped`."""

    stopped: bool


@dataclass(frozen=True)
class NodeVerb:
    """The edit of `llmgw node cordon|uncordon|drain NODE` and `llmgw slurm lend|reclaim NODE` (`verb`)."""

    verb: str
    node: str


@dataclass(frozen=True)
class SshKeys:
    """The edit of `llmgw slurm users keys add|remove` (`action`): `keys` (OpenSSH public keys) of member `email`."""

    action: str
    email: str
    keys: tuple[str, ...]


@dataclass(frozen=True)
class ModelReplicas:
    """The edit of a model's replica count (`count`), or of its autoscaled range `low`..`high` (`count` None)."""

    model: str
    count: int | None = None
    low: int | None = None
    high: int | None = None


@dataclass(frozen=True)
class ModelAdapter:
    """The edit adding (`action` "add", with `weights`: (source, sha256) pairs) or removing LoRA adapter `name` of
    `model`."""

    action: str
    model: str
    name: str
    weights: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class ModelServe:
    """The edit adding a new model `model` to the catalog (the model explorer's serve form): its file as `serving`
    says (`llmgw.settings.model_commits.ModelServing`)."""

    model: str
    serving: ModelServing


SettingsEdit = Union[ServingStopped, NodeVerb, SshKeys, ModelReplicas, ModelAdapter, ModelServe]
"""What a person asks to change in the settings (llmgw.settings.node_commits and model_commits write each, through
llmgw.settings.edit_commits.commit_edit)."""


@dataclass(frozen=True)
class CommitSettings:
    """Commit `edit` to the settings branch as the person `author_name` <`author_email`>. `request`: the id the
    requester waits on for the commit (or the error) the handler answers with (`llmgw.control.operating`).
    `expect`: the branch head the person saw the edit's diff against ("": any); another head refuses the commit."""

    request: str
    edit: SettingsEdit
    author_name: str
    author_email: str
    expect: str = ""


@dataclass(frozen=True)
class MeasureCanary:
    """Read the usage records of `model`'s canary: requests for `model` answered by replica `replica`
    ("<replica>@canary") started from settings commit `commit`, since `since_unix` (unix seconds), `elapsed` seconds
    after the canary was ready."""

    model: str
    commit: str
    replica: str
    since_unix: float
    elapsed: float = 0.0


@dataclass(frozen=True)
class MeasureTtft:
    """Read the TTFT p90 of `model`'s requests since `since_unix` (unix seconds) from the usage records, for the
    autoscaler's `ttft_p90` target (`llmgw.control.autoscaling`); asked at `asked_at` (control-plane clock)."""

    model: str
    since_unix: float
    asked_at: float


@dataclass(frozen=True)
class ProposeRevert:
    """Write a commit reverting settings commit `commit` (whose canary of `model` failed: `reason`) on top of it, to
    the branch `branch` of the settings repository (created, or left as it is when it holds that revert already)."""

    model: str
    commit: str
    branch: str
    reason: str


@dataclass(frozen=True)
class MeasureForecast:
    """Read the load the usage records hold since `since_unix` (unix seconds: when reviewed settings commit `commit`
    converged), a window up to `until_unix` (the pass that asked), and compare it with `forecast` (the review's
    `forecast.models`)."""

    commit: str
    forecast: tuple[Any, ...]
    since_unix: float
    until_unix: float


@dataclass(frozen=True)
class WipeNode:
    """Tell `node_id`'s agent to take llmgw off its host (`llmgw node remove NODE`, once drained): it stops its
    engines, undoes the host's install journal (with `keep_weights`, the weights stay), answers with what it removed
    and stops itself (`llmgw.agent.wiping`). `request`: the id the requester waits on for the answer
    (`llmgw.control.node_wiping`); `timeout`: seconds to wait for it; `token`: the lease's fencing token."""

    request: str
    node_id: str
    keep_weights: bool = False
    timeout: float = 300.0
    token: int = 0


Effect = Union[StartShard, StopShard, InstallEngine, ConfigureAgent, WriteAudit, SetApplied, RememberNodes,
               RecordSlurmUsage, PublishRoutingTable, CommitSettings, MeasureCanary, MeasureTtft, ProposeRevert,
               MeasureForecast, WipeNode]
"""Every kind of effect (see the module docstring)."""

COMMANDS = (StartShard, StopShard, InstallEngine, ConfigureAgent)


def command_for(action: Action, state: ControlState) -> Command:
    """The command effect of a planned action chosen to be sent (kind START, RESTART, STOP, INSTALL or CONFIGURE)
    in a pass over `state` (whose settings must be in force). Raises ValueError for KEEP."""
    settings = state.settings
    assert settings is not None
    token = state.leadership.token
    if action.kind in (ActionKind.START, ActionKind.RESTART):
        return StartShard(action, settings, token)
    if action.kind is ActionKind.STOP:
        return StopShard(action, settings, token)
    if action.kind is ActionKind.INSTALL:
        record = state.fleet.get(action.node_id)
        return InstallEngine(action, settings, token,
                             platform=platform_of(record.os, record.arch) if record else "linux-x86_64")
    if action.kind is ActionKind.CONFIGURE:
        return ConfigureAgent(action.node_id, action.fingerprint, action, settings, state.fleet, token)
    raise ValueError(f"a {action.kind.value} action is not a command")


def platform_of(os_name: str, arch: str) -> str:
    """engines.yaml's platform key for what an agent reports: ("Linux 6.8.0", "x86_64") -> "linux-x86_64"."""
    system = (os_name.split() or ["linux"])[0].lower()
    machine = {"amd64": "x86_64", "arm64": "aarch64"}.get(arch.lower(), arch.lower() or "x86_64")
    return f"{system}-{machine}"
