"""`ControlLoop`: the one place where the control plane's state changes.

    loop = ControlLoop(ControlState(), handlers, interval=lambda: 10.0)   # handlers: llmgw.control.handling
    await nursery.start(loop.run)
    loop.update(lambda s: (replace(s, leadership=...), True), "became leader")   # from any task, never blocks

Every event (a settings commit, an agent message, a lease renewal, an action's outcome, a timer, an admin or CLI
request) is a pure transition `ControlState -> (ControlState, placement_relevant)` sent through one unbounded
trigger channel; a transition may also return effects, `(state, placement_relevant, effects)`. The loop task
folds every transition waiting, then runs the effects of the batch (`llmgw.control.events.change_effects`: the
routing table is published when a change was placement-relevant), and runs a reconcile pass
(`llmgw.control.deciding.decide`) when a transition asked for one, when a backoff timer or a node's expiry is due,
or every `interval()` seconds. Every effect (`llmgw.control.effects`) goes to its handler in the registry
(`llmgw.control.handling`), in the loop's nursery: commands at most `concurrency` at a time, their outcomes back as
transitions; the other effects one after the other per lane, in the order they were emitted. Nothing calls back
into the control plane: readers take `loop.state`, an immutable value.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import trio

from llmgw.control.deciding import (
    COMMAND_TYPES, action_answered, action_failed, action_key, decide, needs_planning, plan_stage, timed,
)
from llmgw.control.events import change_effects
from llmgw.control.effects import Command, ConfigureAgent, Effect
from llmgw.control.handling import Handlers
from llmgw.control.state import ControlState, PassRecord
from llmgw.errors import LlmgwError, TemporaryError

FOLD_CHUNK = 64
"""Transitions folded together (their effects run as one batch) while a backlog is drained."""

FOLD_SLICE = 0.05
"""Wall seconds of folding a backlog after which the loop lets other tasks run before it folds the rest: 2,000
agents joining at once left thousands of heartbeats waiting, and folding them in one task step held the trio loop
for 1-5 s (docs/scale.md), delaying every timer and the gRPC thread's hand-offs."""

PLAN_ASIDE_AFTER = 0.02
"""Wall seconds a plan from scratch last took, above which the next one runs in a worker thread while the loop keeps
folding events (`ControlLoop.plan_cost`). At 2,000 nodes a plan took 0.5-2.4 s of this loaded machine's wall time,
all in one task step: every heartbeat waited behind it (docs/scale.md). Cheaper plans (small fleets, every test's)
stay on the loop, where they cost less than the thread hand-off."""

Transition = Callable[[ControlState], "tuple[ControlState, bool] | tuple[ControlState, bool, tuple[Effect, ...]]"]
"""A pure event: the next state, whether the change is placement-relevant (wakes a pass), and optionally the
effects it asks for."""


