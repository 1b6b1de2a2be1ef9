"""A canary through the control loop with the real planner, on trio's MockClock: the canary replica alone is started
beside the old replicas; it is measured when its window has passed since it was ready (not before, not from the
push); a miss stops it, keeps the old replicas, proposes the revert and keeps the applied ref; a hold rolls the rest.
The measurement and revert handlers stand in for the store and git (their real ones: test_canary_rollout.py)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import trio
import trio.testing

from llmgw.control import ControlLoop
from llmgw.control.canaries import canary_measured
from llmgw.control.effects import MeasureCanary, ProposeRevert, SetApplied
from llmgw.control.events import settings_published
from llmgw.control.handling import Handlers, every_command
from llmgw.control.state import WatchState
from llmgw.plan import fingerprint
from llmgw.plan.canary import CanarySample
from llmgw.plan.types import ActionKind, NodeState, ObservedShard, ShardState
from llmgw.settings import load_directory
from llmgw.settings.model import Rollout

from .conftest import write_seed
from .loop_world import control_state, report, shard

WINDOW = 600.0


@pytest.fixture
def autojump_clock():
    return trio.testing.MockClock(autojump_threshold=0)


@pytest.fixture
def before(tmp_path: Path):
    settings = load_directory(write_seed(tmp_path / "seed", "ab" * 32, replicas=2))
    return replace(settings, commit="a" * 40)


def slower(settings):
    """`settings` with tiny's engine started otherwise (a change that restarts replicas) under a canary rollout."""
    rollout = Rollout("canary", share=0.25, window=WINDOW, min_requests=3, max_error_rate=0.05, max_ttft_p90=2.0)
    model = replace(settings.models["tiny"], engine_args=("--fake-first-token-delay", "3"), rollout=rollout)
    return replace(settings, commit="b" * 40, models={"tiny": model})


def fp(settings) -> str:
    return fingerprint(settings.models["tiny"], "b11434")


class Canaried:
    """A loop over node n1 whose agent is simulated: a START makes its shard READY, a STOP removes it, and a
    heartbeat reports the shards every second (MockClock; nodes are lost after 3 s). Canary measurements answer `samples` (recording when they
    were asked, trio time); revert proposals and applied-ref moves are recorded."""

    def __init__(self, before, samples):
        self.sent: list[tuple[str, str, float]] = []
        self.measured: list[float] = []
        self.reverts: list[ProposeRevert] = []
        self.applied: list[str] = []
        self.samples = samples
        self.shards = {s.shard_id: s for s in (shard("tiny-0", fp(before)), shard("tiny-1", fp(before)))}
        handlers = Handlers(every_command(self.execute))
        handlers.register(MeasureCanary, self.measure)
        handlers.register(ProposeRevert, self.propose)
        handlers.register(SetApplied, self.set_applied)
        state = control_state(before, node(*self.shards.values()))
        self.loop = ControlLoop(replace(state, watch=WatchState(settings=before)), handlers, interval=lambda: 1000.0)

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(self.loop.run)
            nursery.start_soon(self.beat)
            task_status.started()

    async def beat(self) -> None:
        while True:
            self.loop.update(report("n1", *self.shards.values()), "heartbeat")
            await trio.sleep(1)

    async def execute(self, command) -> None:
        action = command.action
        self.sent.append((action.kind.value, action.shard_id, trio.current_time()))
        if action.kind is ActionKind.START:
            self.shards[action.shard_id] = ObservedShard(action.shard_id, action.replica_id, action.model,
                                                         ShardState.READY, port=9000 + len(self.sent),
                                                         fingerprint=action.assignment.fingerprint)
        elif action.kind is ActionKind.STOP:
            self.shards.pop(action.shard_id, None)

    async def measure(self, effect: MeasureCanary) -> None:
        self.measured.append(trio.current_time())
        self.loop.update(canary_measured(effect.model, effect.commit, self.samples, effect.elapsed), "canary")

    async def propose(self, effect: ProposeRevert) -> None:
        self.reverts.append(effect)

    async def set_applied(self, effect: SetApplied) -> None:
        self.applied.append(effect.commit)

    def kinds(self) -> list[tuple[str, str]]:
        return [(kind, subject) for kind, subject, _ in self.sent]


def node(*shards: ObservedShard) -> NodeState:
    return NodeState("n1", cpu_cores=4, memory_bytes=8 << 30, shards=shards,
                     engines_installed=frozenset({"llama.cpp@b11434"}))


