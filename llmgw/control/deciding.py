"""`decide(state, now)`: what the control plane does next, as data. Pure: nothing here awaits or does I/O.

A pass (fixed stages, after Flux's kustomize-controller): take the settings in force and the observed fleet from
the `ControlState`, plan (`llmgw.plan.make_plan`), choose which planned actions to send now, and build the next
state. The caller (`llmgw.control.looping.ControlLoop`) sends the chosen actions afterwards and feeds their
outcomes back as events (`action_answered`, `action_failed`), which build the next state again.

Rules, each checked over seeded random states in tests/control/test_decide_invariants.py:
- nothing is sent while this control plane does not hold the leader lease;
- nothing is sent to a node that is not connected, nor a command needing a feature its agent does not list
  (`llmgw.control.capabilities`; refused at once, naming the node, its agent version and the features);
- an action in flight is not sent again; it stays in flight until its node answered and the fleet shows it
  done (or `settle_after` seconds pass after the answer);
- a failed action waits: `TemporaryError.delay` seconds when the error names one, else 1 s doubling to 60 s;
- a shard that keeps failing is restarted with the same growing backoff;
- (leader) canaries are watched each pass (`llmgw.control.canaries.watch_canaries`) and the planner told what they
  hold (`holds_of`); the applied ref does not move to a commit whose canary failed;
- (leader) once a pass converged to a reviewed commit with a forecast, `reconcile.forecast_check_after` later a
  pass asks for its check (`llmgw.control.forecast_audit.watch_forecast`);
- each pass moves the autoscaled models' wanted counts (`llmgw.control.autoscaling.watch_scales`, leader or not, so
  a standby that takes over has them) and the planner places those counts (`make_plan(replicas=...)`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from llmgw.control.autoscaling import wanted_counts, watch_scales, watch_ttfts
from llmgw.control.canaries import failed_at, holds_of, watch_canaries
from llmgw.control.capabilities import refusal_for
from llmgw.control.forecast_audit import watch_forecast
from llmgw.control.effects import COMMANDS, Command, Effect, RememberNodes, SetApplied, WriteAudit, command_for
from llmgw.control.reports import memory_thresholds, settings_view
from llmgw.control.starting import with_starts_in_flight
from llmgw.control.training import training_step
from llmgw.control.state import (
    RECENT_PASSES, ActionKey, ActionRecord, ControlState, Failure, InFlight, Outcome, PassRecord, PlanBasis, frozen,
)
from llmgw.identity import base_shard_id
from llmgw.plan import plan_or_refusal
from llmgw.plan.types import Action, ActionKind, Fleet, NodeState, Plan, ShardState

BACKOFF_FIRST = 1.0
BACKOFF_MAX = 60.0
SETTLE_AFTER = 15.0

_LIVE = (ShardState.PENDING, ShardState.FETCHING, ShardState.STARTING, ShardState.READY)



def shard_id_of(action: Action) -> str:
    """The shard an action is about: the action's, else its assignment's, else "<replica>/0"."""
    if action.shard_id:
        return action.shard_id
    if action.assignment is not None and action.assignment.shard_id:
        return action.assignment.shard_id
    return base_shard_id(action.replica_id)


def action_key(action: Action) -> ActionKey:
    """Identity of an action across passes: (kind, node, shard id, engine, or agent-settings fingerprint).
    START and RESTART share one."""
    kind = "start" if action.kind in (ActionKind.START, ActionKind.RESTART) else action.kind.value
    if action.kind is ActionKind.INSTALL:
        return (kind, action.node_id, action.engine)
    if action.kind is ActionKind.CONFIGURE:
        return (kind, action.node_id, action.fingerprint)
    return (kind, action.node_id, shard_id_of(action))


def backoff(attempts: int) -> float:
    """Seconds to wait before try `attempts + 1`: 1, 2, 4, ... capped at 60."""
    return min(BACKOFF_MAX, BACKOFF_FIRST * 2 ** max(0, attempts - 1))


def converged(plan: Plan, fleet: Fleet) -> bool:
    """True when nothing is left to do: no action but KEEP, nothing unplaced, every assigned shard READY on a
    live node, and no shard of ours running that the plan does not assign."""
    if plan.changes or plan.unplaced:
        return False
    wanted = {a.shard_id or base_shard_id(a.replica_id) for a in plan.assignments}
    running: dict[str, ShardState] = {}
    for node in fleet.nodes:
        if not node.alive:
            continue
        for shard in node.shards:
            if shard.adopted_foreign or shard.state is ShardState.STOPPED:
                continue
            running[shard.shard_id] = shard.state
    return set(running) == wanted and all(state is ShardState.READY for state in running.values())


def planner_fleet(state: ControlState) -> Fleet:
    """The fleet as the planner sees it: the settings' view of each node (as `fleet_for`: labels laid over, reserved
    cores and memory taken off), lost nodes with `alive=False` and no shards, and per node the agent settings it
    acknowledged on its current connection and what its agent can install and do. One new value per node."""
    settings = state.settings
    acked = state.acked_settings
    nodes = []
    for record in state.fleet.records():
        node = record.state
        changes: dict = {
            "agent_settings_applied": acked.get(node.node_id, "") if settings is not None else None,
            "engines_installable": record.engines_installable or None,
            "features": record.features or None,
        }
        if record.lost:
            changes.update(alive=False, shards=())
        elif not node.alive:
            changes["alive"] = True
        if settings is not None:
            changes.update(settings_view(node, settings))
        nodes.append(replace(node, **changes))
    return Fleet(nodes=tuple(nodes))


def _observed(state: ControlState, node_id: str) -> NodeState | None:
    """`node_id` as the planner sees it (`planner_fleet`) in what `_observed_done` reads: its shards (none while
    lost), engines installed and installing; None for a node never registered. One node, not the fleet."""
    record = state.fleet.get(node_id)
    if record is None:
        return None
    return replace(record.state, shards=()) if record.lost else record.state


def _shard_ready(state: ControlState, node_id: str, shard_id: str) -> bool:
    node = _observed(state, node_id)
    return node is not None and any(s.shard_id == shard_id and s.state is ShardState.READY for s in node.shards)


def _observed_done(action: Action, node: NodeState | None, acked: Mapping[str, str]) -> bool:
    if node is None:
        return False
    if action.kind is ActionKind.CONFIGURE:
        return acked.get(action.node_id) == action.fingerprint
    if action.kind is ActionKind.INSTALL:
        return action.engine in node.engines_installed or action.engine in node.engines_installing
    shard_id = shard_id_of(action)
    shard = next((s for s in node.shards if s.shard_id == shard_id), None)
    if action.kind is ActionKind.STOP:
        return shard is None or shard.state is ShardState.STOPPED
    return shard is not None and shard.state in _LIVE


@dataclass(frozen=True)
class Decision:
    """What one pass decided: the `plan`, the actions to `send` now (in plan order), the pass's `record`, and the
    `effects` to run (`llmgw.control.effects`): a command per action sent, in the same order, then (leader only)
    `RememberNodes` when the connected nodes changed since last kept, `WriteAudit`, and `SetApplied` when the pass
    converged."""

    plan: Plan
    send: tuple[Action, ...]
    record: PassRecord
    effects: tuple[Effect, ...] = ()

    @property
    def commands(self) -> tuple[Command, ...]:
        """The command effects, in plan order."""
        return tuple(e for e in self.effects if isinstance(e, COMMAND_TYPES))


COMMAND_TYPES = COMMANDS


def _starts_in_flight(state: ControlState) -> tuple:
    return tuple((key, flight.action) for key, flight in state.in_flight.items() if key[0] == "start")


def reusable_plan(state: ControlState, allow_empty: bool) -> PlanBasis | None:
    """The basis of `state.last_plan` when planning `state` again would give that very plan; else None.

    Same settings object, same `allow_empty`, same fleet line and revision (nothing the planner reads changed), the
    same acknowledged agent settings and the same STARTs in flight; and the registry's memory thresholds are the
    catalog's, so a card's free memory moving without crossing one cannot change a placement."""
    basis = state.plan_basis
    return basis if basis is not None and _fits(basis, state, allow_empty) else None


def _fits(basis: PlanBasis, state: ControlState, allow_empty: bool) -> bool:
    """Whether planning `state` would give the plan `basis` was made with (see `reusable_plan`)."""
    settings = state.settings
    fleet = state.fleet
    if (basis.settings is not settings or basis.allow_empty != allow_empty
            or basis.fleet_line is not fleet.line or basis.fleet_revision != fleet.revision
            or basis.acked_settings is not state.acked_settings
            or fleet.memory_thresholds != basis.thresholds
            or (basis.holds or state.canaries) and basis.holds != holds_of(state.canaries)
            or (basis.replicas or state.scales) and basis.replicas != wanted_counts(state.scales)):
        return False
    starts = _starts_in_flight(state) if basis.starts or state.in_flight else ()
    return starts == basis.starts


def needs_planning(state: ControlState) -> bool:
    """Whether a pass over `state` plans from scratch (settings are in force and `reusable_plan` finds nothing)."""
    settings = state.settings
    if settings is None:
        return False
    allow_empty = settings.commit is not None and settings.commit == state.allow_empty_commit
    return reusable_plan(state, allow_empty) is None


def plan_stage(state: ControlState) -> tuple[Plan, PlanBasis | None]:
    """Plan `state` from scratch: the plan, and the basis a later pass may reuse it by (`reusable_plan`); basis None
    when the catalog would empty the fleet (the plan then holds only that note). `state.settings` must not be None.

    The costly stage of a pass (about 0.1 ms of CPU per node: `planner_fleet`, `make_plan`, `converged`), and a pure
    function of `state` alone, so the control loop may run it in a worker thread while it keeps folding heartbeats,
    then hand the result to `decide(..., planned=)` (`llmgw.control.looping`)."""
    settings = state.settings
    assert settings is not None
    allow_empty = settings.commit is not None and settings.commit == state.allow_empty_commit
    fleet = planner_fleet(state)
    given = with_starts_in_flight(fleet, state.in_flight)
    holds = holds_of(state.canaries)
    counts = wanted_counts(state.scales)
    plan, refused = plan_or_refusal(settings, given, allow_empty, holds, counts)
    if refused:
        return plan, None
    return plan, PlanBasis(
        settings=settings, allow_empty=allow_empty, fleet=given, fleet_line=state.fleet.line,
        fleet_revision=state.fleet.revision, thresholds=memory_thresholds(settings),
        acked_settings=state.acked_settings,
        starts=_starts_in_flight(state), converged=converged(plan, fleet),
        changes=tuple(a for a in plan.actions if a.kind is not ActionKind.KEEP), holds=holds,
        replicas=counts)


def decide(
    state: ControlState, now: float, *, now_unix: float = 0.0, trigger: str = "timer",
    settle_after: float = SETTLE_AFTER, planned: tuple[Plan, PlanBasis | None] | None = None,
) -> tuple[Decision | None, ControlState]:
    """One reconcile pass over `state` at `now` (control-plane clock seconds; `now_unix` for the records).

    Returns (decision, next state); (None, state) when no settings are in force yet. The next state has the
    pass counted and recorded, the chosen actions in flight, expired in-flight entries, failures of actions no
    longer planned and past timers dropped, and new restart-backoff timers added. Raises nothing for any state.

    A pass whose planner inputs did not change since the last plan (`reusable_plan`: a timer pass, a pass after
    answers or readings only) reuses that plan and its convergence verdict instead of planning the whole fleet
    again: it then costs what its in-flight and failed actions cost, not what the fleet's size does
    (bench/plan_scale.py). The decision is the same either way (tests/control/test_decide_invariants.py).

    `planned`: `plan_stage` of this state or of an earlier one (the loop plans in a thread while heartbeats are
    folded; events only, never a pass, came between). Used when the last plan cannot be reused; the actions are
    then chosen against `state` as it is now (a node lost meanwhile gets nothing, an action in flight is not sent
    again), the basis stays the earlier state's (the next pass plans again when the fleet moved since), and the
    pass reports converged only when the fleet did not move. Of this very state, the decision is exactly the one
    planning here gives (tests/control/test_plan_reuse.py).
    """
    settings = state.settings
    if settings is None:
        return None, state
    allow_empty = settings.commit is not None and settings.commit == state.allow_empty_commit
    canary_effects: list[Effect] = []
    if state.leadership.leader:
        state, canary_effects = watch_canaries(state, now, now_unix)
    state, ttft_effects = watch_ttfts(state, now, now_unix)
    state = watch_scales(state, now)
    timers = tuple(t for t in state.timers if t[0] > now)
    basis = reusable_plan(state, allow_empty)
    stale = False
    if basis is not None:
        plan = state.last_plan
        assert plan is not None
    elif planned is not None and planned[1] is not None and planned[1].settings is settings:
        plan, basis = planned
        stale = not _fits(basis, state, allow_empty)
    else:
        plan, basis = plan_stage(state)
    if basis is None:  # the catalog would empty the fleet: nothing is sent
        records: list[ActionRecord] = []
        send: list[Action] = []
        in_flight, failures, restarts = state.in_flight, state.failures, state.restarts
        done = False
    else:
        if state.leadership.leader:
            records, send, in_flight, failures, restarts, timers = _act(
                state, basis.changes, now, now_unix, settle_after, timers, stale)
        else:
            refusal = (f"another control plane ({state.leadership.holder or 'unknown'}) holds the leader lease; "
                       "this one plans and reports but sends nothing")
            records = [_record(a, Outcome.SKIPPED, refusal) for a in basis.changes]
            send, in_flight, failures, restarts = [], state.in_flight, state.failures, state.restarts
        done = basis.converged and not in_flight and not stale
    number = state.passes + 1
    record = PassRecord(
        number=number, trigger=trigger, settings_commit=settings.commit, started_at=now_unix, duration=0.0,
        actions=tuple(records), unplaced=plan.unplaced, converged=done, notes=plan.notes,
    )
    following = replace(
        state, passes=number, last_pass=record, last_plan=plan, in_flight=_same_or_frozen(state.in_flight, in_flight),
        failures=_same_or_frozen(state.failures, failures), restarts=_same_or_frozen(state.restarts, restarts),
        timers=timers, plan_basis=basis, recovering=state.recovering.latched(state.fleet, now),
    )
    effects: list[Effect] = [command_for(action, state) for action in send]
    effects += canary_effects
    effects += ttft_effects
    if following.leadership.leader:
        following, forecast_effects = watch_forecast(following, now, now_unix)  # this pass's convergence counts
        effects += forecast_effects
        following, training_effects = training_step(following, now_unix)  # a node lost, or given room
        effects += training_effects
        following, leader_effects = _leader_writes(following, record, now)
        effects += leader_effects
    return Decision(plan, tuple(send), record, tuple(effects)), following


def _leader_writes(state: ControlState, record: PassRecord, now: float) -> tuple[ControlState, list[Effect]]:
    """(Leader.) What a pass writes besides its commands: the connected nodes when they changed since last kept and
    the fleet is back (a half-recovered list would let the next start stop waiting too early), the audit commit,
    and the applied ref when it converged."""
    effects: list[Effect] = []
    token = state.leadership.token
    if state.recovery(now).done:
        connected = state.connected()
        if connected != state.remembered:
            state = replace(state, remembered=connected)
            effects.append(RememberNodes(connected))
    effects.append(WriteAudit(record, state, token))
    if record.converged and record.settings_commit and not failed_at(state.canaries, record.settings_commit):
        effects.append(SetApplied(record.settings_commit, token))
    return state, effects


def timed(decision: Decision, state: ControlState, duration: float) -> tuple[Decision, ControlState]:
    """`decision` and the `state` its pass produced, with the pass's `duration` (wall seconds) in its record, the
    pass counted in the tallies, and the `WriteAudit` of the pass over that very state."""
    record = replace(decision.record, duration=duration)
    state = replace(state, last_pass=record, recent_passes=(*state.recent_passes[1 - RECENT_PASSES:], record),
                    tallies=state.tallies.counted_pass(
                        record.converged, duration, tuple(a.kind.value for a in decision.send)))
    effects = tuple(replace(e, record=record, state=state) if isinstance(e, WriteAudit) else e
                    for e in decision.effects)
    return replace(decision, record=record, effects=effects), state


def _same_or_frozen(old: Mapping, new: Mapping) -> Mapping:
    """`old` itself when `new` holds the same entries (so identity checks see nothing changed), else a frozen copy."""
    if new is old or (len(new) == len(old) and all(old.get(k, _MISSING) is v for k, v in new.items())):
        return old
    return frozen(new)


_MISSING = object()


def _record(action: Action, outcome: Outcome, error: str = "", retry_at: float | None = None) -> ActionRecord:
    return ActionRecord(
        kind=action.kind.value, node_id=action.node_id, subject=action_key(action)[2], model=action.model,
        reason=action.reason, outcome=outcome, error=error, retry_at=retry_at, previous_node=action.previous_node,
    )


def _act(state: ControlState, changes: tuple[Action, ...], now: float, now_unix: float, settle_after: float,
         timers: tuple[tuple[float, str], ...], stale: bool = False):
    """Choose which of `changes` to send now. `stale`: the plan was made before events that moved the fleet, so an
    action in flight before this pass, or one the fleet already shows done, waits for the next plan (an answered
    START whose shard the node reports now is not sent again)."""
    planned = {action_key(a) for a in changes}
    in_flight = {
        key: flight for key, flight in state.in_flight.items()
        if not (flight.answered_at is not None and (
            _observed_done(flight.action, _observed(state, flight.action.node_id), state.acked_settings)
            or now - flight.answered_at > settle_after))
    }
    failures = {key: f for key, f in state.failures.items() if key in planned}
    restarts = {key: r for key, r in state.restarts.items() if not _shard_ready(state, key[1], key[2])}
    timers_out = list(timers)
    records: list[ActionRecord] = []
    send: list[Action] = []
    for action in changes:
        key = action_key(action)
        record = state.fleet.get(action.node_id)
        if record is None or record.lost or not record.connected:
            why = "is lost" if record is None or record.lost else "is not connected; the command waits for it"
            records.append(_record(action, Outcome.SKIPPED, f"node {action.node_id} {why}"))
            continue
        if key in in_flight or (stale and (key in state.in_flight or _observed_done(
                action, _observed(state, action.node_id), state.acked_settings))):
            records.append(_record(action, Outcome.IN_FLIGHT))
            continue
        refusal = refusal_for(action, state)
        if refusal is not None:
            records.append(_record(action, Outcome.REFUSED, refusal))
            continue
        failure = failures.get(key)
        if failure is not None and failure.retry_at > now:
            records.append(_record(action, Outcome.BACKING_OFF, failure.error, failure.retry_at_unix))
            continue
        if action.kind is ActionKind.RESTART:
            restart = restarts.get(key)
            if restart is not None and restart.retry_at > now:
                waits = f"restart {restart.attempts + 1} waits: {restart.error}"
                records.append(_record(action, Outcome.BACKING_OFF, waits, restart.retry_at_unix))
                continue
            attempts = (restart.attempts if restart else 0) + 1
            delay = backoff(attempts)
            restarts[key] = Failure(attempts=attempts, error=action.reason or "the shard failed",
                                    retry_at=now + delay, retry_at_unix=now_unix + delay,
                                    kind=key[0], node_id=key[1], subject=key[2])
            timers_out.append((now + delay, f"restart backoff of {key[2]} over"))
        in_flight[key] = InFlight(action, now)
        send.append(action)
        records.append(_record(action, Outcome.SENT))
    for key, flight in in_flight.items():  # starts the planner held as pending shards (llmgw.control.starting)
        if key[0] == "start" and key not in planned:
            records.append(_record(flight.action, Outcome.IN_FLIGHT))
    return records, send, in_flight, failures, restarts, tuple(timers_out)


# -- events: an action's outcome builds the next state ------------------------------------------------------

def action_answered(state: ControlState, key: ActionKey, now: float) -> ControlState:
    """The node answered `key`'s command with success: it stays in flight until the fleet shows it done; its
    failure is forgotten; a CONFIGURE's fingerprint counts as acknowledged by the node."""
    flight = state.in_flight.get(key)
    in_flight = dict(state.in_flight)
    acked = state.acked_settings
    if flight is not None:
        in_flight[key] = replace(flight, answered_at=now)
        if flight.action.kind is ActionKind.CONFIGURE:
            acked = frozen({**state.acked_settings, flight.action.node_id: flight.action.fingerprint})
    failures = {k: f for k, f in state.failures.items() if k != key}
    return replace(state, in_flight=frozen(in_flight), failures=frozen(failures), acked_settings=acked)