class ControlLoop:
    """Owns `state` (a `ControlState`) and the only task that replaces it.

    `handlers` (`llmgw.control.handling.Handlers`, None: none yet, `register` them before `run`): a command's
    handler sends it and waits for its node's answer (raising LlmgwError; a TemporaryError's `delay` is honoured);
    a command without a handler counts as answered. A pass's commands are sent concurrently, but for a node that
    also gets a ConfigureAgent (new agent settings) in the pass: its other commands wait until that one is answered.
    A command is not sent once this control plane lost the leader lease after the pass that chose it (it fails with
    a TemporaryError). `tracing` (a `llmgw.control.tracing.StartTracing`, None: off) sees each change and each pass.
    `interval()` is the seconds between passes when nothing wakes one.
    """

    def __init__(
        self,
        state: ControlState,
        handlers: Handlers | None = None,
        *,
        interval: Callable[[], float] = lambda: 10.0,
        tracing: Any = None,
        concurrency: int = 8,
        settle_after: float = 15.0,
        coalesce: float = 0.0,
        plan: Callable[[ControlState], tuple] = plan_stage,
    ):
        self.state = state
        self.handlers = handlers if handlers is not None else Handlers()
        self.tracing = tracing
        self._interval = interval
        self._limiter = trio.CapacityLimiter(concurrency)
        self.settle_after = settle_after
        self.coalesce = coalesce
        """Seconds between the end of a pass and the next: events arriving meanwhile are folded into one batch and
        one pass (a burst of answers during a roll-out costs one pass per `coalesce`, not one per answer). When
        above 0, the gap is at least what the last pass cost too (`pass_cost`: decide and the effects' dispatch,
        seconds of wall time), so passes take at most half the loop's time and heartbeats are
        folded between them however large the fleet (bench/fleet_scale.py: 1,000 agents joining at once)."""
        self.unix_clock: Callable[[], float] = time.time
        """The unix time each pass records and its rules read (`now_unix`); a test on trio's MockClock sets one
        that follows the virtual clock."""
        self.pass_cost = 0.0
        """Wall seconds the last pass took, dispatch included (and its plan, when made aside)."""
        self._plan = plan
        self.plan_cost = 0.0
        """Wall seconds the last plan from scratch took (on the loop or in its thread); above `PLAN_ASIDE_AFTER` the
        next one is made in a worker thread (`plan`: `llmgw.control.deciding.plan_stage`, pure) while the loop keeps
        folding events, and the pass then acts on the state as it is when the plan is ready."""
        self.planned_aside = 0
        """How many plans were made in the worker thread."""
        self._last_pass_end = -math.inf
        self._send, self._receive = trio.open_memory_channel[tuple[Transition | None, str | None, float | None]](
            math.inf)
        self.folded = 0
        """How many transitions the loop folded since it started."""
        self.fold_latencies: deque[float] = deque(maxlen=4096)
        """Seconds from an event's origin (`update(..., origin_unix=)`, e.g. a heartbeat's send time at the agent)
        to the loop folding it, for the latest 4,096 such events."""
        self._pass_done = trio.Event()
        self._nursery: trio.Nursery | None = None
        self._queued = self._taken = 0  # events sent to the channel, and taken from it
        self._barriers: list[tuple[int, trio.Event]] = []
        self._lanes: dict[str, trio.MemorySendChannel] = {}
        self._dispatched = self._handled = 0  # effects queued to lanes, and handled
        self._handled_barriers: list[tuple[int, trio.Event]] = []

    # -- events -------------------------------------------------------------------------------------------

    def update(self, transition: Transition | None, reason: str | None = None, origin_unix: float | None = None,
               ) -> None:
        """Queue `transition` (None: none) for the loop; `reason` names the event. A pass follows when the
        transition says its change is placement-relevant, or when `transition` is None and `reason` is given
        (a kick). `origin_unix`: when the event began (unix seconds, e.g. a heartbeat's `time` at the agent);
        given, the seconds from then to the fold are kept in `fold_latencies`. Never blocks; safe from any task
        of the loop's trio run."""
        self._send.send_nowait((transition, reason, origin_unix))
        self._queued += 1

    async def folded_all(self) -> None:
        """Wait until every event queued before this call is folded into `state`. A checkpoint."""
        if self._taken >= self._queued:
            await trio.lowlevel.checkpoint()
            return
        done = trio.Event()
        self._barriers.append((self._queued, done))
        await done.wait()

    def kick(self, reason: str) -> None:
        """Bring the next pass forward (`reason` is recorded as its trigger)."""
        self.update(None, reason)

    async def effects_handled(self) -> None:
        """Wait until every effect dispatched before this call (to any lane) has been handled: a pass's effects, its
        audit commit queued among them, are handled after `wait_pass` returns. A checkpoint."""
        if self._handled >= self._dispatched:
            await trio.lowlevel.checkpoint()
            return
        done = trio.Event()
        self._handled_barriers.append((self._dispatched, done))
        await done.wait()

    async def wait_pass(self) -> PassRecord:
        """Wait for the next pass to finish and return its record. A checkpoint."""
        await self._pass_done.wait()
        assert self.state.last_pass is not None
        return self.state.last_pass

    # -- the loop -----------------------------------------------------------------------------------------

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Fold events and run passes until cancelled. The events queued before it runs (the control plane's initial
        recovery, the first settings) are folded before `task_status.started()`."""
        async with trio.open_nursery() as nursery:
            self._nursery, self._lanes = nursery, {}
            waiting: list[str] = []
            self._fold(self._drain(math.inf), waiting)
            task_status.started()
            next_pass = trio.current_time() + self._interval()
            while True:
                triggers, waiting = waiting, []
                deadline = min(next_pass, self._next_due()) if not triggers else trio.current_time()
                with trio.move_on_at(deadline):
                    item = await self._receive.receive()
                    self._fold([item], triggers)
                await self._fold_waiting(triggers)
                now = trio.current_time()
                expired = self._expire(now)
                if expired:
                    triggers.append(expired)
                if not triggers and now < deadline:
                    continue
                if not triggers:
                    triggers = [self._due_reason(now)]
                gap = max(self.coalesce, self.pass_cost) if self.coalesce > 0 else 0.0
                if now < self._last_pass_end + gap:
                    await trio.sleep_until(self._last_pass_end + gap)
                    await self._fold_waiting(triggers)
                planned, seconds = await self._plan_aside(triggers)
                self.run_pass(", ".join(dict.fromkeys(triggers)), planned, seconds)
                self._last_pass_end = trio.current_time()
                next_pass = trio.current_time() + self._interval()

    async def _fold_waiting(self, triggers: list[str]) -> None:
        """Fold every transition waiting, `FOLD_CHUNK` at a time, with a checkpoint after each `FOLD_SLICE` seconds
        of folding (none when the backlog took less)."""
        began = time.perf_counter()
        while batch := self._drain(FOLD_CHUNK):
            self._fold(batch, triggers)
            if len(batch) < FOLD_CHUNK:
                return
            if time.perf_counter() - began >= FOLD_SLICE:
                await trio.sleep(0)
                began = time.perf_counter()

    async def _plan_aside(self, triggers: list[str]) -> tuple[tuple | None, float]:
        """When the coming pass must plan from scratch and the last plan cost more than `PLAN_ASIDE_AFTER`: make the
        plan of the state now in a worker thread, folding events meanwhile (their triggers join `triggers`); return
        (plan_stage's result, its wall seconds). Else (None, 0.0): the pass plans on the loop, if it must."""
        state = self.state
        if self.plan_cost < PLAN_ASIDE_AFTER or not needs_planning(state):
            return None, 0.0
        result: list = []
        began = time.perf_counter()
        async with trio.open_nursery() as nursery:
            async def plan() -> None:
                result.append(await trio.to_thread.run_sync(self._plan, state))
                nursery.cancel_scope.cancel()

            nursery.start_soon(plan)
            while True:
                self._fold([await self._receive.receive()], triggers)
                await self._fold_waiting(triggers)
        self.plan_cost = time.perf_counter() - began
        self.planned_aside += 1
        return result[0], self.plan_cost

    def _drain(self, limit: int) -> list:
        batch: list = []
        while len(batch) < limit:
            try:
                batch.append(self._receive.receive_nowait())
            except trio.WouldBlock:
                break
        return batch

    def _next_due(self) -> float:
        times = [self.state.next_timer(), self.state.fleet.next_expiry()]
        return min((t for t in times if t is not None), default=math.inf)

    def _due_reason(self, now: float) -> str:
        due = [reason for at, reason in self.state.timers if at <= now]
        return ", ".join(dict.fromkeys(due)) or "timer"

    def _fold(self, items: list, triggers: list[str]) -> None:
        if not items:
            return
        self._taken += len(items)
        if self._barriers:
            for barrier in [b for b in self._barriers if b[0] <= self._taken]:
                self._barriers.remove(barrier)
                barrier[1].set()
        old = state = self.state
        reasons: list[str] = []
        effects: list[Effect] = []
        folded_unix = None
        for transition, reason, origin_unix in items:
            if origin_unix is not None:
                folded_unix = folded_unix or time.time()
                self.fold_latencies.append(folded_unix - origin_unix)
            if transition is None:
                if reason:
                    triggers.append(reason)
                continue
            result = transition(state)
            state, relevant = result[0], result[1]
            if len(result) > 2:
                effects.extend(result[2])
            self.folded += 1
            if relevant and reason:
                reasons.append(reason)
        self.state = state
        triggers.extend(reasons)
        if state is not old:
            self._changed(old, state, reasons, effects)
        elif effects:
            self._dispatch(effects)

    def _expire(self, now: float) -> str | None:
        fleet, lost = self.state.fleet.expire(now)
        if not lost:
            return None
        old = self.state
        self.state = old.with_fleet(fleet)
        reason = f"node {', '.join(lost)} lost"
        self._changed(old, self.state, [reason])
        return reason

    def _changed(self, old: ControlState, new: ControlState, reasons: list[str], effects: list[Effect] = ()) -> None:
        """After a batch of events or a pass changed `old` into `new`: run the batch's `effects` and the change's."""
        if self.tracing is not None:
            self.tracing.on_change(old, new)
        self._dispatch([*effects, *change_effects(old, new, reasons)])

    def _dispatch(self, effects: list[Effect]) -> None:
        """Queue `effects` (none a command) to their lanes (`llmgw.control.handling`), each lane's handled one
        after the other by a task of the loop's nursery; an effect without a handler is dropped."""
        for effect in effects:
            handler = self.handlers.get(effect)
            if handler is None:
                continue
            lane = self.handlers.lane(effect)
            send = self._lanes.get(lane)
            if send is None:
                assert self._nursery is not None, "ControlLoop.run must be running"
                send, receive = trio.open_memory_channel[tuple](math.inf)
                self._lanes[lane] = send
                self._nursery.start_soon(self._in_order, receive)
            send.send_nowait((effect, handler))
            self._dispatched += 1

    async def _in_order(self, lane: trio.MemoryReceiveChannel) -> None:
        """Await each (effect, handler) of `lane` in turn, forever; count each handled (`effects_handled`)."""
        async for effect, handler in lane:
            try:
                await handler(effect)
            finally:
                self._handled += 1
                for barrier in [b for b in self._handled_barriers if b[0] <= self._handled]:
                    self._handled_barriers.remove(barrier)
                    barrier[1].set()

    def run_pass(self, trigger: str, planned: tuple | None = None, planned_seconds: float = 0.0) -> PassRecord | None:
        """Run one pass now (not a checkpoint): decide, record the next state, start sending its actions.
        `planned`: a plan made aside (`_plan_aside`) in `planned_seconds`, counted in the pass's duration.
        Returns its record, or None when no settings are in force yet."""
        started = trio.current_time()
        old = self.state
        took = time.perf_counter()
        try:
            return self._pass(started, old, took, trigger, planned, planned_seconds)
        finally:
            self.pass_cost = time.perf_counter() - took + planned_seconds

    def _pass(self, started: float, old: ControlState, took: float, trigger: str, planned: tuple | None,
              planned_seconds: float) -> PassRecord | None:
        decision, state = decide(old, started, now_unix=self.unix_clock(), trigger=trigger, settle_after=self.settle_after,
                                 planned=planned)
        if decision is None:
            return None
        duration = time.perf_counter() - took + planned_seconds  # CPU-bound: the wall time of decide (and plan)
        if planned is None and decision.plan is not old.last_plan:  # planned from scratch on the loop
            self.plan_cost = duration
        decision, state = timed(decision, state, duration)
        self.state = state
        commands = decision.commands
        configured = {c.node_id: trio.Event() for c in commands if isinstance(c, ConfigureAgent)}
        for command in commands:
            assert self._nursery is not None, "ControlLoop.run must be running"
            first = configured.get(command.node_id)
            if isinstance(command, ConfigureAgent):
                self._nursery.start_soon(self._run_command, command, None, first)
            else:  # a node's new agent settings (directories, mirrors, tracing) reach it before its other commands
                self._nursery.start_soon(self._run_command, command, first, None)
        if self.tracing is not None:
            self.tracing.after_pass(decision, state)
        self._changed(old, state, [], [e for e in decision.effects if not isinstance(e, COMMAND_TYPES)])
        event, self._pass_done = self._pass_done, trio.Event()
        event.set()
        return decision.record

    async def _run_command(self, command: Command, after: trio.Event | None = None,
                           done: trio.Event | None = None) -> None:
        """Send `command` (once `after` is set, when given: its node's ConfigureAgent of the same pass was answered
        or failed) and record its outcome; set `done` at the end, whatever happened."""
        try:
            if after is not None:
                await after.wait()
            await self._send_command(command)
        finally:
            if done is not None:
                done.set()

    async def _send_command(self, command: Command) -> None:
        action = command.action
        key = action_key(action)
        async with self._limiter:
            try:
                if not self.state.leadership.leader:  # the lease ended after the pass that chose this command
                    raise TemporaryError(f"this control plane no longer holds the leader lease; {action.kind.value} "
                                         f"on {action.node_id} is left to the leader.")
                handler = self.handlers.get(command)
                if handler is not None:
                    await handler(command)
            except LlmgwError as exc:
                delay = exc.delay if isinstance(exc, TemporaryError) else None
                now, error = trio.current_time(), str(exc)
                self.update(lambda s: (_counted(action_failed(s, key, error, now, delay=delay, now_unix=time.time()),
                                                action.kind.value, "failed"), True),
                            f"{action.kind.value} {key[2]} on {action.node_id} failed")
                return
        now = trio.current_time()
        self.update(lambda s: (_counted(action_answered(s, key, now), action.kind.value, "succeeded"), True),
                    f"{action.kind.value} {key[2]} answered")


def _counted(state: ControlState, kind: str, outcome: str) -> ControlState:
    """`state` with one more answered action of `kind` in its tallies."""
    return replace(state, tallies=state.tallies.counted_outcome(kind, outcome))
