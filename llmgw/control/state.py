"""`ControlState`: the control plane's one state, an immutable value.

Everything the control plane knows lives here: the settings in force and a rejected branch head, the fleet with
every heartbeat's readings, leadership, the applied commit, the actions in flight, failures and backoffs, and
which agent settings each node acknowledged. Every event builds the next state from the previous one (see
`llmgw.control.looping`); `llmgw.control.deciding.decide` turns a state into actions and the next state. Readers
(admin API, status, CLI) get the state itself: it cannot change under them.

Pure: no trio, no I/O. Times named `*_at` without `_unix` are on the control plane's clock (`trio.current_time()`),
`*_unix` are unix seconds for people.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from types import MappingProxyType

from llmgw.control.recovering import DEFAULT_GRACE, Recovery, recovery
from llmgw.control.registry import FleetRegistry
from llmgw.control.tallies import Tallies
from llmgw.control.upgrades import Upgrade
from llmgw.errors import Issue
from llmgw.plan.autoscaling import Scale, Ttft
from llmgw.plan.canary import CanaryHold
from llmgw.plan.forecast_check import ForecastCheck
from llmgw.plan.reviewed import ReviewedPlan
from llmgw.plan.types import Action, Fleet, Plan, Unplaced
from llmgw.settings.model import Model, Rollout, Settings
from llmgw.training.jobs import TrainingBook

ActionKey = tuple[str, str, str]
"""(kind, node id, subject): one planned action, whatever pass planned it. See `action_key`."""


def frozen(mapping: Mapping | None = None) -> Mapping:
    """A read-only copy of `mapping`."""
    return MappingProxyType(dict(mapping or {}))


@dataclass(frozen=True)
class RejectedCommit:
    """A branch head that is not in force: `commit` id, `issues` found (file, line, reason), when seen (unix s)."""

    commit: str
    issues: tuple[Issue, ...]
    seen_at: float

    def describe(self) -> str:
        lines = [f"settings commit {self.commit[:12]} is not applied:"]
        lines += [f"  {issue}" for issue in self.issues]
        return "\n".join(lines)


@dataclass(frozen=True)
class WatchState:
    """Where the settings watcher stands.

    `settings` is the settings in force (None before any commit validated); `head` the branch head last read;
    `bad` the head when it does not validate; `held` the head when the empty-catalog guard holds it back;
    `remote_error` a sentence when the last fetch failed (None when it worked or there is no remote);
    `last_poll` unix seconds of the last poll. `applied`: the settings of `refs/llmgw/applied` when the first settings
    put in force were another commit (a control plane started while the fleet had not converged to the head), what a
    canary compares the head with (`llmgw.control.canaries`); None otherwise.
    """

    settings: Settings | None = None
    head: str | None = None
    bad: RejectedCommit | None = None
    held: RejectedCommit | None = None
    remote_error: str | None = None
    last_poll: float | None = None
    applied: Settings | None = None


@dataclass(frozen=True)
class Leadership:
    """Whether this control plane holds the leader lease, and who does (`holder`, None when unknown).

    `token`: the lease's fencing token while this control plane leads (0 otherwise); every command carries it.
    `until`: when this control plane stops commanding unless it renews (control-plane clock; None when not leading).
    """

    leader: bool = False
    holder: str | None = None
    token: int = 0
    until: float | None = None


class _Connected:
    """The node ids whose agents are connected, as `recovery` asks about them (`id in connected`), read from the
    fleet one id at a time (no set of the whole fleet is built)."""

    __slots__ = ("fleet",)

    def __init__(self, fleet: FleetRegistry) -> None:
        self.fleet = fleet

    def __contains__(self, node_id: object) -> bool:
        record = self.fleet.get(node_id) if isinstance(node_id, str) else None
        return record is not None and record.connected


@dataclass(frozen=True)
class Recovering:
    """How this control plane learns its fleet back after it started (`llmgw.control.recovering`).

    `known`: the node ids the store named at start (connected to the leader before); `started_at` (control-plane
    clock) and `grace` (seconds): how long it waits for them at most. `recovered`: the Recovery once done (every
    known node connected, or the grace over); from then on it stays so (a node lost later is the fleet's business).
    The default (no known nodes) is recovered from the start.
    """

    known: frozenset[str] = frozenset()
    started_at: float = 0.0
    grace: float = DEFAULT_GRACE
    recovered: Recovery | None = None

    def at(self, fleet: FleetRegistry, now: float) -> Recovery:
        """Where recovery stands at `now` (control-plane clock) with the nodes `fleet` has connected."""
        if self.recovered is not None:
            return self.recovered
        return recovery(self.known, _Connected(fleet), self.started_at, now, self.grace)

    def latched(self, fleet: FleetRegistry, now: float) -> Recovering:
        """This value, or once recovery is done at `now`, a copy that keeps that Recovery."""
        if self.recovered is not None:
            return self
        current = self.at(fleet, now)
        return replace(self, recovered=current) if current.done else self


@dataclass(frozen=True)
class InFlight:
    """An action sent to its node: when (`started`), and when the node answered (None: not yet)."""

    action: Action
    started: float
    answered_at: float | None = None


@dataclass(frozen=True)
class Failure:
    """An action that failed: how often in a row, its last error, and when it may be tried again.

    `retry_at` on the control plane's clock, `retry_at_unix` the same moment in unix seconds.
    """

    attempts: int
    error: str
    retry_at: float
    retry_at_unix: float = 0.0
    kind: str = ""
    node_id: str = ""
    subject: str = ""


class Outcome(StrEnum):
    """What a pass did with one planned action (`ActionRecord.outcome`); the value is what documents show."""

    SENT = "sent"                # its command was issued this pass
    IN_FLIGHT = "in flight"      # issued earlier, not done yet
    BACKING_OFF = "backing off"  # failed before; tried again at `retry_at`
    SKIPPED = "skipped"          # cannot be sent (`error` says why: not connected, not the leader, ...)
    REFUSED = "refused"          # the node cannot do it (`error` names the node and its agent version)


@dataclass(frozen=True)
class ActionRecord:
    """What a pass did with one planned action.

    `outcome`: an `Outcome` (sent, in flight, backing off with the next try at `retry_at` in unix seconds, skipped
    or refused with `error` saying why).
    """

    kind: str
    node_id: str
    subject: str
    model: str
    reason: str
    outcome: Outcome
    error: str = ""
    retry_at: float | None = None
    previous_node: str = ""


@dataclass(frozen=True)
class PassRecord:
    """One reconcile pass: its number, trigger, settings commit, start (unix s), duration (s), actions,
    unplaced replicas, whether the fleet is converged to the commit, and notes."""

    number: int
    trigger: str
    settings_commit: str | None
    started_at: float
    duration: float
    actions: tuple[ActionRecord, ...] = ()
    unplaced: tuple[Unplaced, ...] = ()
    converged: bool = False
    notes: tuple[str, ...] = ()

    @property
    def sent(self) -> tuple[ActionRecord, ...]:
        return tuple(a for a in self.actions if a.outcome == Outcome.SENT)


@dataclass(frozen=True)
class PlanBasis:
    """What `ControlState.last_plan` was made from, kept so that a pass over the same inputs reuses that plan
    instead of planning the whole fleet again (see `llmgw.control.deciding.decide`).

    `settings` (the very object), `allow_empty`, `fleet` (the very fleet `make_plan` was given, recorded in the
    audit commit: `llmgw.plan.recorded`; not compared: a reused plan keeps the fleet it was made from, which may
    differ from today's in what the planner cannot see, such as free memory between two thresholds), the fleet
    registry's `fleet_line` and `fleet_revision` (see
    `FleetRegistry.revision`), `thresholds` (the per-GPU memory needs of the catalog, bytes: the plan is reused only
    while the registry judges free memory against these), `acked_settings` (the very mapping) and `starts` (the START actions in flight, by key,
    which the planner counts as pending shards). `converged`: the plan's fleet shows every assigned shard READY and
    nothing else of ours running. `changes`: the plan's actions other than KEEP, in plan order.
    `holds` and `replicas`: the canaries and the autoscaler's counts the planner was told.
    """

    settings: Settings
    allow_empty: bool
    fleet: Fleet = field(compare=False)  # a record of the input (for the audit), not what a reuse is judged by
    fleet_line: object
    fleet_revision: int
    thresholds: tuple[int, ...]
    acked_settings: Mapping[str, str]
    starts: tuple[tuple[ActionKey, Action], ...]
    converged: bool
    changes: tuple[Action, ...]
    holds: Mapping[str, CanaryHold] = field(default_factory=frozen)
    replicas: Mapping[str, int] = field(default_factory=frozen)


class CanaryPhase(StrEnum):
    RUNNING = "running"
    HELD = "held"
    FAILED = "failed"


@dataclass(frozen=True)
class Canary:
    """One model's canary rollout (`llmgw.control.canaries` builds and judges it; `llmgw.plan.canary` the rules).

    `model`; `commit`: the settings commit of the revision under test; `previous_commit`: the settings in force
    before it, whose `previous` definition of the model its old replicas run; `fingerprint`: the new revision's;
    `replica_id`: the replica whose new generation is the canary; `rollout`: the model's policy. `phase`: running,
    held (the SLOs held: the rest rolls out) or failed. `ready_at` / `ready_at_unix`: when its shard was first seen
    ready (None: not yet); `check_at`: when it is measured next (control-plane clock; None: not due);
    `measuring`: a measurement is under way. `reason`: the verdict's sentence; `requests`, `error_rate`,
    `ttft_p90` (seconds) its figures. `revert_branch`: the branch the proposed revert was pushed to ("" none yet);
    `revert_error`: why it could not be.
    """

    model: str
    commit: str
    previous_commit: str | None
    previous: Model
    fingerprint: str
    replica_id: str
    rollout: Rollout
    phase: CanaryPhase = CanaryPhase.RUNNING
    ready_at: float | None = None
    ready_at_unix: float = 0.0
    check_at: float | None = None
    measuring: bool = False
    reason: str = ""
    requests: int = 0
    error_rate: float | None = None
    ttft_p90: float | None = None
    revert_branch: str = ""
    revert_error: str = ""


@dataclass(frozen=True)
class ForecastAudit:
    """The check of a reviewed change's forecast once it ran (`llmgw.control.forecast_audit`).

    `commit`: the reviewed settings commit; `forecast`: the review's `forecast.models`; `converged_at` /
    `converged_at_unix`: when a pass first found the fleet converged to it (the window starts); `check_at`: when its
    load is measured (control-plane clock); `measuring`: a measurement is under way. Once measured: `checks` (one
    `ForecastCheck` per model, None: not yet), `window` (seconds measured) and `until` (ISO 8601 UTC); `error`: why
    the load could not be read ("" none).
    """

    commit: str
    forecast: tuple[Mapping, ...]
    converged_at: float
    converged_at_unix: float
    check_at: float
    measuring: bool = False
    checks: tuple[ForecastCheck, ...] | None = None
    window: float = 0.0
    until: str = ""
    error: str = ""


RECENT_PASSES = 100
"""Pass records `ControlState.recent_passes` keeps."""

SLURM_RECORDED_MAX = 20000
"""Ended Slurm jobs whose usage a control plane remembers having recorded (the store dedups beyond that)."""


@dataclass(frozen=True)
class SlurmLedger:
    """Which ended Slurm jobs this control plane recorded into usage (llmgw.control.slurm_usage).

    `recorded`: request ids recorded or being recorded, oldest first (at most `SLURM_RECORDED_MAX`); `cursors`: per
    Slurm cluster, the sacct cursor (unix seconds) last written or being written; `failed`: request ids whose
    recording failed (the cursor does not move past them; the agent sends them again).
    """

    recorded: Mapping[str, None] = field(default_factory=frozen)
    cursors: Mapping[str, float] = field(default_factory=frozen)
    failed: frozenset[str] = frozenset()


@dataclass(frozen=True)
class ControlState:
    """The control plane's one state. Build the next one with `dataclasses.replace` or the `with_*` helpers.

    `watch`: the settings watcher's view (settings in force, rejected head). `fleet`: every node with its last
    heartbeat's readings. `leadership`: the leader lease. `applied`: the last settings commit the fleet fully
    converged to. `in_flight`, `failures`, `restarts`: actions by `ActionKey`. `acked_settings`: node id ->
    fingerprint of the agent settings its agent acknowledged on its current connection. `allow_empty_commit`:
    a commit `llmgw apply --allow-empty` let empty the catalog. `passes`, `last_pass`, `last_plan`: the latest
    reconcile pass. `timers`: wake-up times (control-plane clock) with their reason, for backoffs. `tallies`:
    running counts of passes and actions (llmgw.control.tallies), what /metrics exports. `plan_basis`: what
    `last_plan` was made from (None: nothing to reuse). `recovering`: how far the control plane has its fleet back
    since it started (the gateway's /health says "recovering" until then; latched by each pass once done).
    `audit_snapshot`: the status snapshot (`llmgw.control.audit.audit_snapshot`) of the last audit commit queued
    (None: none yet). `remembered`: the connected node ids last kept in the store as leader (None: not yet, or the
    write failed). `slurm`: the Slurm jobs recorded into usage and the sacct cursors. `apply_holder`: who runs the
    `llmgw apply` in progress (None: none). `recent_passes`: the latest passes' records (at most
    `RECENT_PASSES`), oldest first. `restart_notes`: the settings in force that only a restart of the control plane
    applies (llmgw.control.restart_only), one sentence each. `reviewed`: the plan the last `llmgw apply --review`
    showed (None: none); each audit commit of a pass planning its commit records where the pass differs from it.
    `canaries`: model name -> its canary rollout (`Canary`; runtime state, forgotten by a restart).
    `forecast_audit`: the check of the reviewed change's forecast (`ForecastAudit`; runtime state, forgotten by a
    restart, as `reviewed` is; None: none).
    `scales`: model name -> the autoscaler's `Scale` of each model whose settings give a replica range (wanted
    count, last decision's reason; `llmgw.control.autoscaling`). `held`: model name -> requests the gateway holds
    for it, waiting for a replica (absent: none). `ttfts`: model name -> the TTFT p90 of its recent requests, read
    from the usage records for models with a `ttft_p90` target (`Ttft`). `upgrade`: the last `llmgw upgrade`
    rollout (`llmgw.control.upgrades.Upgrade`; runtime state, forgotten by a restart; None: none since the start).
    `training`: the training jobs and how each stands (`llmgw.training.jobs.TrainingBook`; runtime state,
    forgotten by a restart; `llmgw.control.training`).
    """

    watch: WatchState = WatchState()
    fleet: FleetRegistry = field(default_factory=lambda: FleetRegistry(lost_after=30.0))
    leadership: Leadership = Leadership()
    applied: str | None = None
    in_flight: Mapping[ActionKey, InFlight] = field(default_factory=frozen)
    failures: Mapping[ActionKey, Failure] = field(default_factory=frozen)
    restarts: Mapping[ActionKey, Failure] = field(default_factory=frozen)
    acked_settings: Mapping[str, str] = field(default_factory=frozen)
    allow_empty_commit: str | None = None
    passes: int = 0
    last_pass: PassRecord | None = None
    last_plan: Plan | None = None
    timers: tuple[tuple[float, str], ...] = ()
    tallies: Tallies = Tallies()
    plan_basis: PlanBasis | None = None
    recovering: Recovering = Recovering()
    audit_snapshot: Mapping | None = None
    remembered: frozenset[str] | None = None
    slurm: SlurmLedger = SlurmLedger()
    apply_holder: str | None = None
    recent_passes: tuple[PassRecord, ...] = ()
    restart_notes: tuple[str, ...] = ()
    reviewed: ReviewedPlan | None = None
    canaries: Mapping[str, Canary] = field(default_factory=frozen)
    scales: Mapping[str, Scale] = field(default_factory=frozen)
    held: Mapping[str, int] = field(default_factory=frozen)
    ttfts: Mapping[str, Ttft] = field(default_factory=frozen)
    forecast_audit: ForecastAudit | None = None
    upgrade: Upgrade | None = None
    training: TrainingBook = TrainingBook()

    @property
    def settings(self) -> Settings | None:
        """The settings in force (None before any commit validated)."""
        return self.watch.settings

    def connected(self) -> frozenset[str]:
        """The ids of the nodes whose agents have a stream open to this control plane (the fleet's records say so:
        the one place connections are kept; the agent hub holds only the streams)."""
        return frozenset(r.node_id for r in self.fleet.records() if r.connected)

    def with_fleet(self, fleet: FleetRegistry) -> ControlState:
        return self if fleet is self.fleet else replace(self, fleet=fleet)

    def recovery(self, now: float) -> Recovery:
        """Whether the fleet known at start is back at `now` (control-plane clock): see `Recovering`."""
        return self.recovering.at(self.fleet, now)

    def recovering_from(self, known: frozenset[str], now: float, grace: float) -> ControlState:
        """The state of a control plane that starts at `now` waiting at most `grace` seconds for the nodes `known`
        (a timer wakes a pass when the grace ends, which latches the outcome)."""
        return replace(self, recovering=Recovering(known, now, grace),
                       timers=(*self.timers, (now + grace, "recovery grace over")) if known else self.timers)

    def next_timer(self) -> float | None:
        """The earliest wake-up time (control-plane clock), None when none is set."""
        return min((at for at, _ in self.timers), default=None)
