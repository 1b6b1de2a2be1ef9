"""The control loop with the real planner: actions sent once while in flight, retried after the error's own delay
or a growing backoff, never sent while not leader or to a node that cannot take them, the empty-catalog guard, and
what counts as converged. Time runs on trio's MockClock."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import trio
import trio.testing

from llmgw.control import backoff, converged
from llmgw.control.deciding import decide
from llmgw.errors import EngineError, TemporaryError
from llmgw.plan import agent_settings_fingerprint, fingerprint
from llmgw.plan.types import Assignment, Fleet, NodeState, ObservedShard, Plan, ShardState
from llmgw.settings import load_directory

from .conftest import write_seed
from .loop_world import World, control_state, report, shard


@pytest.fixture
def settings(tmp_path: Path):
    return load_directory(write_seed(tmp_path / "seed", "ab" * 32, replicas=2))


@pytest.fixture
def one_replica(settings):
    return replace(settings, models={"tiny": replace(settings.models["tiny"], replicas=1)})


@pytest.fixture
def autojump_clock():
    return trio.testing.MockClock(autojump_threshold=0)


def node(*shards: ObservedShard, node_id: str = "n1", engines=("llama.cpp@b11434",)) -> NodeState:
    return NodeState(node_id, cpu_cores=4, memory_bytes=8 << 30, shards=shards, engines_installed=frozenset(engines))


def fp(settings) -> str:
    return fingerprint(settings.models["tiny"], "b11434")


async def test_an_action_is_sent_once_while_in_flight_and_cleared_when_the_fleet_shows_it(settings):
    world = World(control_state(settings, node()))
    loop = world.loop
    async with trio.open_nursery() as nursery:
        await nursery.start(loop.run)
        first = loop.run_pass("test")
        assert [(a.kind, a.subject, a.outcome) for a in first.actions] == [
            ("start", "tiny-0/0", "sent"), ("start", "tiny-1/0", "sent")]
        await trio.sleep(0.1)
        second = loop.run_pass("test")
        assert {a.outcome for a in second.actions} == {"in flight"}
        assert len(world.sent) == 2
        loop.update(report("n1", shard("tiny-0", fp(settings)), shard("tiny-1", fp(settings))), "heartbeat")
        third = await loop.wait_pass()
        assert third.actions == () and third.converged and dict(loop.state.in_flight) == {}
        nursery.cancel_scope.cancel()


async def test_a_failed_action_is_retried_with_growing_backoff_and_reported(one_replica, autojump_clock):
    world = World(control_state(one_replica, node()))
    world.fail = EngineError("node n1 refused to start tiny-0/0: disk full")
    loop = world.loop
    async with trio.open_nursery() as nursery:
        await nursery.start(loop.run)
        start = trio.current_time()
        loop.kick("test")
        while len(world.sent) < 4:
            await trio.sleep(0.01)
        gaps = [round(b[2] - a[2]) for a, b in zip(world.sent, world.sent[1:])]
        assert gaps == [1, 2, 4]  # each retry waits twice as long
        failure = next(iter(loop.state.failures.values()))
        assert failure.attempts >= 3 and "disk full" in failure.error
        world.fail = None
        loop.update(report("n1", shard("tiny-0", fp(one_replica))), "heartbeat")
        await trio.sleep(60)
        assert dict(loop.state.failures) == {} and trio.current_time() - start < 120
        nursery.cancel_scope.cancel()


async def test_a_temporary_error_with_a_7_s_delay_is_retried_after_7_s(one_replica, autojump_clock):
    world = World(control_state(one_replica, node()))
    world.fail = TemporaryError("node n1 is busy installing; try again in 7 s", delay=7.0)
    loop = world.loop
    async with trio.open_nursery() as nursery:
        await nursery.start(loop.run)
        loop.kick("test")
        while len(world.sent) < 3:
            await trio.sleep(0.01)
        gaps = [b[2] - a[2] for a, b in zip(world.sent, world.sent[1:])]
        assert gaps == [pytest.approx(7.0, abs=0.01)] * 2  # the error's delay, not the 1, 2, 4 backoff
        nursery.cancel_scope.cancel()


async def test_nothing_is_sent_while_another_control_plane_leads(one_replica):
    world = World(control_state(one_replica, node(), leader=False))
    async with trio.open_nursery() as nursery:
        await nursery.start(world.loop.run)
        record = world.loop.run_pass("test")
        assert [a.outcome for a in record.actions] == ["skipped"] and "leader lease" in record.actions[0].error
        assert world.sent == []
        nursery.cancel_scope.cancel()


async def test_actions_for_a_lost_node_are_skipped_not_sent(settings):
    lost = node(shard("tiny-0", fp(settings)), shard("tiny-1", fp(settings)))
    world = World(control_state(settings, lost, lost=("n1",)))
    async with trio.open_nursery() as nursery:
        await nursery.start(world.loop.run)
        record = world.loop.run_pass("test")
        assert all(a.outcome != "sent" for a in record.actions) and world.sent == []
        nursery.cancel_scope.cancel()


async def test_settings_that_empty_the_catalog_stop_nothing_while_shards_run(settings):
    empty = replace(settings, models={}, commit="e" * 40)
    world = World(control_state(empty, node(shard("tiny-0", fp(settings)))))
    async with trio.open_nursery() as nursery:
        await nursery.start(world.loop.run)
        record = world.loop.run_pass("test")
        assert record.actions == () and not record.converged and "allow_empty" in record.notes[0]
        world.loop.update(lambda s: (replace(s, allow_empty_commit=empty.commit), True), "allow empty")
        stopped = await world.loop.wait_pass()
        assert [(a.kind, a.subject, a.outcome) for a in stopped.actions] == [("stop", "tiny-0/0", "sent")]
        nursery.cancel_scope.cancel()


def test_a_node_that_has_not_acknowledged_its_agent_settings_is_sent_them_first(one_replica):
    state = control_state(one_replica, node(shard("tiny-0", fp(one_replica))), acked=False)
    decision, after = decide(state, 0.0)
    wanted = agent_settings_fingerprint(one_replica, "n1")
    assert [(a.kind.value, a.fingerprint) for a in decision.send] == [("configure", wanted)]
    assert not decision.record.converged and ("configure", "n1", wanted) in after.in_flight


def test_a_command_an_agent_is_too_old_for_is_refused_at_once_naming_the_node_and_its_version(one_replica):
    bare = node(engines=())  # the engine must be installed first, and this agent cannot install anything
    state = control_state(one_replica, bare, features=("adopt", "logs"))
    decision, _ = decide(state, 0.0)
    (install,) = [a for a in decision.record.actions if a.kind == "install"]
    assert install.outcome == "refused" and decision.send == ()
    assert "node n1 runs llmgw agent 0.1.0" in install.error and "install:llama.cpp" in install.error


A = Assignment("tiny-0", "tiny", "n1", shard_id="tiny-0/0")


def ready(replica: str, state: ShardState = ShardState.READY) -> ObservedShard:
    return ObservedShard(f"{replica}/0", replica, "tiny", state, port=9000)


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


async def test_a_costly_pass_keeps_the_next_one_away_as_long_as_it_took(settings, autojump_clock):
    world = World(control_state(settings, node()))
    loop = world.loop
    loop.coalesce = 0.25
    async with trio.open_nursery() as nursery:
        await nursery.start(loop.run)
        loop.kick("first")
        await loop.wait_pass()
        first_end = trio.current_time()
        loop.pass_cost = 2.0  # as if that pass (decide, routing table, status) took 2 s of the loop's time
        loop.kick("second")
        await loop.wait_pass()
        assert trio.current_time() - first_end >= 2.0, "passes take at most half the loop's time"
        loop.pass_cost = 0.0  # a cheap pass: the coalescing gap alone
        second_end = trio.current_time()
        loop.kick("third")
        await loop.wait_pass()
        assert 0.25 <= trio.current_time() - second_end < 2.0
        nursery.cancel_scope.cancel()


def test_a_node_that_connects_again_loses_its_acknowledgements_and_commands_in_flight_and_only_it(settings):
    from llmgw.control.deciding import node_connected
    from llmgw.control.state import frozen

    base = control_state(settings, node(node_id="n1"), node(node_id="n2"))
    flight = {("start", "n1", "s1"): 1.0, ("start", "n2", "s2"): 2.0, ("stop", "n1", "s3"): 3.0}
    state = replace(base, acked_settings=frozen({"n1": "fp-1", "n2": "fp-2"}), in_flight=frozen(flight))
    after = node_connected(state, "n1")
    assert dict(after.acked_settings) == {"n2": "fp-2"}
    assert dict(after.in_flight) == {("start", "n2", "s2"): 2.0}
    assert replace(after, acked_settings=state.acked_settings, in_flight=state.in_flight) == state


def test_a_timed_pass_records_its_duration_keeps_the_last_passes_counts_it_and_audits_that_state(one_replica):
    from llmgw.control.deciding import timed
    from llmgw.control.effects import WriteAudit
    from llmgw.control.state import RECENT_PASSES

    decision, state = decide(control_state(one_replica, node(shard("tiny-0", fp(one_replica)))), 0.0)
    assert decision.record.converged
    older = tuple(replace(decision.record, duration=float(n)) for n in range(RECENT_PASSES))
    state = replace(state, recent_passes=older)
    timed_decision, after = timed(decision, state, 0.25)
    record = timed_decision.record
    assert record == replace(decision.record, duration=0.25) and after.last_pass == record
    assert after.recent_passes == (*older[1:], record)
    assert after.tallies == state.tallies.counted_pass(True, 0.25, ())
    audits = [e for e in timed_decision.effects if isinstance(e, WriteAudit)]
    assert audits and all(a.record == record and a.state is after for a in audits)
    assert [e for e in timed_decision.effects if not isinstance(e, WriteAudit)] == [
        e for e in decision.effects if not isinstance(e, WriteAudit)]


def test_a_pass_plans_from_scratch_only_with_settings_in_force_and_no_plan_to_reuse(one_replica):
    from llmgw.control.deciding import needs_planning

    state = control_state(one_replica, node(shard("tiny-0", fp(one_replica))))
    assert needs_planning(state) and not needs_planning(replace(state, watch=replace(state.watch, settings=None)))
    _, after = decide(state, 0.0)
    assert not needs_planning(after)  # the plan of that pass is reused while nothing the planner reads changed


def test_a_restart_timer_is_dropped_once_its_shard_is_ready_and_kept_while_it_is_not(one_replica):
    from llmgw.control.state import Failure, frozen

    ready_key, waiting_key = ("start", "n1", "tiny-0/0"), ("start", "n1", "tiny-1/0")
    other_node_key, lost_key = ("start", "n2", "tiny-0/0"), ("start", "n3", "tiny-0/0")
    starting = shard("tiny-1", fp(one_replica), ShardState.STARTING)
    state = control_state(one_replica, node(shard("tiny-0", fp(one_replica)), starting),
                          node(node_id="n2"), node(shard("tiny-0", fp(one_replica)), node_id="n3"), lost=("n3",))
    failure = Failure(1, "engine exited", 100.0)
    state = replace(state, restarts=frozen({key: failure for key in (ready_key, waiting_key, other_node_key,
                                                                       lost_key)}))
    _, after = decide(state, 0.0)
    assert set(after.restarts) == {waiting_key, other_node_key, lost_key}
