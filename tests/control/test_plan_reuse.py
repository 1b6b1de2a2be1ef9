"""A pass whose planner inputs did not change reuses the last plan instead of planning the whole fleet again, and
decides exactly what a pass planning from scratch decides (seeded random states and events)."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from llmgw.control.deciding import action_answered, action_failed, action_key, decide, plan_stage, reusable_plan
from llmgw.control.readings import GpuSample, NodeReadings
from llmgw.control.reports import memory_thresholds
from llmgw.control.state import ControlState
from llmgw.plan.types import ShardState

from .test_decide_invariants import random_state

GiB = 1024**3


def readings(node, rng: random.Random, now: float, cross: bool) -> NodeReadings:
    """A heartbeat's readings for `node`: used memory moves a little, or (`cross`) across the catalog's 40 GiB need;
    cards held by foreign processes stay held."""
    gpus = []
    for gpu in node.gpus:
        if gpu.is_mig:
            continue
        free = gpu.memory_free_bytes
        if cross:
            free = 30 * GiB if free >= 40 * GiB else 80 * GiB
        used = max(0, gpu.memory_total_bytes - free + rng.randrange(0, 64) * 2**20 * (-1 if cross else 1))
        gpus.append(GpuSample(index=int(gpu.device_id), utilization_percent=rng.uniform(0, 100),
                               memory_used_bytes=min(used, gpu.memory_total_bytes),
                               foreign_pids=(77,) if gpu.foreign_processes else ()))
    return NodeReadings(at=now, gpus=tuple(gpus))


def random_events(state: ControlState, rng: random.Random, now: float) -> ControlState:
    """Heartbeats (readings only, or free memory crossing a need, or a shard failing or changing its error text),
    streams ending, and answers and failures of actions in flight."""
    registry = state.fleet
    for record in registry.records():
        node, roll = record.state, rng.random()
        if roll < 0.4:
            registry, _ = registry.heartbeat(node.node_id, now, shards=node.shards, readings=readings(
                node, rng, now, cross=rng.random() < 0.1))
        elif roll < 0.55 and node.shards:
            shards = list(node.shards)
            k = rng.randrange(len(shards))
            shards[k] = replace(shards[k], state=rng.choice([shards[k].state, ShardState.FAILED]),
                                error=f"exit {rng.randrange(3)}", restarts=shards[k].restarts + 1)
            registry, _ = registry.heartbeat(node.node_id, now, shards=shards)
        elif roll < 0.65:
            registry, _ = registry.disconnect(node.node_id, now)
    state = state.with_fleet(registry)
    for key in list(state.in_flight):
        roll = rng.random()
        if roll < 0.3:
            state = action_answered(state, key, now)
        elif roll < 0.4:
            state = action_failed(state, key, "refused", now)
    return state


def prepared(seed: int) -> tuple[ControlState, float, random.Random]:
    """A random state after one pass, its registry judging free memory against the catalog's needs (as the plane
    sets it)."""
    state, now = random_state(seed)
    state = state.with_fleet(state.fleet.with_limits(30.0, memory_thresholds(state.settings)))
    _, state = decide(state, now)
    return state, now, random.Random(seed)


@pytest.mark.parametrize("seed", range(60))
def test_a_pass_reusing_its_plan_decides_what_planning_from_scratch_decides(seed):
    state, now, rng = prepared(seed)
    for step in range(3):
        now += rng.choice([0.5, 5.0, 40.0])
        state = random_events(state, rng, now)
        reused, after = decide(state, now)
        fresh, after_fresh = decide(replace(state, plan_basis=None), now)
        assert reused == fresh, f"step {step}: the decision differs from a fresh plan's"
        assert replace(after, plan_basis=None) == replace(after_fresh, plan_basis=None)
        state = after


@pytest.mark.parametrize("seed", range(20))
def test_readings_answers_and_ended_streams_let_the_next_pass_reuse_the_plan(seed):
    state, now, rng = prepared(seed)
    _, state = decide(state, now)  # the STARTs the first pass sent are pending shards to this pass's planner
    registry = state.fleet
    for record in registry.records():
        if record.lost:  # a lost node heard from again is placement-relevant
            continue
        registry, changed = registry.heartbeat(record.node_id, now + 1, shards=record.state.shards,
                                               readings=readings(record.state, rng, now + 1, cross=False))
        assert not changed
        registry, _ = registry.disconnect(record.node_id, now + 1)
    moved = state.with_fleet(registry)
    for key in list(moved.in_flight):
        if key[0] != "configure":  # an answered CONFIGURE acknowledges agent settings: the planner reads those
            moved = action_answered(moved, key, now + 1)
    assert reusable_plan(moved, allow_empty=False) is state.plan_basis
    decision, _ = decide(moved, now + 2)
    assert decision.plan is state.last_plan


@pytest.mark.parametrize("seed", range(20))
def test_a_shard_changing_or_free_memory_crossing_a_need_makes_the_next_pass_plan_again(seed):
    state, now, rng = prepared(seed)
    records = [r for r in state.fleet.records() if not r.lost]
    with_shards = [r for r in records if r.state.shards]
    with_gpus = [r for r in records if any(not g.is_mig for g in r.state.gpus)]
    if with_shards:
        node = with_shards[0].state
        failed = (replace(node.shards[0], state=ShardState.FAILED, error="exit 1"), *node.shards[1:])
        registry, _ = state.fleet.heartbeat(node.node_id, now + 1, shards=failed)
        assert reusable_plan(state.with_fleet(registry), allow_empty=False) is None
    if with_gpus and memory_thresholds(state.settings):
        node = with_gpus[0].state
        registry, changed = state.fleet.heartbeat(node.node_id, now + 1, readings=readings(node, rng, now + 1, True))
        assert changed and reusable_plan(state.with_fleet(registry), allow_empty=False) is None
    if not state.fleet.memory_thresholds:
        return
    unjudged = state.with_fleet(state.fleet.with_limits(30.0, ()))  # a registry that does not judge memory needs
    assert reusable_plan(unjudged, allow_empty=False) is None


@pytest.mark.parametrize("seed", range(60))
def test_a_pass_given_its_own_states_plan_decides_what_planning_in_the_pass_decides(seed):
    state, now, rng = prepared(seed)
    for step in range(3):
        now += rng.choice([0.5, 5.0, 40.0])
        state = replace(random_events(state, rng, now), plan_basis=None)
        given, after_given = decide(state, now, planned=plan_stage(state))
        fresh, after_fresh = decide(state, now)
        assert given == fresh, f"step {step}: the decision differs from planning in the pass"
        assert after_given == after_fresh
        state = after_fresh


@pytest.mark.parametrize("seed", range(60))
def test_a_plan_made_before_events_acts_on_the_state_after_them(seed):
    """The loop planned in a thread while events were folded: nothing goes to a node not connected now, nothing in
    flight now is sent again, the pass does not report converged over a fleet that moved, and the next pass plans
    again."""
    state, now, rng = prepared(seed)
    for _ in range(3):
        before = replace(state, plan_basis=None)
        planned = plan_stage(before)
        now += rng.choice([0.5, 5.0, 40.0])
        moved = random_events(before, rng, now)
        fleet, _ = moved.fleet.expire(now)
        moved = moved.with_fleet(fleet)
        decision, state = decide(moved, now, planned=planned)
        if reusable_plan(replace(moved, plan_basis=planned[1]), allow_empty=False) is not None:
            assert decision == decide(replace(moved, plan_basis=None), now)[0]  # nothing the planner reads moved
            continue
        for action in decision.send:
            record = moved.fleet.get(action.node_id)
            assert record is not None and record.connected and not record.lost
            assert action_key(action) not in moved.in_flight
        assert not decision.record.converged
        assert reusable_plan(state, allow_empty=False) is None
