"""The reconciler: level-triggered passes that bring the fleet to the settings in force.

Each pass (fixed stages, after Flux's kustomize-controller): take the settings in force and the observed fleet,
plan (`llmgw.plan.make_plan`), send each action that is not already under way, and record what was done. Events
(a new settings commit, an agent connecting, a shard changing state) only call `kick()` to bring the next pass
forward; a pass also runs every `reconcile_interval` seconds, so nothing depends on an event arriving.

Actions run as commands in the reconciler's own nursery, at most `concurrency` at a time, each under the
`action_timeout` deadline of the settings. An action stays "in flight" until its agent answers and the fleet
shows it done (or `settle_after` seconds pass after the answer); a failed action is retried with exponential
backoff (1 s doubling to 60 s) and reported in `failures` until a later pass sees it done or no longer planned.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import trio

from llmgw.control.commands import action_key, shard_id_of
from llmgw.errors import LlmgwError
from llmgw.plan import EmptiedCatalogError, make_plan
from llmgw.identity import ShardState
from llmgw.plan.types import Action, ActionKind, Fleet, Plan, Unplaced
from llmgw.settings.model import Settings

BACKOFF_FIRST = 1.0
BACKOFF_MAX = 60.0

_LIVE = (ShardState.PENDING, ShardState.FETCHING, ShardState.STARTING, ShardState.READY)


@dataclass(frozen=True)
class ActionRecord:
    """What a pass did with one planned action.

    `outcome`: "sent" (command issued this pass), "in flight" (issued earlier, not done yet), "backing off"
    (failed before; next try at `retry_at`, unix seconds), "skipped" (cannot be sent: `error` says why).
    """

    kind: str
    node_id: str
    subject: str
    model: str
    reason: str
    outcome: str
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
        return tuple(a for a in self.actions if a.outcome == "sent")


@dataclass
class _InFlight:
    action: Action
    started: float
    answered_at: float | None = None


@dataclass
class Failure:
    """An action that failed: how often in a row, its last error, and when it may be tried again (trio time)."""

    attempts: int
    error: str
    retry_at: float
    retry_at_unix: float = 0.0
    kind: str = ""
    node_id: str = ""
    subject: str = ""


def backoff(attempts: int) -> float:
    """Seconds to wait before try `attempts + 1`: 1, 2, 4, ... capped at 60."""
    return min(BACKOFF_MAX, BACKOFF_FIRST * 2 ** max(0, attempts - 1))


def converged(plan: Plan, fleet: Fleet) -> bool:
    """True when nothing is left to do: no action but KEEP, nothing unplaced, every assigned shard READY on a
    live node, and no shard of ours running that the plan does not assign."""
    if plan.changes or plan.unplaced:
        return False
    wanted = {a.shard_id or f"{a.replica_id}/0" for a in plan.assignments}
    running: dict[str, ShardState] = {}
    for node in fleet.nodes:
        if not node.alive:
            continue
        for shard in node.shards:
            if shard.adopted_foreign or shard.state is ShardState.STOPPED:
                continue
            running[shard.shard_id] = shard.state
    return set(running) == wanted and all(state is ShardState.READY for state in running.values())


def _observed_done(action: Action, fleet: Fleet) -> bool:
    node = fleet.node(action.node_id)
    if node is None:
        return False
    if action.kind is ActionKind.INSTALL:
        return action.engine in node.engines_installed or action.engine in node.engines_installing
    shard_id = shard_id_of(action)
    shard = next((s for s in node.shards if s.shard_id == shard_id), None)
    if action.kind is ActionKind.STOP:
        return shard is None or shard.state is ShardState.STOPPED
    return shard is not None and shard.state in _LIVE


class Reconciler:
    """Runs passes; owns the commands in flight and the failure/backoff table.

    `settings()` returns the settings in force (None: no pass), `fleet()` the observed fleet, `execute(action,
    settings)` sends one action's command and waits for the agent's answer (raising LlmgwError on failure),
    `on_pass(record, plan, fleet)` is called after every pass (audit, routing, status). `may_act()` returns
    None when this control plane may send commands, else a sentence why not (another one holds the lease):
    such a pass plans and reports, and sends nothing.
    """

    def __init__(
        self,
        settings: Callable[[], Settings | None],
        fleet: Callable[[], Fleet],
        execute: Callable,
        on_pass: Callable[[PassRecord, Plan, Fleet], None] = lambda r, p, f: None,
        *,
        concurrency: int = 8,
        settle_after: float = 15.0,
        allow_empty: Callable[[], bool] = lambda: False,
        may_act: Callable[[], str | None] = lambda: None,
    ):
        self._settings = settings
        self._fleet = fleet
        self._execute = execute
        self._on_pass = on_pass
        self._allow_empty = allow_empty
        self._may_act = may_act
        self._limiter = trio.CapacityLimiter(concurrency)
        self.settle_after = settle_after
        self.in_flight: dict[tuple, _InFlight] = {}
        self.failures: dict[tuple, Failure] = {}
        self.restarts: dict[tuple, Failure] = {}
        self.last_pass: PassRecord | None = None
        self.last_plan: Plan | None = None
        self.passes = 0
        self._wake = trio.Event()
        self._triggers: list[str] = []
        self._pass_done = trio.Event()
        self._nursery: trio.Nursery | None = None
        self.pass_lock = trio.Lock()

    def kick(self, reason: str) -> None:
        """Bring the next pass forward (`reason` is recorded as its trigger)."""
        self._triggers.append(reason)
        self._wake.set()

    async def wait_pass(self) -> PassRecord:
        """Wait for the next pass to finish and return its record. A checkpoint."""
        await self._pass_done.wait()
        assert self.last_pass is not None
        return self.last_pass

    async def run(self, interval: Callable[[], float], *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Run passes forever: when kicked, else every `interval()` seconds."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            while True:
                with trio.move_on_after(interval()):
                    await self._wake.wait()
                self._wake = trio.Event()
                trigger = ", ".join(dict.fromkeys(self._triggers)) or "timer"
                self._triggers.clear()
                await self.run_pass(trigger)

    async def run_pass(self, trigger: str) -> PassRecord | None:
        """One pass. Returns its record, or None when no settings are in force yet."""
        settings = self._settings()
        if settings is None:
            return None
        async with self.pass_lock:
            started_unix, started = time.time(), trio.current_time()
            fleet = self._fleet()
            try:
                plan = make_plan(settings, fleet, allow_empty=self._allow_empty())
            except EmptiedCatalogError as exc:
                plan = Plan(settings_commit=settings.commit, notes=(str(exc),))
                records, done = [], False
            else:
                refusal = self._may_act()
                if refusal is None:
                    records = self._act(plan, settings, fleet, started)
                else:
                    records = [
                        ActionRecord(kind=a.kind.value, node_id=a.node_id, subject=action_key(a)[2], model=a.model,
                                     reason=a.reason, outcome="skipped", error=refusal)
                        for a in plan.actions if a.kind is not ActionKind.KEEP
                    ]
                done = converged(plan, fleet) and not self.in_flight
            self.passes += 1
            record = PassRecord(
                number=self.passes,
                trigger=trigger,
                settings_commit=settings.commit,
                started_at=started_unix,
                duration=trio.current_time() - started,
                actions=tuple(records),
                unplaced=plan.unplaced,
                converged=done,
                notes=plan.notes,
            )
            self.last_pass, self.last_plan = record, plan
            self._on_pass(record, plan, fleet)
            event, self._pass_done = self._pass_done, trio.Event()
            event.set()
            return record

    def _act(self, plan: Plan, settings: Settings, fleet: Fleet, now: float) -> list[ActionRecord]:
        # forget what is done, what timed out waiting to be seen, and failures of actions no longer planned
        planned = {action_key(a) for a in plan.actions if a.kind is not ActionKind.KEEP}
        for key, flight in list(self.in_flight.items()):
            if flight.answered_at is not None and (
                _observed_done(flight.action, fleet) or now - flight.answered_at > self.settle_after
            ):
                del self.in_flight[key]
        for key in list(self.failures):
            if key not in planned:
                del self.failures[key]
        ready = {
            (node.node_id, shard.shard_id)
            for node in fleet.nodes for shard in node.shards if shard.state is ShardState.READY
        }
        for key in list(self.restarts):
            if (key[1], key[2]) in ready:
                del self.restarts[key]
        records = []
        for action in plan.actions:
            if action.kind is ActionKind.KEEP:
                continue
            key = action_key(action)
            base = dict(
                kind=action.kind.value, node_id=action.node_id, subject=key[2], model=action.model,
                reason=action.reason, previous_node=action.previous_node,
            )
            node = fleet.node(action.node_id)
            if node is None or not node.alive:
                records.append(ActionRecord(**base, outcome="skipped", error=f"node {action.node_id} is lost"))
                continue
            if key in self.in_flight:
                records.append(ActionRecord(**base, outcome="in flight"))
                continue
            failure = self.failures.get(key)
            if failure is not None and failure.retry_at > now:
                records.append(ActionRecord(
                    **base, outcome="backing off", error=failure.error, retry_at=failure.retry_at_unix,
                ))
                continue
            if action.kind is ActionKind.RESTART:
                restart = self.restarts.get(key)
                if restart is not None and restart.retry_at > now:
                    records.append(ActionRecord(
                        **base, outcome="backing off", error=f"restart {restart.attempts + 1} waits: {restart.error}",
                        retry_at=restart.retry_at_unix,
                    ))
                    continue
                attempts = (restart.attempts if restart else 0) + 1
                self.restarts[key] = Failure(
                    attempts=attempts, error=action.reason or "the shard failed", retry_at=now + backoff(attempts),
                    retry_at_unix=time.time() + backoff(attempts), kind=key[0], node_id=key[1], subject=key[2],
                )
                self._nursery.start_soon(self._kick_later, backoff(attempts), f"restart backoff of {key[2]} over")
            self.in_flight[key] = _InFlight(action, now)
            assert self._nursery is not None, "Reconciler.run must be running"
            self._nursery.start_soon(self._run_action, key, action, settings)
            records.append(ActionRecord(**base, outcome="sent"))
        return records

    async def _kick_later(self, delay: float, reason: str) -> None:
        await trio.sleep(delay)
        self.kick(reason)

    async def _run_action(self, key: tuple, action: Action, settings: Settings) -> None:
        async with self._limiter:
            try:
                await self._execute(action, settings)
            except LlmgwError as exc:
                previous = self.failures.get(key)
                attempts = (previous.attempts if previous else 0) + 1
                delay = backoff(attempts)
                self.failures[key] = Failure(
                    attempts=attempts, error=str(exc), retry_at=trio.current_time() + delay,
                    retry_at_unix=time.time() + delay, kind=key[0], node_id=key[1], subject=key[2],
                )
                self.in_flight.pop(key, None)
                self.kick(f"{action.kind.value} {key[2]} on {action.node_id} failed")
                assert self._nursery is not None
                self._nursery.start_soon(self._kick_later, delay, f"retry of {key[0]} {key[2]}")
                return
        flight = self.in_flight.get(key)
        if flight is not None:
            flight.answered_at = trio.current_time()
        self.failures.pop(key, None)