async def until(check, step: float = 1.0, limit: float = 3 * WINDOW) -> None:
    """Wait (MockClock seconds, `step` apart) until `check()`; fail after `limit` seconds."""
    with trio.fail_after(limit):
        while not check():
            await trio.sleep(step)


async def start_canary(world: Canaried, after) -> tuple[str, float]:
    """Publish `after` over the old replicas; the canary's START goes out, alone, and its shard is ready with the
    old replicas still serving. Returns (the canary shard id, when the control plane saw it ready)."""
    loop = world.loop
    loop.update(settings_published(WatchState(settings=after), None), "settings")
    await until(lambda: loop.state.canaries.get("tiny") and loop.state.canaries["tiny"].ready_at is not None)
    assert [k for k in world.kinds()] == [("start", world.sent[0][1])] and world.sent[0][1].startswith("tiny-0/0@")
    await loop.wait_pass()
    plan = loop.state.last_plan
    assert not [a for a in plan.actions if a.kind is ActionKind.STOP], plan.actions  # the old replicas serve on
    assert [u.replica_id for u in plan.unplaced] == ["tiny-1"] and "canary: waits" in str(plan.unplaced[0]), plan
    return world.sent[0][1], loop.state.canaries["tiny"].ready_at


async def test_a_canary_that_misses_its_ttft_slo_after_its_window_is_stopped_and_a_revert_proposed(
    before, autojump_clock,
):
    slow = [CanarySample(200, 3.1, 3.2)] * 5 + [CanarySample(200, 0.1, 0.2)] * 2
    world = Canaried(before, slow)
    async with trio.open_nursery() as nursery:
        await nursery.start(world.run)
        canary_shard, ready_at = await start_canary(world, slower(before))
        await until(lambda: world.measured)
        assert world.measured[0] - ready_at == pytest.approx(WINDOW, abs=1.0)  # one window after it was ready
        await until(lambda: world.reverts)
        assert world.reverts[0].branch == f"llmgw/revert-{'b' * 12}"
        assert "TTFT p90 3.10 s above the SLO's 2.00 s over 7 requests" in world.reverts[0].reason
        await until(lambda: loop_converged(world))
        assert world.kinds() == [("start", canary_shard), ("stop", canary_shard)]  # the old replicas untouched
        canary = world.loop.state.canaries["tiny"]
        assert canary.phase == "failed" and canary.requests == 7
        assert world.applied == []  # converged on the old revision: commit b is not applied
        nursery.cancel_scope.cancel()


def loop_converged(world: Canaried) -> bool:
    record = world.loop.state.last_pass
    return record is not None and record.converged


async def test_a_canary_that_holds_rolls_the_rest_out(before, autojump_clock):
    fine = [CanarySample(200, 0.3, 0.5)] * 9 + [CanarySample(404, None, 0.01)]  # a client's error is no miss
    world = Canaried(before, fine)
    async with trio.open_nursery() as nursery:
        await nursery.start(world.run)
        canary_shard, ready_at = await start_canary(world, slower(before))
        await until(lambda: world.applied)
        assert world.applied == ["b" * 40] and world.reverts == []
        assert world.loop.state.canaries["tiny"].phase == "held"
        assert "within the SLO" in world.loop.state.canaries["tiny"].reason
        kinds = world.kinds()
        new_one = f"tiny-1/0@{canary_shard.split('@')[1]}"
        assert kinds[0] == ("start", canary_shard) and sorted(kinds[1:]) == [
            ("start", new_one), ("stop", "tiny-0/0"), ("stop", "tiny-1/0")], kinds
        assert kinds.index(("start", new_one)) < kinds.index(("stop", "tiny-1/0"))  # replaced before it stops
        assert world.sent[1][2] - ready_at == pytest.approx(WINDOW, abs=1.0)  # the rest waited for the verdict
        nursery.cancel_scope.cancel()


async def test_too_little_traffic_waits_a_second_window_then_misses(before, autojump_clock):
    world = Canaried(before, [CanarySample(200, 0.1, 0.2)])
    async with trio.open_nursery() as nursery:
        await nursery.start(world.run)
        _canary_shard, ready_at = await start_canary(world, slower(before))
        await until(lambda: world.reverts)
        assert "too little traffic to judge: 1 requests" in world.reverts[0].reason
        assert world.measured[-1] - ready_at == pytest.approx(2 * WINDOW, abs=WINDOW / 10 + 1)
        assert len(world.measured) == 11  # at the window's end, then a tenth of a window apart
        nursery.cancel_scope.cancel()