def action_failed(
    state: ControlState, key: ActionKey, error: str, now: float, *, delay: float | None = None, now_unix: float = 0.0,
) -> ControlState:
    """`key`'s command failed with `error`: out of flight, retried after `delay` seconds when given (a
    TemporaryError's own delay), else after the growing backoff; a timer wakes the pass that retries it."""
    previous = state.failures.get(key)
    attempts = (previous.attempts if previous else 0) + 1
    wait = delay if delay is not None else backoff(attempts)
    failure = Failure(attempts=attempts, error=error, retry_at=now + wait, retry_at_unix=now_unix + wait,
                      kind=key[0], node_id=key[1], subject=key[2])
    in_flight = {k: f for k, f in state.in_flight.items() if k != key}
    return replace(
        state, in_flight=frozen(in_flight), failures=frozen({**state.failures, key: failure}),
        timers=(*state.timers, (now + wait, f"retry of {key[0]} {key[2]}")),
    )


def node_connected(state: ControlState, node_id: str) -> ControlState:
    """A node (re)registered: what it acknowledged on an earlier connection no longer counts, and commands in
    flight to it were lost with that connection."""
    acked = {k: v for k, v in state.acked_settings.items() if k != node_id}
    in_flight = {k: f for k, f in state.in_flight.items() if k[1] != node_id}
    return replace(state, acked_settings=frozen(acked), in_flight=frozen(in_flight))
