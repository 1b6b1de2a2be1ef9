"""Reconcile passes with the real planner: actions sent once while in flight, retried with backoff when they
fail, the empty-catalog guard, and what counts as converged. Time runs on trio's MockClock."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import trio
import trio.testing

from llmgw.control.reconciling import Reconciler, backoff, converged
from llmgw.errors import TemporaryError
from llmgw.plan import fingerprint
from llmgw.plan.types import Assignment, Fleet, NodeState, ObservedShard, Plan, ShardState
from llmgw.settings import load_directory

from .conftest import write_seed


@pytest.fixture
def settings(tmp_path: Path):
    loaded = load_directory(write_seed(tmp_path / "seed", "ab" * 32, replicas=2))
    SEED_FINGERPRINT[:] = [fingerprint(loaded.models["tiny"], "b11434")]
    return loaded


def node(*shards: ObservedShard, alive: bool = True) -> NodeState:
    return NodeState("n1", cpu_cores=4, memory_bytes=8 << 30, alive=alive, shards=shards,
                     engines_installed=frozenset({"llama.cpp@b11434"}))


SEED_FINGERPRINT: list[str] = []


def ready(replica: str, state: ShardState = ShardState.READY) -> ObservedShard:
    """A shard of the seed's model as its agent reports it (running what the settings ask for)."""
    fp = SEED_FINGERPRINT[0] if SEED_FINGERPRINT else ""
    return ObservedShard(f"{replica}/0", replica, "tiny", state, port=9000, fingerprint=fp)


class World:
    """The fleet the reconciler sees and the commands it sent; `fail` makes the next commands raise."""

    def __init__(self, settings, fleet: Fleet):
        self.settings, self.fleet = settings, fleet
        self.sent: list[tuple[str, str, float]] = []
        self.fail = False

    async def execute(self, action, settings) -> None:
        self.sent.append((action.kind.value, action.replica_id, trio.current_time()))
        if self.fail:
            raise TemporaryError("node n1 is not connected.")

    def reconciler(self, **kwargs) -> Reconciler:
        return Reconciler(lambda: self.settings, lambda: self.fleet, self.execute, **kwargs)


async def test_an_action_is_sent_once_while_in_flight_and_cleared_when_the_fleet_shows_it(settings):
    world = World(settings, Fleet((node(),)))
    reconciler = world.reconciler()
    async with trio.open_nursery() as nursery:
        await nursery.start(reconciler.run, lambda: 1000.0)
        first = await reconciler.run_pass("test")
        assert [(a.kind, a.subject, a.outcome) for a in first.actions] == [
            ("start", "tiny-0/0", "sent"), ("start", "tiny-1/0", "sent")]
        await trio.sleep(0.1)
        second = await reconciler.run_pass("test")
        assert {a.outcome for a in second.actions} == {"in flight"}
        assert len(world.sent) == 2
        world.fleet = Fleet((node(ready("tiny-0"), ready("tiny-1")),))
        third = await reconciler.run_pass("test")
        assert third.actions == () and third.converged and reconciler.in_flight == {}
        nursery.cancel_scope.cancel()


async def test_a_failed_action_is_retried_with_growing_backoff_and_reported(settings, autojump_clock):
    world = World(replace(settings, models={"tiny": replace(settings.models["tiny"], replicas=1)}),
                  Fleet((node(),)))
    world.fail = True
    reconciler = world.reconciler()
    async with trio.open_nursery() as nursery:
        await nursery.start(reconciler.run, lambda: 1000.0)
        start = trio.current_time()
        reconciler.kick("test")
        while len(world.sent) < 4:
            await trio.sleep(0.01)
        gaps = [round(b[2] - a[2]) for a, b in zip(world.sent, world.sent[1:])]
        assert gaps == [1, 2, 4]  # each retry waits twice as long
        failure = next(iter(reconciler.failures.values()))
        assert failure.attempts >= 3 and "not connected" in failure.error
        last = await reconciler.wait_pass()
        assert last.actions[0].outcome in ("backing off", "sent", "in flight")
        world.fail = False
        world.fleet = Fleet((node(ready("tiny-0")),))
        await trio.sleep(60)
        assert reconciler.failures == {} and trio.current_time() - start < 120
        nursery.cancel_scope.cancel()


@pytest.fixture
def autojump_clock():
    return trio.testing.MockClock(autojump_threshold=0)


async def test_actions_for_a_lost_node_are_skipped_not_sent(settings):
    world = World(settings, Fleet((node(ready("tiny-0"), ready("tiny-1"), alive=False),)))
    reconciler = world.reconciler()
    async with trio.open_nursery() as nursery:
        await nursery.start(reconciler.run, lambda: 1000.0)
        record = await reconciler.run_pass("test")
        assert all(a.outcome != "sent" for a in record.actions) and world.sent == []
        nursery.cancel_scope.cancel()


async def test_settings_that_empty_the_catalog_stop_nothing_while_shards_run(settings):
    empty = replace(settings, models={})
    world = World(empty, Fleet((node(ready("tiny-0")),)))
    reconciler = world.reconciler()
    async with trio.open_nursery() as nursery:
        await nursery.start(reconciler.run, lambda: 1000.0)
        record = await reconciler.run_pass("test")
        assert record.actions == () and not record.converged and "allow_empty" in record.notes[0]
        allowed = Reconciler(lambda: empty, lambda: world.fleet, world.execute, allow_empty=lambda: True)
        await nursery.start(allowed.run, lambda: 1000.0)
        stopped = await allowed.run_pass("test")
        assert [(a.kind, a.subject, a.outcome) for a in stopped.actions] == [("stop", "tiny-0/0", "sent")]
        nursery.cancel_scope.cancel()


A = Assignment("tiny-0", "tiny", "n1", shard_id="tiny-0/0")


@pytest.mark.parametrize(
    "plan, shards, expected",
    [
        (Plan(assignments=(A,)), (ready("tiny-0"),), True),
        (Plan(assignments=(A,)), (ready("tiny-0", ShardState.STARTING),), False),      # not ready yet
        (Plan(assignments=(A,)), (ready("tiny-0"), ready("tiny-1")), False),          # a shard left to stop
        (Plan(assignments=(A,)), (ready("tiny-0"), ready("tiny-1", ShardState.STOPPED)), True),
        (Plan(), (), True),                                                           # nothing wanted, none running
        (Plan(assignments=(A,)), (), False),
    ],
)
def test_converged_means_every_assigned_shard_ready_and_nothing_else_running(plan, shards, expected):
    assert converged(plan, Fleet((node(*shards),))) is expected


def test_backoff_doubles_from_one_second_up_to_a_minute():
    assert [backoff(n) for n in (1, 2, 3, 4, 7, 8, 20)] == [1, 2, 4, 8, 60, 60, 60]
