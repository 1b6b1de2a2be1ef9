"""The routing table from ready replicas kept per node (`ReadyRoutes`): the same table as one built from the whole
fleet after any sequence of registry transitions, and a rebuild after one node's change looks at that node only."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from llmgw.control.registry import FleetRegistry
from llmgw.control.reports import fleet_for
from llmgw.control.routing import ReadyRoutes, build_route_table
from llmgw.plan.identity import engine_version_of, fingerprint
from llmgw.plan.types import NodeState, ObservedShard, ShardState

from .test_adapter_routes import settings

SETTINGS = settings()
CURRENT = {name: fingerprint(m, engine_version_of(SETTINGS, m)) for name, m in SETTINGS.models.items()}
STATES = (ShardState.READY, ShardState.READY, ShardState.STARTING, ShardState.FAILED)


def key(replica_id: str) -> str:
    return f"key-{replica_id}"


def random_shards(rng: random.Random, node: int) -> tuple[ObservedShard, ...]:
    shards = []
    for n in range(rng.randrange(4)):
        model = rng.choice(sorted(SETTINGS.models))
        replica = f"{model}-{rng.randrange(6)}"
        suffix = rng.choice(["", "@old"])  # two shards of one replica on one node while it rolls
        shards.append(ObservedShard(
            f"{replica}/0{suffix}", replica, model, rng.choice(STATES), port=9000 + node * 10 + n,
            fingerprint=rng.choice([CURRENT[model], "old"]), rank=rng.choice([0, 0, 0, 1]),
            adopted_foreign=rng.random() < 0.05))
    return tuple(sorted(shards, key=lambda s: s.shard_id))


def random_step(registry: FleetRegistry, rng: random.Random, now: float) -> FleetRegistry:
    """Registrations (new nodes, new addresses), heartbeats with new shard lists or the same, shard statuses,
    streams ending, and silences long enough for nodes to be lost."""
    for _ in range(rng.randrange(1, 6)):
        n = rng.randrange(12)
        node_id, roll = f"n{n:02d}", rng.random()
        record = registry.get(node_id)
        if record is None or roll < 0.1:
            node = NodeState(node_id, address=f"10.0.{rng.randrange(2)}.{n}", shards=random_shards(rng, n))
            registry, _ = registry.register(node, now)
        elif roll < 0.5:
            shards = random_shards(rng, n) if rng.random() < 0.5 else record.state.shards
            registry, _ = registry.heartbeat(node_id, now, shards=shards)
        elif roll < 0.7 and record.state.shards:
            shard = rng.choice(record.state.shards)
            registry, _ = registry.shard_status(node_id, replace(shard, state=rng.choice(STATES)), now)
        elif roll < 0.8:
            registry, _ = registry.disconnect(node_id, now)
    registry, _ = registry.expire(now)
    return registry


@pytest.mark.parametrize("seed", range(40))
def test_the_kept_index_builds_the_table_built_from_the_whole_fleet(seed):
    rng = random.Random(seed)
    registry, now = FleetRegistry(lost_after=30.0), 0.0
    ready = ReadyRoutes(key)
    for _ in range(25):
        now += rng.choice([1.0, 5.0, 40.0])
        registry = random_step(registry, rng, now)
        ready.sync(registry)
        expected = build_route_table(SETTINGS, fleet_for(registry.fleet(), SETTINGS), key)
        assert build_route_table(SETTINGS, ready, key) == expected


def test_a_rebuild_after_one_node_changed_looks_at_that_node_only():
    registry = FleetRegistry(lost_after=30.0)
    shard = ObservedShard("plain-0/0", "plain-0", "plain", ShardState.STARTING, port=9000,
                          fingerprint=CURRENT["plain"])
    for n in range(200):
        registry, _ = registry.register(NodeState(f"n{n:03d}", address=f"10.0.0.{n}", shards=(shard,)), 0.0)
    ready = ReadyRoutes(key)
    ready.sync(registry)
    assert ready.looked_at == 200
    for n in range(200):  # every node beats with its shard list unchanged: nothing to look at again
        registry, _ = registry.heartbeat(f"n{n:03d}", 1.0, shards=(replace(shard),))
    ready.sync(registry)
    registry, _ = registry.shard_status("n007", replace(shard, state=ShardState.READY), 2.0)
    ready.sync(registry)
    assert ready.looked_at == 201
    assert [r.node_id for r in build_route_table(SETTINGS, ready, key).models["plain"].replicas] == ["n007"]
